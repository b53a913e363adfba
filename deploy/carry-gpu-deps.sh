#!/usr/bin/env bash
# Packs into .deps/ (repo-local, git-ignored) what a FASTFORMER_SERVER=OFF build needs
# and a lent GPU machine lacks: it has the CUDA toolkit, CMake, a compiler and PyTorch,
# but no package network and no Debian -dev packages. Run it HERE (Debian bookworm with
# deploy/install-deps.sh done); the device tool then carries `.deps` with the tree.
#
#   deploy/carry-gpu-deps.sh           build .deps/ (oneDNN xz-packed: about 12.5 MiB)
#   deploy/carry-gpu-deps.sh --plain   build .deps/ with nothing packed (about 44 MiB)
#   deploy/carry-gpu-deps.sh --unpack  on the GPU machine: unpack what was packed (needs
#                                      xz or python3; tests/gpu/gpu-check.sh does this)
#   deploy/carry-gpu-deps.sh --check   build the GPU check's targets of a fresh copy of the tree
#                                      from a moved copy of .deps alone (the system's /usr
#                                      hidden) and fail on any library they load from outside
#                                      .deps, the CUDA toolkit and the C/C++ runtime, or on
#                                      any header it read of another -dev package
#   deploy/carry-gpu-deps.sh --gate BUILD_DIR DEPS_DIR   that last test alone, on a build
#
# The prefix:  .deps/include, .deps/lib (shared and static libraries), .deps/lib/cmake/<Pkg>
# (relocatable CMake configs: nlohmann_json, CLI11, spdlog, fmt, GTest/GMock).
# Use:  cmake -DCMAKE_PREFIX_PATH=$PWD/.deps ...  with  LD_LIBRARY_PATH=$PWD/.deps/lib
# (or `source .deps/env.sh`). Debian's spdlog is a compiled library on an external fmt,
# so libspdlog.so and libfmt.so travel. oneDNN has no CMake config here: the root
# CMakeLists finds it by header and library (include/oneapi/dnnl/dnnl.hpp, lib/libdnnl.so
# -> libdnnl.so.2), and libdnnl travels with the libOpenCL.so.1 (ocl-icd loader) it links.
# libgomp does not travel: CMake takes the GPU machine's compiler's own (oneDNN runs on
# it). Nor do libc, libm, libstdc++ and libgcc_s: the GPU machine's own (newer) ones serve;
# .deps/MANIFEST.txt lists the glibc/GLIBCXX/GOMP versions the carried libraries require.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps
mode=build
pack=1
case "${1:-}" in
  "") ;;
  --plain) pack=0 ;;
  --unpack) mode=unpack ;;
  --check) mode=check ;;
  --gate) mode=gate ;;
  -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
  *) echo "carry-gpu-deps.sh: unknown option '$1' (expected --plain, --unpack, --check or --gate)" >&2; exit 2 ;;
esac

say() { echo "carry-gpu-deps: $*"; }
die() { echo "carry-gpu-deps: error: $*" >&2; exit 1; }

# ---- --unpack (runs on the GPU machine: bash, and xz or python3) ----------------------------
unpack() {
  [ -d "$DEPS" ] || die "no .deps/ here: run deploy/carry-gpu-deps.sh on the build machine and carry .deps"
  local f n=0 name target
  if [ -f "$DEPS/LINKS" ]; then
    while read -r name target; do
      [ -n "$name" ] && [ ! -L "$DEPS/$name" ] && ln -sfn "$target" "$DEPS/$name" && n=$((n + 1))
    done <"$DEPS/LINKS"
    [ "$n" = 0 ] || say "remade $n symbolic link(s)"
    n=0
  fi
  [ -f "$DEPS/PACKED" ] || { say "nothing packed"; return 0; }
  while IFS= read -r f; do
    [ -n "$f" ] || continue
    if [ -f "$DEPS/$f" ] && [ ! -f "$DEPS/$f.xz" ]; then continue; fi  # already unpacked
    [ -f "$DEPS/$f.xz" ] || die "$f.xz is missing from .deps"
    if command -v xz >/dev/null 2>&1; then
      xz -d -c "$DEPS/$f.xz" >"$DEPS/$f.part"
    else
      local py
      py=$(command -v python3 || command -v python || true)
      [ -n "$py" ] || die "neither xz nor python3 to unpack $f.xz"
      "$py" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as i, open(sys.argv[2], "wb") as o: shutil.copyfileobj(i, o)' \
        "$DEPS/$f.xz" "$DEPS/$f.part"
    fi
    mv "$DEPS/$f.part" "$DEPS/$f"
    rm -f "$DEPS/$f.xz"
    n=$((n + 1))
  done <"$DEPS/PACKED"
  say "unpacked $n file(s); .deps is $(du -sm "$DEPS" | cut -f1) MiB"
}

# ---- --check: the real tree builds from .deps alone, as the GPU check builds it ------------
# A fresh copy of the tree (what the device tool carries: tracked and not-ignored files) with a
# moved copy of .deps, unpacked there. tests/gpu/gpu-check.sh configures and builds its own
# targets in it (its configure line exactly, GPU_CHECK_STOP_AFTER=build) with the system's
# prefix hidden (-DCMAKE_IGNORE_PREFIX_PATH=/usr), as on a GPU machine with no -dev packages.
# Then the gate (--gate): what the built targets load and what the build read must come from
# what a GPU machine has. CARRY_CHECK_DIR=DIR keeps the copy there (DIR/tree, with
# DIR/tree/build-gpu built), for tests/rehearsal/test_gpu_rehearsal.py to run the whole check in.
CHECK_TARGET_FILES=(bin/fastformer_gpu_tests bin/fastformer-bench lib/libfastformer_cuda_engine.so)
# The base runtime a GPU machine has: glibc, libstdc++, libgcc_s and the compiler's libgomp.
RUNTIME_RE='^(linux-vdso\.so|ld-linux[-a-z0-9_]*\.so|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libstdc\+\+\.so|libgcc_s\.so|libgomp\.so)'
# The Debian packages whose headers a GPU machine's compiler also has: libc's, the kernel's and
# the compiler's own. A header of any other package (a -dev the GPU machine lacks) fails.
BASE_HEADER_PKGS_RE='^(libc6-dev|linux-libc-dev|libstdc\+\+-[0-9]+-dev|libgcc-[0-9]+-dev|libgomp1|gcc-[0-9]+|g\+\+-[0-9]+|libc6)(:[a-z0-9]+)?$'

# gate BUILD_DIR DEPS_DIR: (1) every shared library the check's targets load (ldd, with
# LD_LIBRARY_PATH=DEPS_DIR/lib) resolves inside DEPS_DIR, the CUDA toolkit (or its Python wheels)
# or the base C/C++ runtime; (2) every header the build read (ninja -t deps, or the compiler's
# .d files) is the tree's, DEPS_DIR's, the CUDA toolkit's or the compiler's and libc's (by dpkg
# -S). Anything else is named, and the gate fails.
gate() {
  local build_dir=$1 deps=$2 tree f bad=() name arrow path
  build_dir=$(cd "$build_dir" && pwd) && deps=$(cd "$deps" && pwd) || die "gate: no such directory"
  tree=$(cd "$build_dir/.." && pwd)
  for f in "${CHECK_TARGET_FILES[@]}"; do
    [ -f "$build_dir/$f" ] || die "the build made no $f"
    while read -r name arrow path _; do
      [ -n "$name" ] || continue
      [[ "$name" =~ $RUNTIME_RE ]] && continue
      case "$arrow $path" in
        "=> $deps/"*) continue ;;                                           # carried
        "=> "*/cuda*/* | "=> "*/nvidia/* | "=> "*/cu1[0-9]/*) continue ;;  # the CUDA toolkit, its wheels
        "=> not"*) bad+=("$(basename "$f") loads $name: not found") ;;
        "=> "*) bad+=("$(basename "$f") loads $name => $path") ;;
        *) [[ "$name" == /*/ld-linux* ]] || bad+=("$(basename "$f"): $name $arrow $path") ;;  # the loader
      esac
    done < <(LD_LIBRARY_PATH="$deps/lib" ldd "$build_dir/$f" 2>&1 | sed 's/ (0x[0-9a-f]*)$//')
  done
  local headers n=0
  if [ -f "$build_dir/build.ninja" ]; then
    headers=$(ninja -C "$build_dir" -t deps 2>/dev/null | awk '/^ +\// {print $1}')
  else
    headers=$(find "$build_dir" -name '*.d' -exec cat {} + 2>/dev/null | tr ' \\' '\n\n' | grep '^/')
  fi
  [ -n "$headers" ] || bad+=("no header dependencies found in $build_dir (ninja -t deps / *.d): nothing to check")
  local system=()
  mapfile -t system < <(printf '%s\n' "$headers" | sort -u | grep -v -e "^$tree/" -e "^$deps/" -e '/cuda[^/]*/' -e '/nvidia/' \
    -e '^/usr/lib/gcc/' | grep .)
  if [ "${#system[@]}" -gt 0 ]; then
    local owner file owners=()
    while IFS= read -r line; do
      owner=${line%%: *}
      file=${line#*: }
      n=$((n + 1))
      if [[ "$line" == dpkg-query:* ]]; then
        bad+=("the build read ${line##* }, which no package owns")
      else
        local o ok=1
        IFS=', ' read -r -a owners <<<"$owner"  # "libc6-dev:amd64, libc6:amd64" when shared
        for o in "${owners[@]}"; do [[ "$o" =~ $BASE_HEADER_PKGS_RE ]] || ok=0; done
        [ "$ok" = 1 ] || bad+=("the build read $file, of $owner (a -dev package the GPU machine lacks)")
      fi
    done < <(dpkg -S "${system[@]}" 2>&1 | sed 's/^\(dpkg-query: no path found matching pattern\) /\1: /')
  fi
  if [ "${#bad[@]}" -gt 0 ]; then
    printf 'carry-gpu-deps:   %s\n' "${bad[@]}" | sort -u >&2
    die "the GPU check's targets need ${#bad[@]} thing(s) a GPU machine lacks (above): carry them in .deps or keep them out of the engine"
  fi
  say "  every shared library of ${CHECK_TARGET_FILES[*]} resolves to .deps, the CUDA toolkit or the C/C++ runtime"
  say "  every header the build read is the tree's, .deps', the CUDA toolkit's or the compiler's and libc's ($n system headers, by dpkg -S)"
}

check() {
  [ -d "$DEPS" ] || die "no .deps/: run deploy/carry-gpu-deps.sh first"
  local t=${CARRY_CHECK_DIR:-} keep=1
  if [ -z "$t" ]; then
    t=$(mktemp -d /tmp/carry-gpu-deps-check.XXXXXX)
    keep=0
  fi
  mkdir -p "$t"
  t=$(cd "$t" && pwd)
  rm -rf "$t/tree" "$t/work"
  mkdir -p "$t/tree" "$t/work"
  local s0=$SECONDS
  if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # Tracked and untracked-but-not-ignored files, less those deleted from the working tree.
    (cd "$ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - --ignore-failed-read -cf - 2>/dev/null) |
      tar -C "$t/tree" -xf -
  else
    tar -C "$ROOT" --exclude='./build*' --exclude=./.deps --exclude='./.venv*' --exclude=./models -cf - . |
      tar -C "$t/tree" -xf -
  fi
  cp -a "$DEPS" "$t/tree/.deps"
  (cd "$t/tree" && bash deploy/carry-gpu-deps.sh --unpack) | sed 's/^/  /'
  say "configure and build the GPU check's targets in a fresh copy ($t/tree), system prefix /usr hidden"
  local rc=0 ccache_arg=""
  # /usr is hidden from CMake's find_program too: the compiler cache (mk/cache.mk) is named
  # explicitly, so the rehearsal's compiles hit the cache (a lent GPU machine's build uses ccache
  # only when it has one).
  if command -v ccache >/dev/null; then ccache_arg="-DFASTFORMER_CCACHE_PROGRAM=$(command -v ccache)"; fi
  (cd "$t/tree" && GPU_CHECK_BUILD=1 GPU_CHECK_STOP_AFTER=build GPU_CHECK_PYTHON=none GPU_CHECK_WORK="$t/work" \
    GPU_CHECK_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr $ccache_arg ${CARRY_CHECK_CMAKE_ARGS:-}" \
    bash tests/gpu/gpu-check.sh "$t/report.md") >"$t/gpu-check.log" 2>&1 || rc=$?
  local stages
  stages=$(ls -d "$t"/work/run-*/stages.tsv 2>/dev/null | tail -1 || true)
  [ -n "$stages" ] || { tail -30 "$t/gpu-check.log" >&2; die "gpu-check.sh wrote no stages (exit $rc; $t/gpu-check.log)"; }
  local run id status
  run=$(dirname "$stages")
  for id in configure build; do
    status=$(awk -F'\t' -v id="$id" '$1 == id {s = $3} END {print s}' "$stages")
    if [ "$status" != ok ]; then
      echo "carry-gpu-deps: stage $id: ${status:-not run}; last lines:" >&2
      tail -n 25 "$run/$id.out" "$run/$id.err" 2>/dev/null | sed 's/^/    /' >&2
      die "the tree does not ${id} from .deps alone (logs: $run)"
    fi
    say "  $id: ok ($(awk -F'\t' -v id="$id" '$1 == id {s = $5} END {print s}' "$stages") s)"
  done
  gate "$t/tree/${GPU_CHECK_BUILD_DIR:-build-gpu}" "$t/tree/.deps"
  [ "$keep" = 1 ] || rm -rf "$t"
  say "check passed in $((SECONDS - s0)) s: the tree configures and builds from .deps alone$([ "$keep" = 1 ] && echo " (kept: $t/tree)")"
}

case "$mode" in
  unpack) unpack; exit 0 ;;
  check) check; exit 0 ;;
  gate) [ $# -eq 3 ] || die "usage: carry-gpu-deps.sh --gate BUILD_DIR DEPS_DIR"; gate "$2" "$3"; exit 0 ;;
esac

# ---- build .deps/ from this machine's Debian packages ---------------------------------------
command -v dpkg-query >/dev/null || die "needs a Debian/Ubuntu machine with the build packages (deploy/install-deps.sh)"
pkgs=(nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libdnnl-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ "${#missing[@]}" -eq 0 ] || die "missing packages: ${missing[*]} (run deploy/install-deps.sh --build)"

MA=$(gcc -print-multiarch 2>/dev/null || true)
[ -n "$MA" ] || MA=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
SYSLIB=/usr/lib/$MA
[ "$(uname -m)" = x86_64 ] || say "warning: this machine is $(uname -m); the lent GPU machine is x86-64"

TMP=$ROOT/.deps.tmp
rm -rf "$TMP"
mkdir -p "$TMP/include" "$TMP/lib/cmake"
trap 'rm -rf "$TMP"' EXIT

# Headers of a package, as dpkg lists them (symlinks followed).
copy_headers() {
  local pkg=$1 list
  list=$(dpkg -L "$pkg" | while IFS= read -r f; do
    case "$f" in /usr/include/*) [ -f "$f" ] && printf '%s\n' "${f#/usr/include/}" ;; esac
  done)
  [ -n "$list" ] || die "$pkg lists no headers under /usr/include"
  printf '%s\n' "$list" | tar -C /usr/include -chf - -T - | tar -C "$TMP/include" -xf -
}
# oneDNN's: include/oneapi/dnnl/*.h* (what find_path(oneapi/dnnl/dnnl.hpp) needs) and the
# dnnl*.h* compatibility headers at the top.
for p in nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libdnnl-dev; do
  copy_headers "$p"
done
for h in dnnl.hpp dnnl.h dnnl_config.h dnnl_types.h dnnl_version.h; do
  [ -f "$TMP/include/oneapi/dnnl/$h" ] || die "no oneapi/dnnl/$h (libdnnl-dev)"
done

# A shared library: the real file, its SONAME link and (optionally) the -l link name.
soname_of() { readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p'; }
declare -A carried=()
carry_so() {  # carry_so PATH [LINKNAME]
  local real name soname
  real=$(readlink -f "$1")
  [ -f "$real" ] || die "no $1"
  name=$(basename "$real")
  soname=$(soname_of "$real")
  [ -n "$soname" ] || soname=$name
  if [ -z "${carried[$soname]:-}" ]; then
    cp -L "$real" "$TMP/lib/$name"
    chmod 644 "$TMP/lib/$name"
    [ "$soname" = "$name" ] || ln -sf "$name" "$TMP/lib/$soname"
    carried[$soname]=$real
  fi
  if [ -n "${2:-}" ] && [ "$2" != "$soname" ]; then ln -sf "$soname" "$TMP/lib/$2"; fi
}
# What a carried library needs beyond the base system (libc, libm, libstdc++, libgcc_s...)
# and the compiler's OpenMP runtime (libgomp: the GPU machine's gcc has its own).
BASE_RE='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libstdc\+\+|libgcc_s|libgomp)'
carry_needs() {
  local lib=$1 dep path
  while read -r dep _ path _; do
    [[ "$dep" =~ $BASE_RE ]] && continue
    [ -n "${carried[$dep]:-}" ] && continue
    [ -f "$path" ] || die "$(basename "$lib") needs $dep, which ldd cannot find"
    carry_so "$path"
    carry_needs "$path"
  done < <(ldd "$lib" | awk '$2 == "=>" {print $1, $2, $3}')
}

# oneDNN: libdnnl.so.2 (the real file libdnnl.so.2.<minor>), with libdnnl.so for
# find_library(dnnl); carry_needs adds libOpenCL.so.1 (its GPU runtime's loader, linked
# though we run only its CPU engine), which the GPU machine may lack.
dnnl_so=$(readlink -f "$SYSLIB/libdnnl.so")
carry_so "$dnnl_so" libdnnl.so
carry_needs "$dnnl_so"
[ -n "${carried[libOpenCL.so.1]:-}" ] || say "warning: $(basename "$dnnl_so") does not link libOpenCL.so.1 here"
carry_so "$SYSLIB/libspdlog.so" libspdlog.so
carry_so "$SYSLIB/libfmt.so" libfmt.so
carry_needs "$SYSLIB/libspdlog.so"
for a in libgtest.a libgtest_main.a libgmock.a libgmock_main.a; do
  cp -L "$SYSLIB/$a" "$TMP/lib/$a"
done

# CMake configs, made relocatable: Debian's compute their prefix four levels up
# (lib/<multiarch>/cmake/<Pkg>) or name lib/<multiarch>/ outright.
relocate_config() {  # relocate_config SRC_DIR NAME
  local src=$1 name=$2 dst=$TMP/lib/cmake/$2 f
  [ -d "$src" ] || die "no CMake config $src"
  mkdir -p "$dst"
  cp -L "$src"/*.cmake "$dst/"
  for f in "$dst"/*.cmake; do
    sed -i \
      -e "s#\${_IMPORT_PREFIX}/lib/$MA/#\${_IMPORT_PREFIX}/lib/#g" \
      -e 's#^get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/[./]*" ABSOLUTE)#get_filename_component(PACKAGE_PREFIX_DIR "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)#' \
      -e '/^if(_IMPORT_PREFIX STREQUAL "\/")/i get_filename_component(_IMPORT_PREFIX "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)  # carry-gpu-deps.sh: .deps/lib/cmake/<Pkg>' \
      "$f"
    # Nothing may still point into the system, except the "/usr move" comparison lines.
    if grep -n '/usr/\|/lib/'"$MA" "$f" | grep -v '^[0-9]*:[[:space:]]*#' |
       grep -v '_realOrig\|PACKAGE_PREFIX_DIR "/usr"\|set(_IMPORT_PREFIX "/usr' | grep -q .; then
      grep -n '/usr/\|/lib/'"$MA" "$f" >&2
      die "$f still names a system path after relocation"
    fi
  done
}
relocate_config "$SYSLIB/cmake/GTest" GTest
relocate_config "$SYSLIB/cmake/fmt" fmt
relocate_config "$SYSLIB/cmake/spdlog" spdlog
relocate_config /usr/share/cmake/nlohmann_json nlohmann_json
relocate_config /usr/share/cmake/CLI11 CLI11

cat >"$TMP/env.sh" <<'EOF'
# source .deps/env.sh: use the carried prefix (CMake configs and shared libraries).
_deps_dir=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)
export CMAKE_PREFIX_PATH="$_deps_dir${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
export LD_LIBRARY_PATH="$_deps_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _deps_dir
EOF

# What the carried shared libraries need from the GPU machine's base system.
max_ver() { objdump -T "$TMP"/lib/*.so* 2>/dev/null | grep -o "\\b$1"'_[0-9.]*' | sort -uV | tail -1; }
# The versions a library asks of one of its DT_NEEDED libraries (objdump's Version References).
needs_from() {  # needs_from LIB SONAME
  objdump -p "$1" 2>/dev/null | awk -v so="$2" '/^  required from / {f = ($3 == so ":")} f && NF == 4 {print $4}' |
    sort -uV | tr '\n' ' ' | sed 's/ $//'
}
{
  echo "# .deps: written by deploy/carry-gpu-deps.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "# from $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m), multiarch $MA"
  echo "# use: cmake -DCMAKE_PREFIX_PATH=\$PWD/.deps ...   LD_LIBRARY_PATH=\$PWD/.deps/lib"
  echo "# the carried shared libraries need at least: $(max_ver GLIBC), $(max_ver GLIBCXX), $(max_ver CXXABI)"
  echo "# $(basename "$dnnl_so") needs from the GPU machine's compiler: libgomp.so.1 ($(needs_from "$TMP/lib/$(basename "$dnnl_so")" libgomp.so.1)), not carried"
  echo "# packages:"
  for p in "${pkgs[@]}" libdnnl2 ocl-icd-libopencl1 libspdlog1.10 libfmt9; do
    v=$(dpkg-query -W -f='${Version}' "$p" 2>/dev/null || true)
    [ -n "$v" ] && echo "#   $p $v"
  done
  echo "# files:"
  (cd "$TMP" && find . -type f -o -type l | sort | sed 's#^\./#  #')
} >"$TMP/MANIFEST.txt"

# What the tree was when .deps was packed: gpu-check.sh names it when the copy has no .git.
{
  echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' with local changes'), packed $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} >"$TMP/SOURCE"

: >"$TMP/PACKED"
# The symbolic links, so that --unpack can remake any a transfer did not keep.
(cd "$TMP" && find . -type l -printf '%P %l\n' | sort) >"$TMP/LINKS"
if [ "$pack" = 1 ]; then
  command -v xz >/dev/null || die "xz is needed to pack (apt-get install xz-utils), or use --plain"
  dnnl_name=$(basename "$dnnl_so")
  xz -T0 -6 "$TMP/lib/$dnnl_name"
  echo "lib/$dnnl_name" >>"$TMP/PACKED"
fi

rm -rf "$DEPS"
mv "$TMP" "$DEPS"
trap - EXIT

bytes=$(du -sb "$DEPS" | cut -f1)
tree=$(git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1)
tree=${tree:-0}
say "wrote .deps/: $(find "$DEPS" -type f | wc -l) files"
(cd "$DEPS" && find . -type f -size +400k -exec du -k {} + | sort -rn | awk '{printf "carry-gpu-deps:   %7.1f MiB  %s\n", $1/1024, $2}')
if [ -s "$DEPS/PACKED" ]; then
  say "packed (unpacked by 'deploy/carry-gpu-deps.sh --unpack' and by tests/gpu/gpu-check.sh): $(tr '\n' ' ' <"$DEPS/PACKED")"
fi
awk -v d="$bytes" -v t="$tree" 'BEGIN {
  printf "carry-gpu-deps: total .deps size %.1f MiB; with the working tree (%.1f MiB) %.1f MiB of the device tool'"'"'s 64 MiB\n",
         d / 1048576, t / 1048576, (d + t) / 1048576 }'
grep '^# the carried' "$DEPS/MANIFEST.txt" | sed 's/^# /carry-gpu-deps: /'
git check-ignore -q .deps 2>/dev/null || say "warning: .deps is not git-ignored (add /.deps/ to .gitignore)"

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
#   deploy/carry-gpu-deps.sh --server  build the shipped programs for the lease's GPU (issue 47:
#                                      deploy/build-binaries.sh, the image's configure line with
#                                      CUDA_ARCHS=$GPU_CHECK_CUDA_ARCH, default 90) and carry them
#                                      with their shared-library closure: .deps/server.tar.xz
#                                      (bin/, lib/: unpacked into .deps/server by --unpack) and
#                                      .deps/server/{configure.cmd,SOURCE,CLOSURE.txt,expected/};
#                                      fails when the device tool's whole carry exceeds
#                                      CARRY_BUDGET_MIB (48) MiB
#   deploy/carry-gpu-deps.sh --server --check [DEPS_DIR]   unpack a moved copy of .deps (or
#                                      DEPS_DIR) and load every carried program and the plugin
#                                      from it alone, the system's library directories hidden
#                                      (a private mount namespace; else an ldd allow-list)
#   deploy/carry-gpu-deps.sh --unpack [DEPS_DIR]           as above, on another .deps
#   deploy/carry-gpu-deps.sh --budget  print what the device tool would carry, against the budget
#   deploy/carry-gpu-deps.sh --baseline  only the baseline of --server (below), after --server
#
# Issue 48 adds two carries. The plain run packs CUTLASS's headers (cute/, cutlass/: the engine's
# sm_90a GEMM) as .deps/cutlass.tar.xz (about 1 MiB, from deploy/cutlass-headers.sh; cached as
# $FASTFORMER_CACHE/carry-cutlass/cutlass-<version>.tar.xz); --unpack opens it into
# .deps/cutlass/include, which gpu-check.sh passes as -DFASTFORMER_CUTLASS_DIR. Without the headers
# (no cache and no PyPI) it warns and carries none: the CUTLASS kernel is then not built there.
# --server also carries the baseline: fastformer-bench and the CUDA engine plugin of the commit
# before issue 48's work (CARRY_BASELINE_COMMIT, default d6c8ead), built from `git archive` of it
# with its own deploy/build-binaries.sh (the same configure line as the server, CUDA_ARCHS as
# above), as .deps/baseline.tar.xz (bin/fastformer-bench, lib/libfastformer_cuda_engine.so:
# unpacked into .deps/baseline by --unpack) and .deps/baseline/{COMMIT,SOURCE,configure.cmd}. Its
# shared libraries are the server closure's (checked with ldd; anything else is carried in
# baseline/lib). The old bench opens the old plugin from <exe dir>/../lib. Cached, built and
# packed, under $FASTFORMER_CACHE/carry-baseline/<commit>/sm_<arch>/, so a second pack is instant.
# CARRY_BASELINE=0: none.
#
# The carried server runs with LD_LIBRARY_PATH=<.deps>/server/lib:<.deps>/lib (its closure, then
# the oneDNN, spdlog and fmt that .deps/lib already holds); it opens the plugin from
# <.deps>/server/lib (<exe dir>/../lib). What stays the machine's: glibc, libstdc++, libgcc_s and
# the CUDA driver (libcuda, libnvidia-*); cuBLASLt is opened at run time (gpu-check.sh finds the
# lease's own). The packed tarball is cached under $FASTFORMER_CACHE/carry-server/ (default
# /var/cache/fastformer), keyed by the hashes of what it holds.
#
# The prefix:  .deps/include, .deps/lib (shared and static libraries), .deps/lib/cmake/<Pkg>
# (relocatable CMake configs: nlohmann_json, CLI11, spdlog, fmt, GTest/GMock).
# Use:  cmake -DCMAKE_PREFIX_PATH=$PWD/.deps ...  with  LD_LIBRARY_PATH=$PWD/.deps/lib
# (or `source .deps/env.sh`). Debian's spdlog is a compiled library on an external fmt,
# so libspdlog.so and libfmt.so travel. oneDNN has no CMake config here: the root
# CMakeLists finds it by header and library (include/oneapi/dnnl/dnnl.hpp, lib/libdnnl.so
# -> libdnnl.so.2), and libdnnl travels with the libOpenCL.so.1 (ocl-icd loader) it links.
# libgomp does not travel here: CMake takes the GPU machine's compiler's own (oneDNN runs on
# it; the carried server has its own in .deps/server/lib). Nor do libc, libm, libstdc++ and libgcc_s: the GPU machine's own (newer) ones serve;
# .deps/MANIFEST.txt lists the glibc/GLIBCXX/GOMP versions the carried libraries require.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.deps
mode=build
pack=1
server=0
args=()
for a in "$@"; do
  case "$a" in
    --plain) pack=0 ;;
    --unpack) mode=unpack ;;
    --check) mode=check ;;
    --gate) mode=gate ;;
    --server) server=1 ;;
    --budget) mode=budget ;;
    --baseline) mode=baseline ;;
    -h|--help) sed -n '2,64p' "$0"; exit 0 ;;
    -*) echo "carry-gpu-deps.sh: unknown option '$a' (expected --plain, --unpack, --check, --gate, --server, --baseline or --budget)" >&2; exit 2 ;;
    *) args+=("$a") ;;
  esac
done
if [ "$server" = 1 ]; then
  case "$mode" in
    build) mode=server ;;
    check) mode=servercheck ;;
    *) echo "carry-gpu-deps.sh: --server goes alone or with --check" >&2; exit 2 ;;
  esac
  [ "$pack" = 1 ] || { echo "carry-gpu-deps.sh: --plain is for the base .deps only" >&2; exit 2; }
fi

say() { echo "carry-gpu-deps: $*"; }
die() { echo "carry-gpu-deps: error: $*" >&2; exit 1; }

# ---- --unpack (runs on the GPU machine: bash, and xz or python3) ----------------------------
# xz -d of PACKED's files; server.tar.xz into server/ (the carried programs and their closure),
# baseline.tar.xz into baseline/ (the old bench and plugin) and cutlass.tar.xz into
# cutlass/include (tar, or python3's tarfile); each packed file is removed once unpacked, so a
# second --unpack does nothing.
unxz_to() {  # unxz_to FILE.xz OUT
  if command -v xz >/dev/null 2>&1; then
    xz -d -c "$1" >"$2"
  else
    local py
    py=$(command -v python3 || command -v python || true)
    [ -n "$py" ] || die "neither xz nor python3 to unpack $1"
    "$py" -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1]) as i, open(sys.argv[2], "wb") as o: shutil.copyfileobj(i, o)' "$1" "$2"
  fi
}
untar_xz() {  # untar_xz FILE.tar.xz DIR
  mkdir -p "$2"
  if command -v xz >/dev/null 2>&1 && command -v tar >/dev/null 2>&1; then
    xz -d -T0 -c "$1" | tar -C "$2" -xf -
  else
    local py
    py=$(command -v python3 || command -v python || true)
    [ -n "$py" ] || die "neither xz and tar nor python3 to unpack $1"
    "$py" -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t: t.extractall(sys.argv[2])' "$1" "$2"
  fi
}
# The CUTLASS version of an include dir, from cutlass/version.h: MAJOR.MINOR.PATCH.BUILD.
cutlass_version_of() {
  awk '/^#define CUTLASS_(MAJOR|MINOR|PATCH|BUILD) / {v[$2] = $3}
       END {if (v["CUTLASS_MAJOR"] != "") print v["CUTLASS_MAJOR"] "." v["CUTLASS_MINOR"] "." v["CUTLASS_PATCH"] "." (v["CUTLASS_BUILD"] == "" ? 0 : v["CUTLASS_BUILD"])}' \
    "$1/cutlass/version.h" 2>/dev/null
}
unpack() {  # unpack [DEPS_DIR]
  local d=${1:-$DEPS} f n=0 name target
  [ -d "$d" ] || die "no .deps/ here: run deploy/carry-gpu-deps.sh on the build machine and carry .deps"
  d=$(cd "$d" && pwd)
  if [ -f "$d/LINKS" ]; then
    while read -r name target; do
      [ -n "$name" ] && [ ! -L "$d/$name" ] && ln -sfn "$target" "$d/$name" && n=$((n + 1))
    done <"$d/LINKS"
    [ "$n" = 0 ] || say "remade $n symbolic link(s)"
    n=0
  fi
  if [ -f "$d/PACKED" ]; then
    while IFS= read -r f; do
      [ -n "$f" ] || continue
      if [ -f "$d/$f" ] && [ ! -f "$d/$f.xz" ]; then continue; fi  # already unpacked
      [ -f "$d/$f.xz" ] || die "$f.xz is missing from .deps"
      unxz_to "$d/$f.xz" "$d/$f.part"
      mv "$d/$f.part" "$d/$f"
      rm -f "$d/$f.xz"
      n=$((n + 1))
    done <"$d/PACKED"
  fi
  if [ -f "$d/server.tar.xz" ]; then
    rm -rf "$d/server/bin" "$d/server/lib"
    untar_xz "$d/server.tar.xz" "$d/server"
    rm -f "$d/server.tar.xz"
    n=$((n + 1))
    say "the carried server: $(find "$d/server/bin" -type f | wc -l) programs, $(find "$d/server/lib" -type f | wc -l) libraries in .deps/server (LD_LIBRARY_PATH=.deps/server/lib:.deps/lib)"
  fi
  if [ -f "$d/baseline.tar.xz" ]; then
    rm -rf "$d/baseline/bin" "$d/baseline/lib"
    untar_xz "$d/baseline.tar.xz" "$d/baseline"
    rm -f "$d/baseline.tar.xz"
    n=$((n + 1))
    say "the baseline: fastformer-bench and its plugin of $(cut -c1-12 "$d/baseline/COMMIT" 2>/dev/null || echo 'an unknown commit') in .deps/baseline (LD_LIBRARY_PATH=.deps/baseline/lib:.deps/server/lib:.deps/lib)"
  fi
  if [ -f "$d/cutlass.tar.xz" ]; then
    rm -rf "$d/cutlass"
    untar_xz "$d/cutlass.tar.xz" "$d/cutlass/include"
    rm -f "$d/cutlass.tar.xz"
    n=$((n + 1))
    say "CUTLASS $(cutlass_version_of "$d/cutlass/include") headers in .deps/cutlass/include (-DFASTFORMER_CUTLASS_DIR)"
  fi
  [ -f "$d/PACKED" ] || [ "$n" != 0 ] || { say "nothing packed"; return 0; }
  say "unpacked $n file(s); .deps is $(du -sm "$d" | cut -f1) MiB"
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
  # The build's cap is the lease's (150 s on 16 cores) only there: here it checks what the build
  # needs, not how fast 2 cores compile it (the sm_90a CUTLASS GEMM alone is about 60 s).
  (cd "$t/tree" && GPU_CHECK_BUILD=1 GPU_CHECK_STOP_AFTER=build GPU_CHECK_PYTHON=none GPU_CHECK_WORK="$t/work" \
    GPU_CHECK_BUILD_CAP_S=${CARRY_CHECK_BUILD_CAP_S:-1200} \
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

# ---- the size budget: what the device tool carries (issue 47) --------------------------------
# The tree as the device tool copies it (tracked and untracked-not-ignored files: git ls-files
# -co --exclude-standard) and .deps as packed (server.tar.xz in place of .deps/server/bin and
# .deps/server/lib). The tool's limit is 64 MiB; this issue keeps CARRY_BUDGET_MIB for itself.
CARRY_BUDGET_MIB=${CARRY_BUDGET_MIB:-48}
CARRY_TOOL_MIB=64
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
files_bytes() {  # files_bytes DIR [PRUNED_DIR...]: the bytes of DIR's files and links
  local d=$1 p prune=()
  shift
  for p in "$@"; do prune+=(-path "$p" -prune -o); done
  find "$d" "${prune[@]}" \( -type f -o -type l \) -printf '%s\n' 2>/dev/null | awk '{s += $1} END {printf "%d\n", s}'
}
# Each packed tarball, and what --unpack makes of it (counted instead when the tarball is gone).
PACKED_PARTS=("server.tar.xz:server/bin server/lib" "baseline.tar.xz:baseline/bin baseline/lib" "cutlass.tar.xz:cutlass")
carried_total() {  # carried_total DEPS_DIR: prints the total, sets CARRIED_BYTES; 1 when over budget
  local d=$1 tree deps=0 exp=0 parts=0 rest spec tarball dirs dir bytes prune=() what=() unpacked_dirs=()
  tree=$(cd "$ROOT" && git ls-files -co --exclude-standard -z 2>/dev/null | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || true)
  tree=${tree:-0}
  if [ -d "$d" ]; then
    for spec in "${PACKED_PARTS[@]}"; do
      tarball=${spec%%:*}
      read -r -a dirs <<<"${spec#*:}"
      bytes=0
      if [ -f "$d/$tarball" ]; then
        for dir in "${dirs[@]}"; do prune+=("$d/$dir"); done
        bytes=$(stat -c %s "$d/$tarball")
        what+=("$tarball $(mib "$bytes") MiB")
      else
        for dir in "${dirs[@]}"; do
          [ -d "$d/$dir" ] || continue
          bytes=$((bytes + $(files_bytes "$d/$dir")))
          unpacked_dirs+=("$dir")
        done
        [ "$bytes" = 0 ] || what+=("${dirs[*]} unpacked $(mib "$bytes") MiB")
      fi
      parts=$((parts + bytes))
    done
    deps=$(files_bytes "$d" "${prune[@]}")
    [ ! -d "$d/server/expected" ] || exp=$(files_bytes "$d/server/expected")
  fi
  [ -f "$d/server.tar.xz" ] || [ -d "$d/server/bin" ] || what+=("no server carried")
  [ -f "$d/baseline.tar.xz" ] || [ -d "$d/baseline/bin" ] || what+=("no baseline carried")
  [ -f "$d/cutlass.tar.xz" ] || [ -d "$d/cutlass" ] || what+=("no CUTLASS headers carried")
  rest=$((deps - parts - exp))
  local f unpacked=()
  if [ -f "$d/PACKED" ]; then
    while IFS= read -r f; do
      [ -n "$f" ] && [ -f "$d/$f" ] && [ ! -f "$d/$f.xz" ] && unpacked+=("$f")
    done <"$d/PACKED"
  fi
  unpacked+=("${unpacked_dirs[@]}")
  [ "${#unpacked[@]}" = 0 ] ||
    say "note: ${unpacked[*]} unpacked in $d (an --unpack, or gpu-check.sh, ran here): counted as it is; deploy/carry-gpu-deps.sh --server packs it again"
  CARRIED_BYTES=$((tree + deps))
  say "carried total $(mib "$CARRIED_BYTES") MiB of the ${CARRY_BUDGET_MIB} MiB budget (CARRY_BUDGET_MIB; the device tool carries at most ${CARRY_TOOL_MIB} MiB): the tree $(mib "$tree") MiB (git ls-files -co --exclude-standard), .deps $(mib "$deps") MiB ($(printf '%s, ' "${what[@]}")server/expected $(mib "$exp") MiB, the rest $(mib "$rest") MiB)"
  [ "$CARRIED_BYTES" -le $((CARRY_BUDGET_MIB * 1048576)) ]
}

# ---- --server: the shipped programs and their shared-library closure (issue 47) ---------------
# What stays the lent machine's: glibc, libstdc++, libgcc_s and the CUDA driver. Everything else
# the programs and the plugin load is carried, less what .deps/lib already holds (oneDNN, its
# OpenCL loader, spdlog, fmt: found there through LD_LIBRARY_PATH=<.deps>/server/lib:<.deps>/lib).
SERVER_PROGRAMS=(fastformer-server fastformer-client fastformer-encode fastformer-bench fastformer-loadgen)
SERVER_PLUGIN=libfastformer_cuda_engine.so
MACHINE_BASE_RE='^(ld-linux[-a-z0-9_]*\.so|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libstdc\+\+\.so|libgcc_s\.so)'
MACHINE_DRIVER_RE='^(libcuda\.so|libnvidia-)'
FASTFORMER_CACHE=${FASTFORMER_CACHE:-/var/cache/fastformer}
SERVER_CACHE=$FASTFORMER_CACHE/carry-server
SERVER_XZ=(xz -9e -T0)  # -T0: one thread per block (a block at -9 is 192 MiB: one here)

# The highest symbol version of a kind (GLIBC, GLIBCXX, CXXABI) the files ask for.
max_ver_in() {  # max_ver_in KIND FILE...
  local kind=$1
  shift
  objdump -T "$@" 2>/dev/null | grep -o "\\b$kind"'_[0-9.]*' | sort -uV | tail -1
}
find_torch_python() {
  local p
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return 0; fi
  for p in /usr/bin/python3 python3; do
    command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch' >/dev/null 2>&1 && { command -v "$p"; return 0; }
  done
  return 1
}

# pack_part KIND EOF STAGE TMP FILE...: the xz stream of FILEs (relative to STAGE, in that order,
# no recursion), from the cache or packed now (and cached); prints its path. EOF=0 leaves out the
# tar's end-of-archive blocks, for a stream that another follows.
pack_part() {
  local kind=$1 eof=$2 stage=$3 tmp=$4 key c s
  shift 4
  key=$( (cd "$stage" && sha256sum -- "$@" 2>/dev/null; echo "eof $eof; ${SERVER_XZ[*]}") | sha256sum | cut -c1-24)
  c=$SERVER_CACHE/$kind-$key.xz
  if [ -f "$c" ] && xz -t "$c" 2>/dev/null; then
    touch "$c"
    say "  $kind: from the cache ($c, $(mib "$(stat -c %s "$c")") MiB)" >&2
    echo "$c"
    return 0
  fi
  s=$SECONDS
  # -b 1: 512-byte records, so the archive ends with exactly the two zero blocks of its end.
  tar -C "$stage" -b 1 --no-recursion --owner=0 --group=0 --numeric-owner --mtime=@0 -cf "$tmp/$kind.tar" -- "$@"
  if [ "$eof" = 0 ]; then
    [ "$(tail -c 1024 "$tmp/$kind.tar" | tr -d '\0' | wc -c)" = 0 ] || die "$kind.tar does not end in two zero blocks"
    truncate -s -1024 "$tmp/$kind.tar"
  fi
  "${SERVER_XZ[@]}" -c "$tmp/$kind.tar" >"$tmp/$kind.xz"
  say "  $kind: packed in $((SECONDS - s)) s (${SERVER_XZ[*]}): $(mib "$(stat -c %s "$tmp/$kind.tar")") MiB -> $(mib "$(stat -c %s "$tmp/$kind.xz")") MiB" >&2
  rm -f "$tmp/$kind.tar"
  if mkdir -p "$SERVER_CACHE" 2>/dev/null && cp "$tmp/$kind.xz" "$c.part.$$" 2>/dev/null; then
    mv "$c.part.$$" "$c"
    say "  $kind: cached as $c" >&2
    echo "$c"
  else
    say "  warning: $SERVER_CACHE is not writable: $kind is not cached" >&2
    echo "$tmp/$kind.xz"
  fi
}

# What an --unpack here (or gpu-check.sh run in this checkout) unpacked, packed again as the plain
# run packs it: the device tool carries .deps as it is. The server's own tarball is remade by
# --server; the baseline's is copied again from its cache.
repack_unpacked() {
  local f
  if [ -f "$DEPS/PACKED" ]; then
    while IFS= read -r f; do
      if [ -n "$f" ] && [ -f "$DEPS/$f" ] && [ ! -f "$DEPS/$f.xz" ]; then
        say "packing .deps/$f again (it was unpacked here)"
        xz -T0 -6 "$DEPS/$f"
      fi
    done <"$DEPS/PACKED"
  fi
  if [ -d "$DEPS/cutlass" ] && [ ! -f "$DEPS/cutlass.tar.xz" ]; then
    say "packing .deps/cutlass again (it was unpacked here)"
    pack_cutlass "$DEPS" && rm -rf "$DEPS/cutlass"
  fi
}

server_carry() {
  local t0=$SECONDS s f
  [ -f "$DEPS/MANIFEST.txt" ] || { say "no .deps/ yet: packing it first"; bash "$ROOT/deploy/carry-gpu-deps.sh"; }
  repack_unpacked
  local build=${CARRY_SERVER_BUILD_DIR:-$ROOT/build-gpu-server} arch=${GPU_CHECK_CUDA_ARCH:-90}
  mkdir -p "$build"
  build=$(cd "$build" && pwd)
  if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    case "$build/" in
      "$ROOT/"*) git -C "$ROOT" check-ignore -q "$build/x" 2>/dev/null ||
        die "$build is not git-ignored: the device tool would carry it (CARRY_SERVER_BUILD_DIR)" ;;
    esac
  fi
  local out=$build/carry-out stage=$build/carry-stage log=$build/carry-build.log
  rm -rf "$out" "$stage"
  # The image's configure line (deploy/build-binaries.sh) restricted to the lease's architecture;
  # the same flags as `make build`, so the compiler cache serves it (FASTFORMER_CACHE/ccache).
  export FASTFORMER_CCACHE_DIR=${FASTFORMER_CCACHE_DIR:-$FASTFORMER_CACHE/ccache}
  say "building the shipped programs for sm_$arch: FASTFORMER_CUDA=ON CUDA_ARCHS=$arch deploy/build-binaries.sh $build $out (log: $log)"
  s=$SECONDS
  if ! FASTFORMER_CUDA=ON CUDA_ARCHS=$arch bash "$ROOT/deploy/build-binaries.sh" "$build" "$out" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    die "deploy/build-binaries.sh failed (log: $log)"
  fi
  local built=$((SECONDS - s))
  say "  built in ${built} s: $(grep -c 'Building' "$log" || true) compiles, $(grep -c 'Linking' "$log" || true) links"

  mkdir -p "$stage/bin" "$stage/lib"
  local p f
  for p in "${SERVER_PROGRAMS[@]}"; do
    [ -x "$out/bin/$p" ] || die "deploy/build-binaries.sh made no bin/$p"
    cp "$out/bin/$p" "$stage/bin/"
  done
  [ -f "$out/lib/$SERVER_PLUGIN" ] || die "deploy/build-binaries.sh made no lib/$SERVER_PLUGIN"
  cp "$out/lib/$SERVER_PLUGIN" "$stage/lib/"

  # The closure: every library the programs and the plugin load (ldd is recursive), less the
  # machine's and .deps/lib's. Each is carried under the name the loader asks for (its SONAME).
  local name arrow path closure=() machine=() driver=() from_deps=()
  declare -A seen=()
  for f in "$stage"/bin/* "$stage/lib/$SERVER_PLUGIN"; do
    while read -r name arrow path; do
      [ -n "$name" ] && [ "$arrow" = "=>" ] || continue
      [ -z "${seen[$name]:-}" ] || continue
      seen[$name]=1
      if [[ "$name" =~ $MACHINE_BASE_RE ]]; then machine+=("$name"); continue; fi
      if [[ "$name" =~ $MACHINE_DRIVER_RE ]]; then driver+=("$name"); continue; fi
      [[ "$path" != not* ]] || die "$(basename "$f") needs $name, which ldd cannot find here"
      if [ -e "$DEPS/lib/$name" ] || [ -L "$DEPS/lib/$name" ] || grep -q "^$name " "$DEPS/LINKS" 2>/dev/null; then
        from_deps+=("$name")
        continue
      fi
      cp -L "$path" "$stage/lib/$name"
      chmod 644 "$stage/lib/$name"
      closure+=("$name $path")
    done < <(ldd "$f" | sed -e 's/ (0x[0-9a-f]*)$//' -e 's/^[[:space:]]*//')
  done
  local cudart="libcudart: static (the plugin links no libcudart.so)"
  if [ -n "${seen[libcudart.so.12]:-}${seen[libcudart.so.13]:-}" ]; then cudart="libcudart: shared, carried"; fi
  say "  closure: ${#closure[@]} libraries carried, ${#from_deps[@]} from .deps/lib (${from_deps[*]}), left to the machine: ${machine[*]}${driver[*]:+; to its CUDA driver: ${driver[*]}}; $cudart"

  # Packed as two xz streams in one file, a valid .tar.xz (xz and python's lzma read concatenated
  # streams, and tar the concatenated archive): first the closure (this machine's packages, the
  # same from one commit to the next: its tar without the end-of-archive blocks), then our
  # programs and plugin (new at every change). Each stream is cached under
  # $FASTFORMER_CACHE/carry-server/, keyed by the names and hashes of what it holds, so a change
  # of our code re-packs 15 MiB, not 70.
  local tmpd=$DEPS/server.tmp libs_part bins_part key
  rm -rf "$tmpd"
  mkdir -p "$tmpd"
  trap 'rm -rf "$DEPS/server.tmp"' EXIT
  local libs=(lib) bins=(bin) c
  for c in "${closure[@]}"; do libs+=("lib/${c%% *}"); done
  for p in "${SERVER_PROGRAMS[@]}"; do bins+=("bin/$p"); done
  bins+=("lib/$SERVER_PLUGIN")
  libs_part=$(pack_part closure 0 "$stage" "$tmpd" "${libs[@]}") || exit 1
  bins_part=$(pack_part programs 1 "$stage" "$tmpd" "${bins[@]}") || exit 1
  cat "$libs_part" "$bins_part" >"$tmpd/server.tar.xz"
  key="$(basename "$libs_part" .xz) $(basename "$bins_part" .xz)"
  xz -t "$tmpd/server.tar.xz" || die "the packed $tmpd/server.tar.xz does not test"
  [ "$(xz -d -c "$tmpd/server.tar.xz" | tar -tf - | grep -vc '/$')" = "$((${#libs[@]} + ${#bins[@]} - 2))" ] ||
    die "the packed $tmpd/server.tar.xz does not list the $((${#libs[@]} + ${#bins[@]} - 2)) files packed"
  (cd "$SERVER_CACHE" 2>/dev/null && ls -1t -- closure-*.xz 2>/dev/null | tail -n +4 | xargs -r rm -f) || true
  (cd "$SERVER_CACHE" 2>/dev/null && ls -1t -- programs-*.xz 2>/dev/null | tail -n +5 | xargs -r rm -f) || true

  mkdir -p "$tmpd/server"
  cp "$out/configure.cmd" "$tmpd/server/configure.cmd"
  {
    echo "commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -q . && echo ' with local changes'), built $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "cuda_arch $arch"
    echo "packed $key"
  } >"$tmpd/server/SOURCE"
  {
    echo "# .deps/server: written by deploy/carry-gpu-deps.sh --server on $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "# from $(. /etc/os-release && echo "$PRETTY_NAME"), $(uname -m); packed as .deps/server.tar.xz ($key)"
    echo "# run: LD_LIBRARY_PATH=<.deps>/server/lib:<.deps>/lib <.deps>/server/bin/fastformer-server ..."
    echo "# left to the machine: ${machine[*]}${driver[*]:+ ${driver[*]}}; from .deps/lib: ${from_deps[*]}; $cudart"
    echo "# they need at least: $(max_ver_in GLIBC "$stage"/bin/* "$stage"/lib/*), $(max_ver_in GLIBCXX "$stage"/bin/* "$stage"/lib/*), $(max_ver_in CXXABI "$stage"/bin/* "$stage"/lib/*)"
    echo "# files (bytes, from):"
    for p in "${SERVER_PROGRAMS[@]}"; do echo "bin/$p $(stat -c %s "$stage/bin/$p") $build/bin/$p (stripped)"; done
    echo "lib/$SERVER_PLUGIN $(stat -c %s "$stage/lib/$SERVER_PLUGIN") $build/lib/$SERVER_PLUGIN (stripped)"
    # Each library's package and version: one dpkg -S and one dpkg-query for all (the path as
    # ldd gave it, its real path, and that without /usr: dpkg knows some by their /lib path).
    local c pkg real q=() owner opath
    declare -A pkg_of=() ver_of=()
    for c in "${closure[@]}"; do
      path=${c#* }
      real=$(readlink -f "$path")
      q+=("$path" "$real" "${real#/usr}")
    done
    while IFS= read -r c; do
      owner=${c%%: *}
      opath=${c#*: }
      pkg_of[$opath]=${owner%%:*}
    done < <(dpkg -S "${q[@]}" 2>/dev/null | grep -v ', ' || true)
    local pkgs_found=()
    mapfile -t pkgs_found < <(printf '%s\n' "${pkg_of[@]}" | sort -u | grep .)
    while read -r c pkg; do ver_of[${c%%:*}]=$pkg; done < <(dpkg-query -W -f='${Package} ${Version}\n' \
      "${pkgs_found[@]}" 2>/dev/null || true)
    for c in "${closure[@]}"; do
      name=${c%% *}
      path=${c#* }
      real=$(readlink -f "$path")
      pkg=${pkg_of[$path]:-${pkg_of[$real]:-${pkg_of[${real#/usr}]:-}}}
      [ -z "$pkg" ] || pkg="$pkg ${ver_of[$pkg]:-}"
      echo "lib/$name $(stat -c %s "$stage/lib/$name") $real${pkg:+ ($pkg)}"
    done
  } >"$tmpd/server/CLOSURE.txt"

  # The expected outputs (the CPU engine in float32 on the server stage's inputs), computed here:
  # the lease spends no time on a CPU reference. tests/gpu/server_expected.py caches its own.
  local py
  if [ "${CARRY_SERVER_EXPECTED:-1}" = 0 ]; then
    say "  warning: CARRY_SERVER_EXPECTED=0: no expected outputs carried (.deps/server/expected)"
  elif [ ! -f "$ROOT/tests/gpu/server_expected.py" ]; then
    say "  warning: no tests/gpu/server_expected.py yet: no expected outputs carried (.deps/server/expected)"
  elif ! py=$(find_torch_python); then
    die "no python3 that imports torch for tests/gpu/server_expected.py (set PYTHON)"
  else
    s=$SECONDS
    if ! "$py" "$ROOT/tests/gpu/server_expected.py" --out "$tmpd/server/expected" --encode "$out/bin/fastformer-encode" \
      >"$build/carry-expected.log" 2>&1; then
      tail -n 30 "$build/carry-expected.log" >&2
      die "tests/gpu/server_expected.py failed (log: $build/carry-expected.log)"
    fi
    say "  expected outputs: $(mib "$(files_bytes "$tmpd/server/expected")") MiB in .deps/server/expected ($((SECONDS - s)) s; log $build/carry-expected.log)"
  fi

  rm -rf "$DEPS/server" "$DEPS/server.tar.xz"
  mv "$tmpd/server" "$DEPS/server"
  mv "$tmpd/server.tar.xz" "$DEPS/server.tar.xz"
  rm -rf "$tmpd"
  trap - EXIT
  say "wrote .deps/server.tar.xz ($(mib "$(stat -c %s "$DEPS/server.tar.xz")") MiB: bin/ ${SERVER_PROGRAMS[*]}; lib/ $SERVER_PLUGIN and ${#closure[@]} libraries, $(mib "$(files_bytes "$stage")") MiB unpacked) and .deps/server/ (configure.cmd, SOURCE, CLOSURE.txt$([ -d "$DEPS/server/expected" ] && echo ", expected/")) in $((SECONDS - t0)) s"
  baseline_carry
  repack_unpacked  # once more: a gpu-check.sh run in this checkout may have unpacked .deps meanwhile
  carried_total "$DEPS" || die "the carry is $(mib "$CARRIED_BYTES") MiB, over the budget of $CARRY_BUDGET_MIB MiB (CARRY_BUDGET_MIB)"
}

# ---- CUTLASS's headers (issue 48) -------------------------------------------------------------
# pack_cutlass DIR: DIR/cutlass.tar.xz, the include dir of deploy/cutlass-headers.sh (cute/ and
# cutlass/, about 1 MiB packed), from the cache ($FASTFORMER_CACHE/carry-cutlass/, keyed by the
# pinned wheel's version) or packed now and cached. Returns 1, with a warning, when the headers
# cannot be had (no cache and no PyPI): the lease then builds without the CUTLASS kernel.
CUTLASS_CACHE=$FASTFORMER_CACHE/carry-cutlass
pack_cutlass() {
  local dir=$1 version c log
  version=$(sed -n 's/^nvidia-cutlass==\([^ ]*\) .*/\1/p' "$ROOT/deploy/cutlass-wheel.txt" 2>/dev/null)
  if [ -z "$version" ] || [ ! -f "$ROOT/deploy/cutlass-headers.sh" ]; then
    say "warning: no deploy/cutlass-headers.sh or deploy/cutlass-wheel.txt: no CUTLASS headers carried"
    return 1
  fi
  c=$CUTLASS_CACHE/cutlass-$version.tar.xz
  if [ -f "$c" ] && xz -t "$c" 2>/dev/null; then
    cp "$c" "$dir/cutlass.tar.xz"
    say "CUTLASS $version headers: .deps/cutlass.tar.xz from the cache ($c, $(mib "$(stat -c %s "$c")") MiB)"
    return 0
  fi
  log=$(mktemp)
  if ! bash "$ROOT/deploy/cutlass-headers.sh" --pack "$dir/cutlass.tar.xz" >"$log" 2>&1; then
    say "warning: deploy/cutlass-headers.sh --pack failed ($(tail -n 1 "$log")): no CUTLASS headers carried; the lease builds without the CUTLASS kernel"
    rm -f "$log" "$dir/cutlass.tar.xz"
    return 1
  fi
  rm -f "$log"
  if mkdir -p "$CUTLASS_CACHE" 2>/dev/null && cp "$dir/cutlass.tar.xz" "$c.part.$$" 2>/dev/null; then
    mv "$c.part.$$" "$c"
  fi
  say "CUTLASS $version headers: .deps/cutlass.tar.xz packed ($(mib "$(stat -c %s "$dir/cutlass.tar.xz")") MiB; cached as $c)"
}

# ---- the baseline: the commit before issue 48's work, beside the new (issue 48) ----------------
# fastformer-bench and libfastformer_cuda_engine.so of CARRY_BASELINE_COMMIT, built from `git
# archive` of it with its own deploy/build-binaries.sh (the server's configure line, CUDA_ARCHS as
# the server's), through the same compiler cache (CMakeLists.txt sets CCACHE_BASEDIR: another
# folder hits it). Cached, stripped and packed, under $FASTFORMER_CACHE/carry-baseline/<commit>/
# sm_<arch>/; a second pack copies the tarball. Their shared libraries must be the server closure's,
# .deps/lib's or the machine's; any other is carried in baseline/lib (and said).
BASELINE_COMMIT=${CARRY_BASELINE_COMMIT:-d6c8ead}
BASELINE_BENCH=bin/fastformer-bench
BASELINE_PLUGIN=lib/libfastformer_cuda_engine.so
baseline_carry() {
  local arch=${GPU_CHECK_CUDA_ARCH:-90} commit short c t0=$SECONDS
  [ "${CARRY_BASELINE:-1}" != 0 ] || { say "CARRY_BASELINE=0: no baseline carried"; rm -rf "$DEPS/baseline" "$DEPS/baseline.tar.xz"; return 0; }
  [ -f "$DEPS/server/CLOSURE.txt" ] || die "the baseline runs on the server closure: run deploy/carry-gpu-deps.sh --server first"
  commit=$(git -C "$ROOT" rev-parse --verify -q "$BASELINE_COMMIT^{commit}") ||
    die "no commit $BASELINE_COMMIT in this checkout (CARRY_BASELINE_COMMIT): the baseline is built from it"
  short=$(git -C "$ROOT" rev-parse --short "$commit")
  c=$FASTFORMER_CACHE/carry-baseline/$commit/sm_$arch
  if [ -f "$c/baseline.tar.xz" ] && [ -f "$c/COMMIT" ] && xz -t "$c/baseline.tar.xz" 2>/dev/null; then
    say "baseline $short (sm_$arch): from the cache ($c)"
  else
    local tmp log s
    mkdir -p "$(dirname "$c")" || die "cannot write $(dirname "$c") (FASTFORMER_CACHE)"
    tmp=$(mktemp -d "$(dirname "$c")/.build-sm_$arch.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    log=$(dirname "$c")/build-sm_$arch.log
    mkdir -p "$tmp/src" "$tmp/stage/bin" "$tmp/stage/lib"
    git -C "$ROOT" archive --format=tar "$commit" | tar -C "$tmp/src" -xf - || die "git archive $commit failed"
    export FASTFORMER_CCACHE_DIR=${FASTFORMER_CCACHE_DIR:-$FASTFORMER_CACHE/ccache}
    say "building the baseline $short for sm_$arch: its deploy/build-binaries.sh, FASTFORMER_CUDA=ON CUDA_ARCHS=$arch (log: $log)"
    s=$SECONDS
    if ! (cd "$tmp/src" && FASTFORMER_CUDA=ON CUDA_ARCHS=$arch bash deploy/build-binaries.sh "$tmp/build" "$tmp/out") >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      die "the baseline's deploy/build-binaries.sh failed (log: $log)"
    fi
    say "  built in $((SECONDS - s)) s: $(grep -c 'Building' "$log" || true) compiles"
    cp "$tmp/out/$BASELINE_BENCH" "$tmp/stage/bin/"
    cp "$tmp/out/$BASELINE_PLUGIN" "$tmp/stage/lib/"
    # The configure line as run, with the temporary paths named for what they were.
    sed -e "s#$tmp/build#<build>#g" "$tmp/out/configure.cmd" >"$tmp/stage/configure.cmd"
    # Their libraries: the server closure's, .deps/lib's or the machine's; else carried here.
    local f name arrow path extra=()
    declare -A seen=()
    for f in "$tmp/stage/$BASELINE_BENCH" "$tmp/stage/$BASELINE_PLUGIN"; do
      while read -r name arrow path; do
        [ -n "$name" ] && [ "$arrow" = "=>" ] || continue
        [ -z "${seen[$name]:-}" ] || continue
        seen[$name]=1
        [[ "$name" =~ $MACHINE_BASE_RE ]] || [[ "$name" =~ $MACHINE_DRIVER_RE ]] && continue
        grep -q "^lib/$name " "$DEPS/server/CLOSURE.txt" && continue
        { [ -e "$DEPS/lib/$name" ] || grep -q "^$name " "$DEPS/LINKS" 2>/dev/null; } && continue
        [[ "$path" != not* ]] || die "the baseline's $(basename "$f") needs $name, which ldd cannot find here"
        cp -L "$path" "$tmp/stage/lib/$name"
        chmod 644 "$tmp/stage/lib/$name"
        extra+=("lib/$name")
      done < <(ldd "$f" | sed -e 's/ (0x[0-9a-f]*)$//' -e 's/^[[:space:]]*//')
    done
    if [ "${#extra[@]}" -gt 0 ]; then
      say "  the baseline needs ${#extra[@]} librar(ies) beyond the server closure: ${extra[*]} (carried in baseline/lib)"
    else
      say "  the baseline's libraries are all the server closure's, .deps/lib's or the machine's"
    fi
    (cd "$tmp/stage" && tar -b 1 --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - \
      "$BASELINE_BENCH" "$BASELINE_PLUGIN" "${extra[@]}") | "${SERVER_XZ[@]}" >"$tmp/stage/baseline.tar.xz"
    echo "$commit" >"$tmp/stage/COMMIT"
    printf '%s\n' "${extra[@]}" >"$tmp/stage/EXTRA"
    rm -rf "$tmp/stage/bin" "$tmp/stage/lib"
    rm -rf "$c"
    mv "$tmp/stage" "$c"
    rm -rf "$tmp"
    trap - EXIT
    say "  packed and cached: $c/baseline.tar.xz ($(mib "$(stat -c %s "$c/baseline.tar.xz")") MiB)"
  fi
  rm -rf "$DEPS/baseline" "$DEPS/baseline.tar.xz"
  mkdir -p "$DEPS/baseline"
  cp "$c/baseline.tar.xz" "$DEPS/baseline.tar.xz"
  cp "$c/COMMIT" "$c/configure.cmd" "$DEPS/baseline/"
  {
    echo "commit $short ($commit), the baseline of issue 48 (CARRY_BASELINE_COMMIT=$BASELINE_COMMIT)"
    echo "cuda_arch $arch"
    echo "built with its own deploy/build-binaries.sh; cached in $c"
    echo "extra libraries: $(tr '\n' ' ' <"$c/EXTRA" | sed 's/ $//')"
  } >"$DEPS/baseline/SOURCE"
  say "wrote .deps/baseline.tar.xz ($(mib "$(stat -c %s "$DEPS/baseline.tar.xz")") MiB: $BASELINE_BENCH, $BASELINE_PLUGIN of $short) and .deps/baseline/ (COMMIT, SOURCE, configure.cmd) in $((SECONDS - t0)) s"
}

# ---- --server --check: the carried programs load from a moved copy alone ----------------------
# The copy is unpacked where the lease would (another absolute path) by its own --unpack; then,
# as root in a private mount namespace (unshare --mount; else a user namespace), every system
# library directory (the loader's own search path, /etc/ld.so.conf's, /usr/local/lib, the CUDA
# toolkit's) is covered by one that holds only the machine's base libraries (glibc, libstdc++,
# libgcc_s), and /etc/ld.so.cache by an empty file. There, with LD_LIBRARY_PATH=
# <moved>/server/lib:<moved>/lib, each program and the plugin is traced by the loader (ldd's
# LD_TRACE_LOADED_OBJECTS with LD_BIND_NOW, which also names undefined symbols) and each
# program runs --help. Where no namespace can be made, the same loads with the system visible
# and an allow-list of where each library may come from, and the output says so.
server_check_py() {
  cat <<'EOF'
import ctypes, json, os, re, shutil, subprocess, sys

deps, work, mode = sys.argv[1], sys.argv[2], sys.argv[3]  # mode: hide | no-hide
programs = sys.argv[4].split()
plugin = sys.argv[5]
base_re = re.compile(sys.argv[6])
driver_re = re.compile(sys.argv[7])
multiarch = sys.argv[8]
tiny = sys.argv[9]  # a tiny model for the plugin's real load, or ""
rtld = "/lib64/ld-linux-x86-64.so.2"
lib_path = f"{deps}/server/lib:{deps}/lib"
env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": lib_path, "LC_ALL": "C", "HOME": work}
files = [(p, f"{deps}/server/bin/{p}", True) for p in programs] + [(plugin, f"{deps}/server/lib/{plugin}", False)]
# The baseline (issue 48), when carried: the old bench and plugin, on the server closure, with
# baseline/lib first (the old plugin, and any library the closure lacks).
baseline_env = dict(env, LD_LIBRARY_PATH=f"{deps}/baseline/lib:{lib_path}")
if os.path.exists(f"{deps}/baseline/COMMIT") or os.path.exists(f"{deps}/baseline/bin"):
    files += [("baseline fastformer-bench", f"{deps}/baseline/bin/fastformer-bench", True),
              (f"baseline {plugin}", f"{deps}/baseline/lib/{plugin}", False)]
errors, notes = [], []
missing = [f for _, f, _ in files if not os.path.isfile(f)]
if missing:
    print(json.dumps({"errors": [f"not carried: {f}" for f in missing], "notes": []}))
    sys.exit(0)


def env_of(short):
    return baseline_env if short.startswith("baseline ") else env


def trace(path, short=""):
    """The loader's trace of PATH: [(name, resolved path or None)], and its other lines."""
    e = dict(env_of(short), LD_TRACE_LOADED_OBJECTS="1", LD_WARN="yes", LD_BIND_NOW="yes")
    p = subprocess.run([rtld, path], env=e, capture_output=True, text=True, timeout=60)
    libs, other = [], []
    for line in (p.stdout + p.stderr).splitlines():
        line = re.sub(r" \(0x[0-9a-f]+\)$", "", line.strip())
        m = re.match(r"^(\S+) => (.*)$", line)
        if m:
            libs.append((m.group(1), None if m.group(2) == "not found" else m.group(2)))
        elif line and not line.startswith(("linux-vdso", "/lib64/ld-linux", rtld)):
            other.append(line)
    return p.returncode, libs, other


def realdir(d):
    return os.path.realpath(d)


hidden = []
if mode == "hide":
    # The machine's base libraries, as this machine resolves them, copied under their sonames.
    base = {}
    for _, f, _ in files:
        for name, path in trace(f)[1]:
            if path and base_re.match(name):
                base[name] = os.path.realpath(path)
    base["ld-linux-x86-64.so.2"] = os.path.realpath(rtld)
    # What to cover: the loader's system search path, /etc/ld.so.conf's directories, the local
    # and CUDA library directories.
    dirs = []
    out = subprocess.run([rtld, "--help"], capture_output=True, text=True).stdout
    dirs += [ln.split()[0] for ln in out.splitlines() if "(system search path)" in ln]

    def conf(path, seen=set()):
        if path in seen or not os.path.isfile(path):
            return []
        seen.add(path)
        got = []
        for ln in open(path, errors="replace"):
            ln = ln.split("#")[0].strip()
            if ln.startswith("include "):
                import glob
                for g in sorted(glob.glob(ln.split(None, 1)[1])):
                    got += conf(g)
            elif ln.startswith("/"):
                got.append(ln)
        return got
    dirs += conf("/etc/ld.so.conf")
    import glob
    dirs += ["/usr/local/lib", "/usr/local/lib64", f"/usr/local/lib/{multiarch}"]
    for root in glob.glob("/usr/local/cuda*") + glob.glob("/opt/cuda*"):
        dirs += [f"{root}/lib64", f"{root}/lib"] + glob.glob(f"{root}/targets/*/lib")
    real = []
    for d in dirs:
        if os.path.isdir(d) and realdir(d) not in real:
            real.append(realdir(d))
    tops = [d for d in real if not any(d != o and d.startswith(o + "/") for o in real)]
    ma_dirs = [d for d in real if os.path.basename(d) == multiarch]
    if not ma_dirs:
        ma_dirs = [realdir(f"/usr/lib/{multiarch}")]
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
    MS_BIND, MS_REC = 4096, 16384
    plan = []
    for i, top in enumerate(sorted(tops)):
        cover = os.path.join(work, "cover", str(i))
        os.makedirs(cover)
        for ma in ma_dirs:
            if ma == top or ma.startswith(top + "/"):
                into = os.path.join(cover, os.path.relpath(ma, top))
                os.makedirs(into, exist_ok=True)
                for name, src in base.items():
                    shutil.copy2(src, os.path.join(into, name))
        # /lib64 holds the loader's link (the programs' interpreter): kept, pointing at the cover.
        if top in ("/lib64", "/usr/lib64") and os.path.lexists(rtld):
            os.symlink(f"/lib/{multiarch}/ld-linux-x86-64.so.2", os.path.join(cover, "ld-linux-x86-64.so.2"))
        plan.append((cover, top))
    empty = os.path.join(work, "empty-ld.so.cache")
    open(empty, "w").close()
    if os.path.exists("/etc/ld.so.cache"):
        plan.append((empty, "/etc/ld.so.cache"))
    for src, dst in plan:
        if libc.mount(src.encode(), dst.encode(), None, MS_BIND | MS_REC, None) != 0:
            err = os.strerror(ctypes.get_errno())
            print(json.dumps({"cannot_hide": f"mount --bind over {dst}: {err}"}))
            sys.exit(3)
        hidden.append(dst)
    for ma in ma_dirs:
        left = sorted(os.listdir(ma))
        if left != sorted(base):
            errors.append(f"the cover of {ma} holds {left}, not only {sorted(base)}")
    notes.append("hidden: " + ", ".join(hidden) + f"; the base libraries left: {' '.join(sorted(base))}")

moved = os.path.realpath(deps) + "/"
for short, f, is_program in files:
    rc, libs, other = trace(f, short)
    for name, path in libs:
        if path is None:
            if driver_re.match(name):
                notes.append(f"{short}: {name} not found (the CUDA driver: the machine's)")
            else:
                errors.append(f"{short}: {name} not found")
        elif os.path.realpath(path).startswith(moved):
            pass
        elif base_re.match(name) or driver_re.match(name):
            pass  # the machine's (in hide mode, only the cover's copies are there to find)
        else:
            errors.append(f"{short}: {name} resolves to {path}, outside the carried tree")
    undefined = [ln.split("undefined symbol: ", 1)[1].split()[0] for ln in other if "undefined symbol: " in ln]
    if undefined:
        errors.append(f"{short}: {len(undefined)} undefined symbol(s), e.g. {', '.join(undefined[:2])}")
    for line in other:
        if "undefined symbol: " not in line and ("not found" in line or "error" in line.lower()):
            errors.append(f"{short}: {line}")
    if rc != 0 and not any(e.startswith(short + ":") for e in errors):
        errors.append(f"{short}: the loader's trace exited {rc}: {' | '.join(other[-3:])}")
    if is_program:
        try:
            p = subprocess.run([f, "--help"], env=env_of(short), capture_output=True, text=True, timeout=30)
            if p.returncode != 0:
                tail = " | ".join((p.stdout + p.stderr).strip().splitlines()[-3:])
                errors.append(f"{short} --help exited {p.returncode}: {tail}")
        except subprocess.TimeoutExpired:
            errors.append(f"{short} --help did not end in 30 s")
    notes.append(f"{short}: {len(libs)} libraries, {sum(1 for _, p in libs if p and os.path.realpath(p).startswith(moved))} from the moved copy")
# The plugin, loaded for real: fastformer-bench --backend cuda opens it (dlopen, from
# <exe dir>/../lib), and with no GPU it must end on the CUDA runtime's word, not the loader's.
if tiny:
    benches = [("fastformer-bench", f"{deps}/server/bin/fastformer-bench", f"{deps}/server/lib/{plugin}")]
    if any(short.startswith("baseline ") for short, _, _ in files):
        benches.append(("baseline fastformer-bench", f"{deps}/baseline/bin/fastformer-bench",
                        f"{deps}/baseline/lib/{plugin}"))
    for short, bench, own_plugin in benches:
        cmd = [bench, "--model-dir", tiny, "--backend", "cuda", "--seconds", "0.1"]
        try:
            # LD_DEBUG=files names the plugin file the loader opened: each bench its own.
            p = subprocess.run(cmd, env=dict(env_of(short), LD_DEBUG="files"), capture_output=True, text=True,
                               timeout=60)
            said = " | ".join(ln for ln in (p.stdout + p.stderr).strip().splitlines()
                              if not re.match(r"^\s*\d+:", ln))
            said = " | ".join(said.split(" | ")[-2:])
            opened = sorted({os.path.normpath(m) for m in re.findall(r"file=(\S*" + re.escape(plugin) + r")\s+\[0\];\s+dynamically loaded",
                                                   p.stderr)})
            if "cannot load the CUDA engine plugin" in said:
                errors.append(f"{short}: --backend cuda could not open {plugin}: {said}")
            elif opened and not any(os.path.realpath(o) == os.path.realpath(own_plugin) for o in opened):
                errors.append(f"{short}: opened {', '.join(opened)}, not its own {own_plugin}")
            elif p.returncode == 0:
                notes.append(f"{short}: opened {own_plugin} and ran (exited 0: a GPU is here)")
            else:
                notes.append(f"{short}: opened {opened[0] if opened else plugin} with --backend cuda, which then said: {said}")
        except subprocess.TimeoutExpired:
            errors.append(f"{short}: --backend cuda did not end in 60 s")
else:
    notes.append(f"{plugin}: not loaded for real (no python3 with torch for a tiny model): traced only")
print(json.dumps({"errors": list(dict.fromkeys(errors)), "notes": notes, "hidden": hidden}))
EOF
}

server_check() {
  local src=${1:-$DEPS} t keep=1 t0
  [ -d "$src" ] || die "no $src: run deploy/carry-gpu-deps.sh --server first"
  src=$(cd "$src" && pwd)
  [ -f "$src/server.tar.xz" ] || [ -d "$src/server/bin" ] || die "$src holds no server carry: run deploy/carry-gpu-deps.sh --server first"
  [ -f "$src/server.tar.xz" ] || say "warning: $src/server is unpacked (no server.tar.xz): checking it as it is"
  t=${CARRY_SERVER_CHECK_DIR:-}
  if [ -z "$t" ]; then
    t=$(mktemp -d /tmp/carry-server-check.XXXXXX)
    keep=0
  fi
  mkdir -p "$t"
  t=$(cd "$t" && pwd)
  local moved=$t/moved/tree
  rm -rf "$t/moved" "$t/work" "$t/model-tiny"
  mkdir -p "$moved/deploy" "$t/work"
  cp -a "$src" "$moved/.deps"
  cp "$ROOT/deploy/carry-gpu-deps.sh" "$moved/deploy/"
  say "server check: .deps copied to $moved/.deps (moved from $src)"
  t0=$(date +%s.%N)
  (cd "$moved" && bash deploy/carry-gpu-deps.sh --unpack) | sed 's/^/  /'
  local unpack_s
  unpack_s=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  say "  --unpack took ${unpack_s} s (gpu-check.sh's deps stage allows 20 s)"

  local py ma res="" rc=0 how
  py=$(command -v python3) || die "python3 is needed for --server --check"
  ma=$(gcc -print-multiarch 2>/dev/null || true)
  [ -n "$ma" ] || ma=x86_64-linux-gnu
  server_check_py >"$t/server_check.py"
  # A tiny model (2 s), for the plugin's real load.
  local tiny="" tpy
  if tpy=$(find_torch_python) && "$tpy" "$ROOT/tools/make_demo_model.py" --preset tiny --seed 1 --out "$t/model-tiny" \
    >"$t/model-tiny.log" 2>&1; then
    tiny=$t/model-tiny
  fi
  local argv=("$t/server_check.py" "$moved/.deps" "$t/work" hide "${SERVER_PROGRAMS[*]}" "$SERVER_PLUGIN"
    "$MACHINE_BASE_RE" "$MACHINE_DRIVER_RE" "$ma" "$tiny")
  local why_not="" hows=("unshare --mount --propagation private" "unshare --user --map-root-user --mount --propagation private")
  if [ "${CARRY_SERVER_CHECK_HIDE:-1}" = 0 ]; then hows=(); why_not="CARRY_SERVER_CHECK_HIDE=0"; fi
  for how in "${hows[@]}"; do
    rm -rf "$t/work" && mkdir -p "$t/work"
    rc=0
    res=$($how -- "$py" "${argv[@]}" 2>"$t/check.err") || rc=$?
    if [ "$rc" = 0 ] && [ -n "$res" ]; then break; fi
    if grep -q '^Traceback' "$t/check.err"; then cat "$t/check.err" >&2; die "the check itself failed ($how)"; fi
    why_not="${why_not:+$why_not; }$how: $(echo "$res" | sed -n 's/.*"cannot_hide": "\([^"]*\)".*/\1/p')$(tail -2 "$t/check.err" | tr '\n' ' ')"
    res=""
  done
  if [ -z "$res" ]; then
    say "  warning: the system's library directories could not be hidden ($why_not): an allow-list check instead, each library must resolve inside the moved copy or be the machine's (glibc, libstdc++, libgcc_s, the CUDA driver)"
    argv[3]=no-hide
    rm -rf "$t/work" && mkdir -p "$t/work"
    res=$("$py" "${argv[@]}" 2>"$t/check.err") || { cat "$t/check.err" >&2; die "the check itself failed"; }
  else
    say "  system library directories hidden ($how)"
  fi
  local hidden_how="the system's library directories hidden ($how)"
  [ "${argv[3]}" = hide ] || hidden_how="the system's library directories NOT hidden: the allow-list check"
  local verdict
  verdict=$(printf '%s' "$res" | "$py" -c '
import json, sys
r = json.load(sys.stdin)
for n in r.get("notes", []): print("note\t" + n)
for e in r.get("errors", []): print("error\t" + e)')
  printf '%s\n' "$verdict" | sed -n 's/^note\t/carry-gpu-deps:   /p'
  if printf '%s\n' "$verdict" | grep -q '^error'; then
    printf '%s\n' "$verdict" | sed -n 's/^error\t/carry-gpu-deps:   FAIL: /p' >&2
    [ "$keep" = 1 ] || rm -rf "$t"
    die "the carried server does not load from the moved copy alone (above)"
  fi
  local baseline_said=""
  if [ -f "$moved/.deps/baseline/COMMIT" ]; then
    baseline_said="; the baseline's fastformer-bench and plugin ($(cut -c1-12 "$moved/.deps/baseline/COMMIT")) too"
  fi
  say "  every library of ${SERVER_PROGRAMS[*]} and $SERVER_PLUGIN resolves inside the moved copy or is the machine's base; each program's --help exits 0$([ -n "$tiny" ] && echo "; fastformer-bench --backend cuda opens the plugin")$baseline_said"
  [ "$keep" = 1 ] || rm -rf "$t"
  carried_total "$src" || die "the carry is $(mib "$CARRIED_BYTES") MiB, over the budget of $CARRY_BUDGET_MIB MiB (CARRY_BUDGET_MIB)"
  say "server check passed: $hidden_how"
}

case "$mode" in
  unpack) unpack "${args[0]:-}"; exit 0 ;;
  check) check; exit 0 ;;
  server) server_carry; exit 0 ;;
  baseline)
    baseline_carry
    carried_total "$DEPS" || die "the carry is $(mib "$CARRIED_BYTES") MiB, over the budget of $CARRY_BUDGET_MIB MiB (CARRY_BUDGET_MIB)"
    exit 0 ;;
  servercheck) server_check "${args[0]:-}"; exit 0 ;;
  budget) carried_total "$DEPS" || die "over the budget of $CARRY_BUDGET_MIB MiB (CARRY_BUDGET_MIB)"; exit 0 ;;
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

# CUTLASS's headers (issue 48), packed: .deps/cutlass.tar.xz, opened by --unpack.
pack_cutlass "$TMP" || true

# The server carry and the baseline (--server) are kept: they are rebuilt by --server alone.
kept_server=""
for f in server server.tar.xz baseline baseline.tar.xz; do
  if [ -e "$DEPS/$f" ]; then mv "$DEPS/$f" "$TMP/$f"; kept_server="${kept_server:+$kept_server and }.deps/$f"; fi
done
rm -rf "$DEPS"
mv "$TMP" "$DEPS"
trap - EXIT
[ -z "$kept_server" ] || say "kept the server carry and the baseline ($kept_server, $(head -1 "$DEPS/server/SOURCE" 2>/dev/null || echo 'source unknown')): deploy/carry-gpu-deps.sh --server remakes it"

say "wrote .deps/: $(find "$DEPS" -type f | wc -l) files"
(cd "$DEPS" && find . -type f -size +400k -exec du -k {} + | sort -rn | awk '{printf "carry-gpu-deps:   %7.1f MiB  %s\n", $1/1024, $2}')
if [ -s "$DEPS/PACKED" ]; then
  say "packed (unpacked by 'deploy/carry-gpu-deps.sh --unpack' and by tests/gpu/gpu-check.sh): $(tr '\n' ' ' <"$DEPS/PACKED")"
fi
grep '^# the carried' "$DEPS/MANIFEST.txt" | sed 's/^# /carry-gpu-deps: /'
carried_total "$DEPS" || say "warning: over the budget of $CARRY_BUDGET_MIB MiB (deploy/carry-gpu-deps.sh --server fails on it)"
git check-ignore -q .deps 2>/dev/null || say "warning: .deps is not git-ignored (add /.deps/ to .gitignore)"

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
#   deploy/carry-gpu-deps.sh --check   load every CMake config from a moved copy of .deps
#                                      alone, and link and run a program against them all
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
  -h|--help) sed -n '2,23p' "$0"; exit 0 ;;
  *) echo "carry-gpu-deps.sh: unknown option '$1' (expected --plain, --unpack or --check)" >&2; exit 2 ;;
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

# ---- --check: configs load from .deps alone, a program links and runs ----------------------
check() {
  [ -d "$DEPS" ] || die "no .deps/: run deploy/carry-gpu-deps.sh first"
  local cmake_bin=${CMAKE:-cmake}
  local t
  t=$(mktemp -d /tmp/carry-gpu-deps-check.XXXXXX)
  # A moved copy, unpacked there: .deps stays as it travels, and relocation is tested.
  cp -a "$DEPS" "$t/deps"
  DEPS=$t/deps
  unpack >/dev/null
  cat >"$t/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.23)
project(deps_check LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 CONFIG REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(GTest REQUIRED)
# oneDNN as the root CMakeLists finds it: by header and library; libgomp is the compiler's.
find_path(DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp REQUIRED)
find_library(DNNL_LIBRARY dnnl REQUIRED)
find_library(GOMP_LIBRARY NAMES gomp libgomp.so.1 REQUIRED
             HINTS ${CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES})
set(bad "")
foreach(p nlohmann_json CLI11 spdlog fmt GTest)
  message(STATUS "deps-check: ${p}_DIR = ${${p}_DIR}")
  if(NOT "${${p}_DIR}" MATCHES "^${DEPS_PREFIX}/")
    list(APPEND bad ${p})
  endif()
endforeach()
foreach(v DNNL_INCLUDE_DIR DNNL_LIBRARY)
  message(STATUS "deps-check: ${v} = ${${v}}")
  if(NOT "${${v}}" MATCHES "^${DEPS_PREFIX}/")
    list(APPEND bad ${v})
  endif()
endforeach()
message(STATUS "deps-check: GOMP_LIBRARY = ${GOMP_LIBRARY} (the compiler's, not carried)")
if("${GOMP_LIBRARY}" MATCHES "^${DEPS_PREFIX}/")
  list(APPEND bad GOMP_LIBRARY)
endif()
foreach(t spdlog::spdlog fmt::fmt GTest::gtest GTest::gmock GTest::gtest_main)
  get_target_property(loc ${t} LOCATION)
  message(STATUS "deps-check: ${t} = ${loc}")
  if(NOT "${loc}" MATCHES "^${DEPS_PREFIX}/")
    list(APPEND bad ${t})
  endif()
endforeach()
foreach(t nlohmann_json::nlohmann_json CLI11::CLI11 spdlog::spdlog GTest::gtest)
  get_target_property(inc ${t} INTERFACE_INCLUDE_DIRECTORIES)
  message(STATUS "deps-check: ${t} includes ${inc}")
endforeach()
if(bad)
  message(FATAL_ERROR "deps-check: found outside ${DEPS_PREFIX}: ${bad}")
endif()
add_executable(deps_check main.cc)
target_include_directories(deps_check SYSTEM PRIVATE ${DNNL_INCLUDE_DIR})
target_link_libraries(deps_check PRIVATE nlohmann_json::nlohmann_json CLI11::CLI11 spdlog::spdlog
                      ${DNNL_LIBRARY} ${GOMP_LIBRARY} GTest::gmock GTest::gtest_main Threads::Threads)
EOF
  cat >"$t/main.cc" <<'EOF'
#include <oneapi/dnnl/dnnl.hpp>
#include <CLI/CLI.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

TEST(DepsCheck, AllLibrariesWork) {
  // A 2x2 float32 matmul primitive on oneDNN's CPU engine: c = a b.
  float a[4] = {1, 2, 3, 4}, b[4] = {0, 1, 1, 0}, c[4] = {0, 0, 0, 0};
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const dnnl::memory::desc md({2, 2}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
#if DNNL_VERSION_MAJOR >= 3
  dnnl::matmul::primitive_desc pd(eng, md, md, md);
#else
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), eng);
#endif
  dnnl::memory ma(md, eng, a), mb(md, eng, b), mc(md, eng, c);
  dnnl::matmul(pd).execute(strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  strm.wait();
  EXPECT_THAT(std::vector<float>(c, c + 4), ::testing::ElementsAre(2, 1, 4, 3));
  auto j = nlohmann::json::parse(R"({"x": 3})");
  EXPECT_EQ(j["x"].get<int>(), 3);
  CLI::App app{"deps"};
  int n = 0;
  app.add_option("--n", n);
  const char* argv[] = {"deps", "--n", "7"};
  app.parse(3, argv);
  EXPECT_EQ(n, 7);
  const dnnl_version_t* v = dnnl_version();
  spdlog::info("spdlog {} works, oneDNN {}.{}.{} ({}) matmul works", SPDLOG_VER_MAJOR, v->major, v->minor,
               v->patch, v->hash);
}
EOF
  # Only the carried prefix: /usr and /usr/local are not searched for packages.
  "$cmake_bin" -S "$t" -B "$t/build" -DCMAKE_BUILD_TYPE=Release -DDEPS_PREFIX="$DEPS" \
    -DCMAKE_PREFIX_PATH="$DEPS" -DCMAKE_IGNORE_PREFIX_PATH="/usr;/usr/local;/" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    >"$t/configure.log" 2>&1 || { cat "$t/configure.log"; die "configure against .deps failed ($t)"; }
  grep 'deps-check:' "$t/configure.log" | sed 's/^-- /  /'
  "$cmake_bin" --build "$t/build" -j"$(nproc 2>/dev/null || echo 2)" >"$t/build.log" 2>&1 ||
    { tail -30 "$t/build.log"; die "build against .deps failed ($t)"; }
  LD_LIBRARY_PATH="$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$t/build/deps_check" >"$t/run.log" 2>&1 ||
    { cat "$t/run.log"; die "the check program failed ($t)"; }
  grep -E 'spdlog|PASSED' "$t/run.log" | sed 's/^/  /'
  if command -v ldd >/dev/null 2>&1; then
    local lddout
    lddout=$(LD_LIBRARY_PATH="$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$t/build/deps_check")
    grep -E 'dnnl|OpenCL|gomp|spdlog|fmt' <<<"$lddout" | sed 's/^\s*/  ldd: /'
    grep -E '^\s*libdnnl\.so\.[0-9]+ => '"$DEPS/lib/" <<<"$lddout" >/dev/null ||
      die "deps_check does not load libdnnl from $DEPS/lib ($t)"
  fi
  rm -rf "$t"
  say "check passed: every config loads from .deps alone and the program links and runs"
}

case "$mode" in
  unpack) unpack; exit 0 ;;
  check) check; exit 0 ;;
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

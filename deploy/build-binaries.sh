#!/usr/bin/env bash
# The shipped programs, built with the one configure line of the container image (issue 47):
# the Dockerfile's builder runs it, and so does `deploy/carry-gpu-deps.sh --server`, which packs
# what it builds for a lent GPU machine; so "the image's binaries ran on a GPU" is a checked
# statement, not a hope.
#
#   deploy/build-binaries.sh BUILD_DIR OUT_DIR [CMAKE_ARG...]
#
# Configures BUILD_DIR with
#   cmake -S . -B BUILD_DIR -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=ON
#         -DFASTFORMER_WERROR=ON -DFASTFORMER_TESTS=OFF -DFASTFORMER_CUDA=$FASTFORMER_CUDA
#         [-DCMAKE_CUDA_ARCHITECTURES=$CUDA_ARCHS] CMAKE_ARG...
# (the Release build of `make build`, less the tests; Ninja when installed), builds the five
# programs and, with FASTFORMER_CUDA=ON, the CUDA engine plugin, and installs them stripped into
# OUT_DIR/bin and OUT_DIR/lib (the server opens the plugin from <its dir>/../lib). The configure
# line, as run, is written to OUT_DIR/configure.cmd.
#
# Environment: FASTFORMER_CUDA [ON], CUDA_ARCHS ["80;90;100"; ignored with FASTFORMER_CUDA=OFF],
# BUILD_JOBS [nproc]. CMAKE_ARGs come last, so they may add to the line (the compiler cache, the
# CUDA compiler, cuBLASLt's header) but the fixed part above is the same everywhere.
set -euo pipefail
# One locale for every caller (the image's builder, the carry): the compiler cache keys on it.
export LANG=C.UTF-8
unset LC_ALL
[ $# -ge 2 ] || { sed -n '2,20p' "$0" >&2; exit 2; }
build_dir=$1
out=$2
shift 2
cd "$(dirname "$0")/.."

cuda=${FASTFORMER_CUDA:-ON}
archs=${CUDA_ARCHS:-80;90;100}
PROGRAMS=(fastformer-server fastformer-client fastformer-encode fastformer-bench fastformer-loadgen)

gen=()
if command -v ninja >/dev/null && [ ! -f "$build_dir/CMakeCache.txt" ]; then gen=(-G Ninja); fi
line=(cmake -S . -B "$build_dir" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DFASTFORMER_SERVER=ON
  -DFASTFORMER_WERROR=ON -DFASTFORMER_TESTS=OFF -DFASTFORMER_CUDA="$cuda")
[ "$cuda" != ON ] || line+=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
line+=("$@")

"${line[@]}"
targets=("${PROGRAMS[@]}")
[ "$cuda" != ON ] || targets+=(fastformer_cuda_engine)
cmake --build "$build_dir" -j"${BUILD_JOBS:-$(nproc)}" --target "${targets[@]}"

mkdir -p "$out/bin" "$out/lib"
for exe in "${PROGRAMS[@]}"; do
  install -m 0755 -s "$build_dir/bin/$exe" "$out/bin/"
done
if [ "$cuda" = ON ]; then
  install -m 0644 -s "$build_dir/lib/libfastformer_cuda_engine.so" "$out/lib/"
fi
printf '%q ' "${line[@]}" | sed 's/ $//' >"$out/configure.cmd"
echo >>"$out/configure.cmd"
echo "build-binaries: ${targets[*]} -> $out (configure line: $out/configure.cmd)"

#!/usr/bin/env bash
# CUTLASS's headers for the CUDA engine's sm_90a GEMM (issue 48), taken out of the pinned
# nvidia-cutlass wheel (deploy/cutlass-wheel.txt) into the cache outside the checkout:
#   $FASTFORMER_CACHE/cutlass/<version>/include/{cute,cutlass}   (27 MiB; default cache
#   /var/cache/fastformer). CMake looks there (FASTFORMER_CUTLASS_DIR, CMakeLists.txt).
#
#   deploy/cutlass-headers.sh              fetch and unpack when missing; print the include dir
#   deploy/cutlass-headers.sh --path       print the include dir; exit 1 when not unpacked yet
#   deploy/cutlass-headers.sh --pack FILE  also write FILE, the include dir as a .tar.xz (the GPU
#                                          lease's copy: deploy/carry-gpu-deps.sh)
# Idempotent; the unpacking is atomic (a temporary directory renamed into place), so an
# interrupted run leaves nothing half-written. Needs pip (python3 -m pip) and PyPI the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
list=deploy/cutlass-wheel.txt
version=$(sed -n 's/^nvidia-cutlass==\([^ ]*\) .*/\1/p' "$list")
cache=${FASTFORMER_CACHE:-/var/cache/fastformer}/cutlass
include=$cache/$version/include
pack=
case "${1:-}" in
  --path) [ -f "$include/cutlass/version.h" ] && { echo "$include"; exit 0; }; exit 1 ;;
  --pack) pack=${2:?--pack FILE}; case "$pack" in /*) ;; *) pack=$PWD/$pack ;; esac ;;
  "") ;;
  -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
  *) echo "cutlass-headers.sh: unknown option '$1'" >&2; exit 2 ;;
esac

if [ ! -f "$include/cutlass/version.h" ]; then
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/.unpack.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  python=$(for p in python3 /usr/bin/python3; do "$p" -m pip --version >/dev/null 2>&1 && { echo "$p"; break; }; done)
  [ -n "$python" ] || { echo "cutlass-headers.sh: no python3 with pip (deploy/install-deps.sh installs python3-pip)" >&2; exit 1; }
  "$python" -m pip download -q --no-deps --require-hashes -r "$list" -d "$tmp/wheel" >&2
  "$python" - "$tmp/wheel" "$tmp/$version" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("nvidia_cutlass-*.whl"))
prefix = "cutlass_library/source/include/"
out = pathlib.Path(sys.argv[2]) / "include"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = out / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PY
  [ -f "$tmp/$version/include/cutlass/version.h" ] || { echo "cutlass-headers.sh: the wheel has no cutlass/version.h" >&2; exit 1; }
  rm -rf "${cache:?}/$version"
  mv "$tmp/$version" "$cache/$version"
fi
if [ -n "$pack" ]; then
  tar -C "$include" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - cute cutlass |
    xz -T0 -6 >"$pack.tmp"
  mv "$pack.tmp" "$pack"
fi
echo "$include"

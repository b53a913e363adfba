#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Fastformer Serving builds and tests with.
# Idempotent: packages already present are skipped, and nothing is fetched when
# everything is installed. Supports Debian 12 (bookworm) and Ubuntu 24.04.
#
#   deploy/install-deps.sh            build + test dependencies
#   deploy/install-deps.sh --runtime  only the shared libraries the binaries need
set -euo pipefail

mode=all
case "${1:-}" in
  --runtime) mode=runtime ;;
  --build) mode=build ;;
  ""|--all) mode=all ;;
  -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
  *) echo "install-deps.sh: unknown option '$1' (expected --runtime, --build or --all)" >&2; exit 2 ;;
esac

build_pkgs=(
  build-essential cmake pkg-config git ca-certificates
  libopenblas-dev
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev
)
test_pkgs=(
  python3 python3-numpy python3-torch python3-pytest
  python3-grpcio python3-grpc-tools
  prometheus python3-matplotlib python3-yaml
  clang libclang-rt-14-dev  # make fuzz: libFuzzer (-fsanitize=fuzzer)
)
runtime_pkgs=(
  libopenblas0 libspdlog1.10 libfmt9
  libgrpc++1.51 libprotobuf32 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0
)

case "$mode" in
  runtime) wanted=("${runtime_pkgs[@]}") ;;
  build) wanted=("${build_pkgs[@]}") ;;
  all) wanted=("${build_pkgs[@]}" "${test_pkgs[@]}") ;;
esac

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"

#!/usr/bin/env bash
# Installs the Debian/Ubuntu packages Fastformer Serving builds and tests with.
# Idempotent: packages already present are skipped, and nothing is fetched when
# everything is installed. Supports Debian 12 (bookworm) and Ubuntu 24.04 (noble), told
# apart by /etc/os-release: their runtime library packages are named differently.
#
#   deploy/install-deps.sh            build + test dependencies, and buildah + debootstrap
#                                     for `make image-test` and `make image-test-cuda`
#   deploy/install-deps.sh --build    only what compiling needs (the Dockerfile's builder)
#   deploy/install-deps.sh --runtime  only the shared libraries the binaries need (the image)
set -euo pipefail

mode=all
case "${1:-}" in
  --runtime) mode=runtime ;;
  --build) mode=build ;;
  ""|--all) mode=all ;;
  -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
  *) echo "install-deps.sh: unknown option '$1' (expected --runtime, --build or --all)" >&2; exit 2 ;;
esac

build_pkgs=(
  build-essential cmake pkg-config git ca-certificates
  ccache ninja-build mold  # the compiler cache, the generator and the linker of every build
  libdnnl-dev  # oneDNN: the CPU engine's GEMMs (2.x on Debian 12, 3.x on Ubuntu 24.04)
  libicu-dev  # ICU: the tokenizer's Unicode normalization, character classes and regex
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc
  prometheus-cpp-dev
  # The HTTP listener: Boost.Beast (header-only; Boost 1.74 on Debian 12, 1.83 on Ubuntu 24.04),
  # simdjson for request bodies, OpenSSL for HTTPS.
  libboost-dev libsimdjson-dev libssl-dev
  libsqlite3-dev  # SQLite: the state of bulk embedding jobs under --jobs-dir (issue 50)
)
test_pkgs=(
  python3 python3-numpy python3-torch python3-pytest
  # Debian's python3-torch (BLAS_INFO=generic) and python3-numpy run on whatever libblas.so.3
  # points at; with only libblas3 that is netlib's reference BLAS, ~10x slower (a torch matmul
  # 2048x256x256: 6.3 GFLOP/s there, 80.9 on OpenBLAS; training the demo model took 8 minutes an
  # epoch). The alternative is checked below. Same name on Ubuntu 24.04 (openblas 0.3.26).
  libopenblas0-pthread
  python3-venv  # .venv-bench: onnxruntime from PyPI for tools/bench_onnxruntime.py (tools/ort_env.py)
  python3-grpcio python3-grpc-tools
  prometheus python3-matplotlib python3-yaml
  openssl  # the TLS tests make their certificates with it
  curl  # make test-http: curl on every HTTP route
  libb64-0d  # make test-kserve: Triton's perf_analyzer links it (mk/kserve.mk)
  clang libclang-rt-dev  # make fuzz: libFuzzer (-fsanitize=fuzzer) of the default clang
  manpages manpages-dev  # make demo-trained: the corpus of tools/train_demo_model.py
  python3-nltk  # tests/golden/test_train_demo_model.py: NLTK's wordpunct_tokenize, the reference
)
# make image-test: builds a local debian:bookworm base and the CPU image, no registry; make
# image-test-cuda also fetches NVIDIA's CUDA wheels on the host (pip download).
image_test_pkgs=(buildah debootstrap python3-pip)

# The runtime libraries of the binaries (ldd), by release: Ubuntu 24.04 renamed the libraries
# in the 64-bit time_t transition (t64) and ships spdlog 1.12.
os_id=unknown os_version=unknown
not_packaged=()
if [ -r /etc/os-release ]; then
  # shellcheck source=/dev/null
  os_id=$(. /etc/os-release && echo "${ID:-unknown}")
  # shellcheck source=/dev/null
  os_version=$(. /etc/os-release && echo "${VERSION_ID:-unknown}")
fi
case "$os_id:$os_version" in
  debian:12)
    runtime_pkgs=(
      libdnnl2 libspdlog1.10 libfmt9 libicu72
      libgrpc++1.51 libprotobuf32 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0
      libsimdjson14 libssl3 libsqlite3-0
    ) ;;
  ubuntu:24.04)
    runtime_pkgs=(
      libdnnl3 libspdlog1.12 libfmt9 libicu74
      libgrpc++1.51t64 libprotobuf32t64 libprometheus-cpp-pull1.0 libprometheus-cpp-core1.0
      libssl3t64 libsqlite3-0
    )
    # simdjson's library, by the soname Ubuntu's libsimdjson-dev depends on (not pinned here).
    simdjson_lib=$(apt-cache depends libsimdjson-dev 2>/dev/null | awk '/Depends: libsimdjson[0-9]/ {print $2; exit}')
    runtime_pkgs+=("${simdjson_lib:-libsimdjson-dev}")
    # Ubuntu 24.04 has no python3-torch package: PyTorch comes from pip there (see below).
    not_packaged=(python3-torch) ;;
  *)
    if [ "$mode" = runtime ]; then
      echo "install-deps.sh: $os_id $os_version is not supported (Debian 12 or Ubuntu 24.04)" >&2
      exit 2
    fi
    echo "install-deps.sh: warning: $os_id $os_version is not Debian 12 or Ubuntu 24.04; trying anyway" >&2
    runtime_pkgs=() ;;
esac

case "$mode" in
  runtime) wanted=("${runtime_pkgs[@]}") ;;
  build) wanted=("${build_pkgs[@]}") ;;
  all) wanted=("${build_pkgs[@]}" "${test_pkgs[@]}" "${image_test_pkgs[@]}") ;;
esac

if [ "${#not_packaged[@]}" -gt 0 ]; then
  kept=()
  for pkg in "${wanted[@]}"; do
    [[ " ${not_packaged[*]} " == *" $pkg "* ]] || kept+=("$pkg")
  done
  if [ "${#kept[@]}" -ne "${#wanted[@]}" ]; then
    echo "install-deps: $os_id $os_version does not package ${not_packaged[*]}; the golden tests and" \
      "tools/ need PyTorch from pip there (python3 -m venv --system-site-packages .venv &&" \
      ".venv/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu, then put .venv/bin first on PATH)"
  fi
  wanted=("${kept[@]}")
fi

missing=()
for pkg in "${wanted[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# The libblas.so.3 / liblapack.so.3 alternatives must point at OpenBLAS, not netlib's reference
# (installing libopenblas0-pthread sets them in auto mode, priority 100; a manual choice made
# earlier would keep the reference). One left on another optimised BLAS (MKL, BLIS) is kept.
# tools/torch_blas.py then checks, in the process, which BLAS torch actually loaded.
check_blas_alternatives() {
  local name current openblas fixed=0
  for name in $(update-alternatives --get-selections 2>/dev/null |
      awk '$1 ~ /^lib(blas|lapack)\.so\.3-/ {print $1}'); do
    current=$(readlink -f "/etc/alternatives/$name" 2>/dev/null || true)
    case "$current" in
      */openblas*) continue ;;
      */blas/*|*/lapack/*|"") ;;  # netlib's reference (or a dangling link): fix it
      *) echo "install-deps: $name points at $current (not OpenBLAS); leaving it"; continue ;;
    esac
    openblas=$(update-alternatives --list "$name" 2>/dev/null | grep -m1 '/openblas-pthread/' || true)
    if [ -z "$openblas" ]; then
      echo "install-deps: warning: $name points at the reference ${current:-(nothing)} and no OpenBLAS" \
        "alternative is registered (is libopenblas0-pthread installed?)" >&2
      continue
    fi
    echo "install-deps: $name pointed at the reference $current; setting it to $openblas"
    if update-alternatives --query "$name" | grep -q '^Best: .*/openblas'; then
      $SUDO update-alternatives --quiet --auto "$name"  # back to auto mode, where OpenBLAS wins
    else
      $SUDO update-alternatives --quiet --set "$name" "$openblas"
    fi
    fixed=1
  done
  if [ "$fixed" = 1 ]; then
    echo "install-deps: PyTorch and numpy now run on OpenBLAS (check: /usr/bin/python3 tools/torch_blas.py)"
  fi
}

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [[ " ${wanted[*]} " == *" libopenblas0-pthread "* ]]; then
  check_blas_alternatives
fi
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-deps: all ${#wanted[@]} packages present"
fi

# CUTLASS's headers from the pinned nvidia-cutlass wheel (PyPI: Debian has no CUTLASS), where a
# CUDA build can use them (nvcc installed): the CUDA engine's sm_90a GELU GEMMs (issue 48). Into
# the cache outside the checkout; a failure (no network) only leaves those kernels out.
if [ "$mode" = all ] && { command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; }; then
  if include=$("$(dirname "$0")/cutlass-headers.sh" 2>/dev/null); then
    echo "install-deps: CUTLASS headers in $include"
  else
    echo "install-deps: warning: could not fetch CUTLASS's headers (deploy/cutlass-headers.sh);" \
      "the CUDA engine builds without its CUTLASS GEMMs" >&2
  fi
fi

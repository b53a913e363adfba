#!/usr/bin/env bash
# The GPU check of the CUDA engine (issues 4 and 13): build it, run its GPU tests, measure it
# against PyTorch and an SDPA encoder, then sanitize and profile it, in one run of at most
# 420 s on one H200 from a fresh checkout, build included.
#
#   bash tests/gpu/gpu-check.sh [REPORT_PATH]
#
# Run from a checkout on the lent machine (CUDA toolkit, CMake, a compiler and PyTorch;
# no package network), with .deps/ carried (deploy/carry-gpu-deps.sh; tests/gpu/README.md).
# Writes ONE markdown report: REPORT_PATH, else $OUT/gpu-report.md when OUT is set, else
# gpu-report.md; with OUT set, the logs too ($OUT/gpu-check-logs.tar.gz).
#
# The stages run in the order of what their figures are worth, because the run may be the
# only one: build (only the targets used), the GPU tests, base-long parity, the engine
# benchmarks and their --profile, the PyTorch and SDPA baselines, torch.compile, then
# compute-sanitizer and ncu. Each runs under `timeout` within what is left of the budget,
# and records ok / failed / timeout / skipped (with the reason); the script goes on, and
# exits 0 whenever a report was written. Without a GPU it finishes in seconds.
#
# Environment knobs (defaults in brackets):
#   GPU_CHECK_BUDGET_S [420]      seconds for the whole script, report included
#   GPU_CHECK_BENCH_SECONDS [3]   --seconds of each benchmark
#   GPU_CHECK_CUDA_ARCH [90]      CMAKE_CUDA_ARCHITECTURES
#   GPU_CHECK_BUILD_DIR [build-gpu]
#   GPU_CHECK_WORK [/tmp/fastformer-gpu-check]   logs, results and the models (kept and
#                                 reused by a later run on the same machine)
#   GPU_CHECK_PYTHON              the python3 that imports torch [the first of python3,
#                                 /usr/bin/python3, python that does]; `none`: no PyTorch stages
#   GPU_CHECK_CPU_SMOKE [0]       1: with no GPU, run the Python and bench stages on the
#                                 CPU with a tiny model, to test this script and the report
#   GPU_CHECK_BUILD [0]           1: configure and build even with no GPU
# Where cuBLASLt is looked for (the header for the build, the library for the run):
#   FASTFORMER_CUBLASLT_INCLUDE_DIR, FASTFORMER_CUBLASLT_LIBRARY   taken as they are when set
#   GPU_CHECK_CUDA_ROOTS          toolkit roots, colon-separated [nvcc's, $CUDA_HOME,
#                                 $CUDA_PATH, /usr/local/cuda, /usr/local/cuda-*, /usr; and
#                                 the ldconfig cache for the library]
#   GPU_CHECK_SITE_PACKAGES       Python site-packages dirs, colon-separated [each python3's,
#                                 asked]: their nvidia/cu13, nvidia/cublas and nvidia/cu12
set -u
set -o pipefail
ulimit -c 0 2>/dev/null || true

START_DIR=$PWD
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1

if [ -n "${1:-}" ]; then
  REPORT=$1
elif [ -n "${OUT:-}" ]; then
  REPORT=$OUT/gpu-report.md
else
  REPORT=gpu-report.md
fi
case "$REPORT" in /*) ;; *) REPORT=$START_DIR/$REPORT ;; esac

BUDGET=${GPU_CHECK_BUDGET_S:-420}
RESERVE=10  # seconds kept for the report and the log archive
BENCH_SECONDS=${GPU_CHECK_BENCH_SECONDS:-3}
CUDA_ARCH=${GPU_CHECK_CUDA_ARCH:-90}
BUILD_DIR=${GPU_CHECK_BUILD_DIR:-build-gpu}
WORK=${GPU_CHECK_WORK:-/tmp/fastformer-gpu-check}
SMOKE=${GPU_CHECK_CPU_SMOKE:-0}
NPROC=$(nproc 2>/dev/null || echo 4)
T0=$SECONDS

RUN=$WORK/run-$(date -u +%Y%m%dT%H%M%SZ)-$$
MODELS=$WORK/models
mkdir -p "$RUN" "$MODELS" || { echo "gpu-check: cannot create $RUN" >&2; exit 1; }
: >"$RUN/stages.tsv"
: >"$RUN/benches.tsv"

log() { printf '[gpu-check %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
clean() { printf '%s' "$*" | tr '\t\n' '  ' | cut -c1-400; }
# stages.tsv is append-only (the model stages write to it from the background): a later
# record of the same ID (a verdict read from the stage's output) replaces the earlier one.
record() {  # record ID TITLE STATUS RC SECONDS NOTE
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$(clean "$2")" "$3" "$4" "$5" "$(clean "$6")" >>"$RUN/stages.tsv"
}
skip() {  # skip ID TITLE REASON
  record "$1" "$2" skipped "" 0 "$3"
  log "[$1] skipped: $3"
}
has() { command -v "$1" >/dev/null 2>&1; }
TIMEOUT=""
has timeout && TIMEOUT=timeout

# run_stage ID TITLE LIMIT_S CMD...: stdout to $RUN/ID.out, stderr to $RUN/ID.err. The limit
# shrinks to what is left of the budget; returns the command's status. STAGE_TITLE,
# STAGE_RC and STAGE_SECONDS keep the last stage's, for a verdict that amends it.
run_stage() {
  local id=$1 title=$2 cap=$3
  shift 3
  STAGE_TITLE=$title
  STAGE_SECONDS=0
  STAGE_RC=125
  local left=$((BUDGET - RESERVE - (SECONDS - T0)))
  if [ "$left" -lt 5 ]; then
    skip "$id" "$title" "time budget spent (GPU_CHECK_BUDGET_S=$BUDGET)"
    return 125
  fi
  local lim=$cap
  [ "$lim" -le "$left" ] || lim=$left
  local s=$SECONDS rc
  log "[$id] $title (limit ${lim}s)"
  if [ -n "$TIMEOUT" ]; then
    "$TIMEOUT" -k 5 "$lim" "$@" >"$RUN/$id.out" 2>"$RUN/$id.err" </dev/null
  else
    "$@" >"$RUN/$id.out" 2>"$RUN/$id.err" </dev/null
  fi
  rc=$?
  local d=$((SECONDS - s))
  STAGE_RC=$rc
  STAGE_SECONDS=$d
  case "$rc" in
    0) record "$id" "$title" ok 0 "$d" "" ;;
    124 | 137) record "$id" "$title" timeout "$rc" "$d" "stopped after ${lim}s (exit $rc: time limit, or killed for memory)" ;;
    *) record "$id" "$title" failed "$rc" "$d" "exit $rc" ;;
  esac
  if [ "$rc" -eq 0 ]; then
    log "[$id] ok in ${d}s"
  else
    log "[$id] FAILED (exit $rc) in ${d}s; last lines:"
    tail -n 4 "$RUN/$id.err" "$RUN/$id.out" 2>/dev/null | sed 's/^/    /'
  fi
  return "$rc"
}
amend() {  # amend ID STATUS NOTE: the verdict on the stage just run, from its output
  record "$1" "$STAGE_TITLE" "$2" "$STAGE_RC" "$STAGE_SECONDS" "$3"
  log "[$1] $2: $3"
}

# ---- what this machine has ----------------------------------------------------------------
PY=""  # a python3 that imports torch
PY_WHY="no python3 that imports torch"
if [ "${GPU_CHECK_PYTHON:-}" = none ]; then
  PY_WHY="no PyTorch stages (GPU_CHECK_PYTHON=none)"
elif [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  if "$GPU_CHECK_PYTHON" -c 'import torch' >/dev/null 2>&1; then PY=$GPU_CHECK_PYTHON; else
    PY_WHY="GPU_CHECK_PYTHON=$GPU_CHECK_PYTHON does not import torch"
  fi
else
  for p in python3 /usr/bin/python3 python; do
    if has "$p" && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$p; break; fi
  done
fi
PYR=""  # any python3, for the report
for p in python3 /usr/bin/python3 python; do
  if has "$p" && "$p" -c 'import json, csv' >/dev/null 2>&1; then PYR=$p; break; fi
done

GPU_OK=0
if ! has nvidia-smi; then
  GPU_WHY="no GPU: nvidia-smi not found (no NVIDIA driver on this machine)"
elif ! ${TIMEOUT:+$TIMEOUT 30} nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  GPU_WHY="no GPU: nvidia-smi lists none ($(${TIMEOUT:+$TIMEOUT 30} nvidia-smi -L 2>&1 | head -1 | cut -c1-120))"
else
  GPU_OK=1
  GPU_WHY=""
fi

NVCC=""
for c in "${CUDACXX:-}" "$(command -v nvcc 2>/dev/null)" /usr/local/cuda/bin/nvcc \
  $(ls -d /usr/local/cuda-*/bin/nvcc 2>/dev/null | sort -V | tail -1) /opt/cuda/bin/nvcc; do
  if [ -n "$c" ] && [ -x "$c" ]; then NVCC=$c; break; fi
done
CUDA_BIN=""
NVCC_MAJOR=""
if [ -n "$NVCC" ]; then
  CUDA_BIN=$(dirname "$NVCC")
  NVCC_MAJOR=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -1)
  case ":$PATH:" in *":$CUDA_BIN:"*) ;; *) PATH=$PATH:$CUDA_BIN ;; esac
  export PATH
fi
find_tool() {  # find_tool NAME: on PATH, beside nvcc, or under /opt/nvidia
  if has "$1"; then command -v "$1"; return; fi
  local c
  for c in "${CUDA_BIN:-/nonexistent}/$1" /usr/local/cuda/bin/$1 $(ls -d /opt/nvidia/nsight-compute/*/"$1" 2>/dev/null | sort -V | tail -1); do
    [ -x "$c" ] && { echo "$c"; return; }
  done
}
SANITIZER=$(find_tool compute-sanitizer)
NCU=$(find_tool ncu)

# ---- cuBLASLt: the header for the build, the library for the run --------------------------
# The toolkit may have nvcc and no cuBLAS; cuBLAS then comes as the Python wheels beside
# PyTorch: nvidia-cublas / cuda-toolkit put cublasLt.h and libcublasLt.so.13 in
# site-packages/nvidia/cu13/{include,lib} (CUDA 13), nvidia-cublas-cu12 in nvidia/cublas/.
cublas_version_of_header() {  # DIR: MAJOR.MINOR.PATCH from DIR/cublas_api.h
  awk '/#define CUBLAS_VER_(MAJOR|MINOR|PATCH) / {v[$2] = $3}
       END {if (v["CUBLAS_VER_MAJOR"] != "") print v["CUBLAS_VER_MAJOR"] "." v["CUBLAS_VER_MINOR"] "." v["CUBLAS_VER_PATCH"]}' \
    "$1/cublas_api.h" 2>/dev/null
}
find_cublaslt() {
  local roots=() sites=() r s sub d
  if [ -n "${GPU_CHECK_CUDA_ROOTS+x}" ]; then
    IFS=: read -r -a roots <<<"$GPU_CHECK_CUDA_ROOTS"
  else
    [ -z "$CUDA_BIN" ] || roots+=("$(dirname "$CUDA_BIN")")
    roots+=(${CUDA_HOME:+"$CUDA_HOME"} ${CUDA_PATH:+"$CUDA_PATH"} /usr/local/cuda)
    local versioned=()
    mapfile -t versioned < <(ls -d /usr/local/cuda-* 2>/dev/null | sort -rV)
    roots+=("${versioned[@]}" /usr)
  fi
  if [ -n "${GPU_CHECK_SITE_PACKAGES+x}" ]; then
    IFS=: read -r -a sites <<<"$GPU_CHECK_SITE_PACKAGES"
  else
    local p
    for p in ${PY:+"$PY"} python3 /usr/bin/python3; do
      has "$p" || continue
      while IFS= read -r s; do [ -n "$s" ] && sites+=("$s"); done < <(${TIMEOUT:+$TIMEOUT 20} "$p" -c '
import site, sys
dirs = list(getattr(site, "getsitepackages", lambda: [])()) + [site.getusersitepackages()]
try:
    import nvidia, os
    dirs += [os.path.dirname(d) for d in nvidia.__path__]
except Exception:
    pass
print("\n".join(d for d in dirs if d))' 2>/dev/null)
    done
  fi
  local incs=() libs=()
  for r in "${roots[@]}"; do
    [ -n "$r" ] || continue
    incs+=("$r/include" "$r/targets/x86_64-linux/include" "$r/targets/sbsa-linux/include")
    libs+=("$r/lib64" "$r/lib" "$r/targets/x86_64-linux/lib" "$r/targets/sbsa-linux/lib" "$r/lib/x86_64-linux-gnu")
  done
  # The wheels of nvcc's CUDA major first: a cuBLAS header of another major does not build
  # against the toolkit's runtime headers.
  local subs=(nvidia/cu13 nvidia/cublas nvidia/cu12)
  [ "$NVCC_MAJOR" != 12 ] || subs=(nvidia/cublas nvidia/cu12 nvidia/cu13)
  for s in "${sites[@]}"; do
    for sub in "${subs[@]}"; do
      incs+=("$s/$sub/include")
      libs+=("$s/$sub/lib")
    done
  done
  # The searched dirs, each once, in order, for the report.
  printf '%s\n' "${incs[@]}" | awk '!seen[$0]++' >"$RUN/cublaslt-include-dirs.txt"
  printf '%s\n' "${libs[@]}" | awk '!seen[$0]++' >"$RUN/cublaslt-library-dirs.txt"

  CUBLASLT_INC=${FASTFORMER_CUBLASLT_INCLUDE_DIR:-}
  if [ -z "$CUBLASLT_INC" ]; then
    while IFS= read -r d; do
      if [ -f "$d/cublasLt.h" ]; then CUBLASLT_INC=$d; break; fi
    done <"$RUN/cublaslt-include-dirs.txt"
  fi
  CUBLASLT_INC_VERSION=""
  [ -z "$CUBLASLT_INC" ] || CUBLASLT_INC_VERSION=$(cublas_version_of_header "$CUBLASLT_INC")
  local major=${CUBLASLT_INC_VERSION%%.*}
  # The library of the header's major version (the ABI it was built against), preferably
  # from the header's own installation: the header's sibling lib dirs come first.
  CUBLASLT_LIB=${FASTFORMER_CUBLASLT_LIBRARY:-}
  if [ -z "$CUBLASLT_LIB" ]; then
    local base=${CUBLASLT_INC%/include} names=() n
    [ -z "$major" ] || names+=("libcublasLt.so.$major")
    names+=(libcublasLt.so)
    for n in "${names[@]}"; do
      while IFS= read -r d; do
        if [ -f "$d/$n" ]; then CUBLASLT_LIB=$d/$n; break 2; fi
      done < <(
        if [ -n "$CUBLASLT_INC" ]; then grep -F -x -e "$base/lib64" -e "$base/lib" "$RUN/cublaslt-library-dirs.txt"; fi
        cat "$RUN/cublaslt-library-dirs.txt")
    done
    if [ -z "$CUBLASLT_LIB" ] && [ -z "${GPU_CHECK_CUDA_ROOTS+x}" ] && has ldconfig; then
      CUBLASLT_LIB=$(ldconfig -p 2>/dev/null | awk -v n="libcublasLt.so${major:+.$major}" '$1 == n {print $NF; exit}')
      [ -z "$CUBLASLT_LIB" ] || echo "(the ldconfig cache)" >>"$RUN/cublaslt-library-dirs.txt"
    fi
  fi
  CUBLASLT_LIB_VERSION=""
  CUBLASLT_LIB_REAL=""
  if [ -n "$CUBLASLT_LIB" ]; then
    CUBLASLT_LIB_REAL=$(readlink -f "$CUBLASLT_LIB" 2>/dev/null || echo "$CUBLASLT_LIB")
    # Loads it, as the engine will: a library that cannot load says so here.
    [ -z "$PYR" ] || CUBLASLT_LIB_VERSION=$(${TIMEOUT:+$TIMEOUT 30} "$PYR" -c '
import ctypes, sys
try:
    v = ctypes.CDLL(sys.argv[1]).cublasLtGetVersion()
    print(f"{v // 10000}.{v // 100 % 100}.{v % 100}")
except Exception as e:
    print("cannot load: " + str(e).replace("\n", " ")[:200])' "$CUBLASLT_LIB" 2>&1 | tail -1)
  fi
}
find_cublaslt
where() {  # where DIR: which installation DIR belongs to
  case "$1" in
    */site-packages/* | */dist-packages/*) echo "Python wheel" ;;
    "") echo "" ;;
    *) echo "CUDA toolkit / system" ;;
  esac
}
{
  echo "include_dir=$CUBLASLT_INC"
  echo "include_version=$CUBLASLT_INC_VERSION"
  echo "include_from=$(where "$CUBLASLT_INC")${FASTFORMER_CUBLASLT_INCLUDE_DIR:+ (FASTFORMER_CUBLASLT_INCLUDE_DIR)}"
  echo "library=$CUBLASLT_LIB"
  echo "library_file=$CUBLASLT_LIB_REAL"
  echo "library_version=$CUBLASLT_LIB_VERSION"
  echo "library_from=$(where "$CUBLASLT_LIB")${FASTFORMER_CUBLASLT_LIBRARY:+ (FASTFORMER_CUBLASLT_LIBRARY)}"
} >"$RUN/cublaslt.env"
CUBLASLT_TITLE="find cuBLASLt (header for the build, library for the run)"
CUBLASLT_LOOKED="looked in $(grep -c . "$RUN/cublaslt-include-dirs.txt") include dirs, $(grep -c . "$RUN/cublaslt-library-dirs.txt") library dirs (report: cuBLASLt)"
if [ -z "$CUBLASLT_INC" ] && [ -z "$CUBLASLT_LIB" ]; then
  CUBLASLT_WHY="cuBLASLt not found: no cublasLt.h and no libcublasLt"
elif [ -z "$CUBLASLT_INC" ]; then
  CUBLASLT_WHY="cuBLASLt header not found (no cublasLt.h; the library is $CUBLASLT_LIB)"
elif [ -z "$CUBLASLT_LIB" ]; then
  CUBLASLT_WHY="cuBLASLt library not found (no libcublasLt.so${CUBLASLT_INC_VERSION:+.${CUBLASLT_INC_VERSION%%.*}}; the header is $CUBLASLT_INC)"
elif [ -n "$CUBLASLT_LIB_VERSION" ] && [ "${CUBLASLT_LIB_VERSION#cannot load}" != "$CUBLASLT_LIB_VERSION" ]; then
  CUBLASLT_WHY="cuBLASLt library $CUBLASLT_LIB $CUBLASLT_LIB_VERSION"
else
  CUBLASLT_WHY=""
fi
CUBLASLT_NOTE=""
if [ -n "$NVCC_MAJOR" ] && [ -n "$CUBLASLT_INC_VERSION" ] && [ "${CUBLASLT_INC_VERSION%%.*}" != "$NVCC_MAJOR" ]; then
  CUBLASLT_NOTE="; cuBLAS ${CUBLASLT_INC_VERSION%%.*} but nvcc is CUDA $NVCC_MAJOR: the build may fail on mixed headers"
fi
if [ -z "$CUBLASLT_WHY" ]; then
  record cublaslt "$CUBLASLT_TITLE" ok 0 0 "header $CUBLASLT_INC ($CUBLASLT_INC_VERSION); library $CUBLASLT_LIB_REAL (${CUBLASLT_LIB_VERSION:-version not read})$CUBLASLT_NOTE"
else
  record cublaslt "$CUBLASLT_TITLE" failed "" 0 "$CUBLASLT_WHY; $CUBLASLT_LOOKED$CUBLASLT_NOTE"
fi

DEPS=$ROOT/.deps
if [ -d "$DEPS" ]; then
  DEPS_LD=$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  DEPS_LD=${LD_LIBRARY_PATH:-}
fi
# Only our binaries get .deps/lib and the cuBLASLt found: Python and PyTorch keep the
# machine's own libraries. FASTFORMER_CUBLASLT_LIBRARY makes the engine open exactly it.
WD=(env "LD_LIBRARY_PATH=$DEPS_LD")
[ -z "$CUBLASLT_LIB" ] || WD+=("FASTFORMER_CUBLASLT_LIBRARY=$CUBLASLT_LIB")

MODE=gpu
if [ "$GPU_OK" = 0 ]; then
  if [ "$SMOKE" = 1 ]; then MODE=cpu-smoke; else MODE=no-gpu; fi
fi
[ "$MODE" != cpu-smoke ] || BENCH_SECONDS=${GPU_CHECK_BENCH_SECONDS:-0.3}

{
  echo "mode=$MODE"
  echo "gpu_why=$GPU_WHY"
  echo "budget_s=$BUDGET"
  echo "bench_seconds=$BENCH_SECONDS"
  echo "cuda_arch=$CUDA_ARCH"
  echo "build_dir=$BUILD_DIR"
  echo "started=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "report=$REPORT"
  echo "run_dir=$RUN"
} >"$RUN/meta.env"

{
  echo "host: $(uname -n) $(uname -srm)"
  [ -r /etc/os-release ] && echo "os: $(. /etc/os-release && echo "${PRETTY_NAME:-?}")"
  echo "cpus: $NPROC; memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo 2>/dev/null)"
  if [ -d .git ] || [ -f .git ] && has git; then
    echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  else
    echo "git: no .git in this copy of the tree"
  fi
  echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo missing)"
  echo "ninja: $(ninja --version 2>/dev/null || echo missing)"
  echo "c++: $(c++ --version 2>/dev/null | head -1 || echo missing)"
  echo "nvcc: ${NVCC:-missing} $( [ -n "$NVCC" ] && "$NVCC" --version 2>/dev/null | grep -i release | sed 's/.*release/release/')"
  echo "cuBLASLt: header ${CUBLASLT_INC:-not found} ${CUBLASLT_INC_VERSION}; library ${CUBLASLT_LIB_REAL:-not found} ${CUBLASLT_LIB_VERSION}"
  echo "compute-sanitizer: ${SANITIZER:-missing}"
  echo "ncu: ${NCU:-missing}"
  if [ -n "$PY" ]; then
    echo "python: $PY $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  else
    echo "python: $PY_WHY"
  fi
  if [ -f "$DEPS/MANIFEST.txt" ]; then
    sed -n 's/^# \(.deps: written.*\)/\1/p; s/^# \(from .*\)/\1/p' "$DEPS/MANIFEST.txt" | tr '\n' ' '; echo
  else
    echo ".deps: none carried"
  fi
} >"$RUN/env.txt" 2>&1
log "mode $MODE; budget ${BUDGET}s; report $REPORT; logs $RUN"
[ -z "$GPU_WHY" ] || log "$GPU_WHY"
log "cuBLASLt: ${CUBLASLT_WHY:-header $CUBLASLT_INC ($CUBLASLT_INC_VERSION), library $CUBLASLT_LIB_REAL (${CUBLASLT_LIB_VERSION:-?})}"

# ---- build --------------------------------------------------------------------------------
if has nvidia-smi; then
  run_stage nvidia-smi "nvidia-smi" 30 nvidia-smi
  ${TIMEOUT:+$TIMEOUT 30} nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.memory,power.limit \
    --format=csv >"$RUN/gpu-query.csv" 2>/dev/null || true
else
  skip nvidia-smi "nvidia-smi" "$GPU_WHY"
fi

if [ -f "$DEPS/PACKED" ] || [ -f "$DEPS/LINKS" ]; then
  run_stage deps "unpack .deps (deploy/carry-gpu-deps.sh --unpack)" 60 bash deploy/carry-gpu-deps.sh --unpack
elif [ -d "$DEPS" ]; then
  skip deps "unpack .deps" "nothing packed in .deps"
else
  skip deps "unpack .deps" "no .deps/ carried: the build relies on the machine's own packages (run deploy/carry-gpu-deps.sh and carry .deps)"
fi

# The model, in the background while the engine builds (the C++ tests make their own).
make_model() {  # make_model PRESET
  local dir=$MODELS/$1
  if [ -f "$dir/.gpu-check-ok" ] && [ -f "$dir/model.safetensors" ]; then
    record "model-$1" "model $1 (make_demo_model.py --seed 1)" ok 0 0 "reused $dir"
    return 0
  fi
  rm -rf "$dir"
  run_stage "model-$1" "model $1 (make_demo_model.py --seed 1)" 180 \
    "$PY" tools/make_demo_model.py --preset "$1" --seed 1 --out "$dir" && touch "$dir/.gpu-check-ok"
}
case "$MODE" in
  gpu) PRESETS="base-long" ;;
  cpu-smoke) PRESETS="tiny" ;;
  *) PRESETS="" ;;
esac
MODELS_PID=""
if [ -z "$PRESETS" ]; then
  skip models "models (make_demo_model.py)" "$GPU_WHY"
elif [ -z "$PY" ]; then
  skip models "models (make_demo_model.py)" "$PY_WHY"
else
  (for p in $PRESETS; do make_model "$p"; done) &
  MODELS_PID=$!
fi

# Only what the stages run: the GPU tests, the benchmark and the CUDA plugin they open.
TARGETS=(fastformer_gpu_tests fastformer-bench fastformer_cuda_engine)
BUILT=0
BUILD_WHY=""
CONFIGURE_TITLE="configure ($BUILD_DIR, FASTFORMER_SERVER=OFF, FASTFORMER_CUDA=ON, sm_$CUDA_ARCH)"
BUILD_TITLE="build ${TARGETS[*]} ($BUILD_DIR, $NPROC jobs)"
if [ "$GPU_OK" = 0 ] && [ "${GPU_CHECK_BUILD:-0}" != 1 ]; then
  BUILD_WHY="$GPU_WHY; nothing would run what it builds (GPU_CHECK_BUILD=1 builds anyway)"
elif [ -z "$NVCC" ]; then
  BUILD_WHY="no CUDA compiler: nvcc not on PATH, nor in /usr/local/cuda/bin (set CUDACXX)"
elif [ -z "$CUBLASLT_INC" ]; then
  BUILD_WHY="no cublasLt.h found, which the CUDA engine needs to build (stage cublaslt; set FASTFORMER_CUBLASLT_INCLUDE_DIR)"
elif ! has cmake; then
  BUILD_WHY="no cmake"
fi
if [ -n "$BUILD_WHY" ]; then
  skip configure "$CONFIGURE_TITLE" "$BUILD_WHY"
  skip build "$BUILD_TITLE" "$BUILD_WHY"
else
  GEN=()
  has ninja && GEN=(-G Ninja)
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then  # a build dir of another generator is not reusable
    old=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")
    want=Ninja
    [ "${#GEN[@]}" -gt 0 ] || want="Unix Makefiles"
    [ "$old" = "$want" ] || rm -rf "$BUILD_DIR"
  fi
  if run_stage configure "$CONFIGURE_TITLE" 120 \
    "${WD[@]}" cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DFASTFORMER_SERVER=OFF -DFASTFORMER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$DEPS" \
    -DFASTFORMER_CUBLASLT_INCLUDE_DIR="$CUBLASLT_INC"; then
    run_stage build "$BUILD_TITLE" 300 \
      "${WD[@]}" cmake --build "$BUILD_DIR" --parallel "$NPROC" --target "${TARGETS[@]}" && BUILT=1
    [ "$BUILT" = 1 ] || BUILD_WHY="the build did not succeed (stage build)"
  else
    BUILD_WHY="configure did not succeed (stage configure)"
    skip build "$BUILD_TITLE" "$BUILD_WHY"
  fi
fi

# ---- the GPU tests ------------------------------------------------------------------------
# report.py --verdict reads what a stage's exit status does not say. A test that skips itself
# (GTEST_SKIP: no usable GPU) is not a pass: with a GPU present it fails the stage, with the
# test's own reason. A sanitizer or ncu that this machine refuses is skipped (below).
verdict() {  # verdict ID KIND [FILE...]: amends stage ID (just run, not timed out) from its output
  [ -n "$PYR" ] || return 0
  case "$STAGE_RC" in 124 | 125 | 137) return 0 ;; esac
  local id=$1 kind=$2 v
  shift 2
  v=$("$PYR" tests/gpu/report.py --verdict "$kind" "$RUN/$id.out" "$RUN/$id.err" "$@" --gpu "$GPU_OK" 2>&1 | tail -1)
  case "$v" in
    keep) ;;
    failed$'\t'* | skipped$'\t'*) amend "$id" "${v%%$'\t'*}" "${v#*$'\t'}" ;;
    *) amend "$id" failed "no verdict from report.py: $v" ;;
  esac
}
GPU_TESTS=$BUILD_DIR/bin/fastformer_gpu_tests
BASE_LONG_TITLE="base-long parity: fastformer_gpu_tests --gtest_filter=*BaseLong* (each dtype vs the CPU engine)"
if [ "$GPU_OK" = 0 ]; then
  skip ctest-gpu "ctest -L gpu" "$GPU_WHY"
  skip parity-base-long "$BASE_LONG_TITLE" "$GPU_WHY"
elif [ "$BUILT" = 0 ]; then
  skip ctest-gpu "ctest -L gpu" "$BUILD_WHY"
  skip parity-base-long "$BASE_LONG_TITLE" "$BUILD_WHY"
else
  # -V: a skipped test's reason is in its output. The base-long tests run next, on their own.
  run_stage ctest-gpu "ctest --test-dir $BUILD_DIR -L gpu -E BaseLong" 120 \
    "${WD[@]}" ctest --test-dir "$BUILD_DIR" -L gpu -E BaseLong -V --no-tests=error -j 4 --timeout 100
  verdict ctest-gpu ctest
  run_stage parity-base-long "$BASE_LONG_TITLE" 90 "${WD[@]}" "$GPU_TESTS" '--gtest_filter=*BaseLong*'
  verdict parity-base-long gtest
fi

if [ -n "$MODELS_PID" ]; then
  log "waiting for the model"
  wait "$MODELS_PID"
fi

# ---- benchmarks ---------------------------------------------------------------------------
# id|engine|model|dtype|lengths|batch_tokens|role, in the order they run, in three groups:
# the engine (ours; ours-profile adds --profile), the baselines, then torch.compile.
# Roles name what the targets and ratios read (report.py).
if [ "$MODE" = cpu-smoke ]; then
  BACKEND=cpu
  DEVICE=cpu
  MATRIX="ours-short|ours|tiny|float32|fixed:64|2048|short
ours-long|ours|tiny|float32|fixed:512|2048|long
prof-short|ours-profile|tiny|float32|fixed:64|2048|profile-short
prof-long|ours-profile|tiny|float32|fixed:512|2048|profile-long
ours-mix-fp32|ours|tiny|float32|uniform:16:256|2048|mix-ref
ours-seq8192|ours|tiny|float32|fixed:256|2048|seq8192
torch-eager|pytorch|tiny|float32|uniform:16:256|2048|ref
sdpa-8192|sdpa|tiny|float32|fixed:256|2048|sdpa8192
sdpa-512|sdpa|tiny|float32|fixed:64|2048|sdpa512
torch-compile|pytorch-compile|tiny|float32|uniform:16:256|2048|ref-compile"
else
  BACKEND=cuda
  DEVICE=cuda
  MATRIX="ours-bl-bf16-fixed512|ours|base-long|bfloat16|fixed:512|65536|short
ours-bl-bf16-fixed65536|ours|base-long|bfloat16|fixed:65536|65536|long
prof-bl-bf16-fixed512|ours-profile|base-long|bfloat16|fixed:512|65536|profile-short
prof-bl-bf16-fixed65536|ours-profile|base-long|bfloat16|fixed:65536|65536|profile-long
ours-bl-bf16-mix|ours|base-long|bfloat16|uniform:64:4096|65536|mix-ref
ours-bl-bf16-fixed8192|ours|base-long|bfloat16|fixed:8192|65536|seq8192
torch-eager|pytorch|base-long|bfloat16|uniform:64:4096|65536|ref
sdpa-8192|sdpa|base-long|bfloat16|fixed:8192|65536|sdpa8192
sdpa-512|sdpa|base-long|bfloat16|fixed:512|65536|sdpa512
torch-compile|pytorch-compile|base-long|bfloat16|uniform:64:4096|65536|ref-compile"
fi

BENCH_BIN=$BUILD_DIR/bin/fastformer-bench
if [ "$MODE" = cpu-smoke ] && [ ! -x "$BENCH_BIN" ] && [ -x build/bin/fastformer-bench ]; then
  BENCH_BIN=build/bin/fastformer-bench  # the CPU engine of a plain `make build`
fi
PROFILE_WHY=""
if [ -x "$BENCH_BIN" ]; then  # --profile is newer than some trees this script may run in
  if ! bench_help=$("${WD[@]}" "$BENCH_BIN" --help 2>&1); then
    PROFILE_WHY="fastformer-bench --help failed: $(head -n 1 <<<"$bench_help")"
  elif ! grep -q -- '--profile' <<<"$bench_help"; then
    PROFILE_WHY="this fastformer-bench has no --profile (its --help does not list it)"
  fi
fi
printf '%s\n' "$MATRIX" >"$RUN/benches.tsv"

if [ "$MODE" = no-gpu ]; then
  skip copy-bandwidth "device-to-device copy bandwidth (1 GiB)" "$GPU_WHY"
elif [ -z "$PY" ]; then
  skip copy-bandwidth "device-to-device copy bandwidth (1 GiB)" "$PY_WHY"
elif [ "$MODE" = cpu-smoke ]; then
  run_stage copy-bandwidth "copy bandwidth (CPU smoke, 64 MiB)" 60 \
    "$PY" tests/gpu/copy_bandwidth.py --device cpu --bytes 67108864 --repeats 3 --warmup 1
else
  run_stage copy-bandwidth "device-to-device copy bandwidth (1 GiB, CUDA events)" 30 \
    "$PY" tests/gpu/copy_bandwidth.py --device cuda --bytes 1073741824 --repeats 20
fi

bench_stage() {  # bench_stage ID ENGINE MODEL DTYPE LENGTHS BATCH_TOKENS
  local id=$1 engine=$2 model=$3 dtype=$4 lengths=$5 bt=$6
  local mdir=$MODELS/$model
  local title="$engine $model $dtype $lengths @$bt"
  if [ "$MODE" = no-gpu ]; then skip "$id" "$title" "$GPU_WHY"; return; fi
  if [ -z "$PY" ]; then skip "$id" "$title" "no model: $PY_WHY"; return; fi
  if [ ! -f "$mdir/.gpu-check-ok" ]; then skip "$id" "$title" "model $model missing (see stage model-$model)"; return; fi
  case "$engine" in
    ours | ours-profile)
      if [ ! -x "$BENCH_BIN" ]; then skip "$id" "$title" "no $BENCH_BIN: ${BUILD_WHY:-see stage build}"; return; fi
      local extra=() secs=$BENCH_SECONDS
      if [ "$engine" = ours-profile ]; then
        if [ -n "$PROFILE_WHY" ]; then skip "$id" "$title --profile" "$PROFILE_WHY"; return; fi
        extra=(--profile)
        secs=1  # the profile is a pass of its own, after the timed run
      fi
      run_stage "$id" "fastformer-bench --backend $BACKEND${extra[*]:+ ${extra[*]}}, $model $dtype $lengths @$bt" 60 \
        "${WD[@]}" "$BENCH_BIN" --model-dir "$mdir" --backend "$BACKEND" --dtype "$dtype" \
        --lengths "$lengths" --batch-tokens "$bt" --seconds "$secs" --json "${extra[@]}"
      ;;
    pytorch | pytorch-compile)
      local extra=() cap=60
      if [ "$engine" = pytorch-compile ]; then extra=(--compile); cap=150; fi
      run_stage "$id" "bench_pytorch.py --device $DEVICE${extra[*]:+ ${extra[*]}}, $model $dtype $lengths @$bt" "$cap" \
        "$PY" tools/bench_pytorch.py --model-dir "$mdir" --device "$DEVICE" --dtype "$dtype" \
        --lengths "$lengths" --batch-tokens "$bt" --seconds "$BENCH_SECONDS" --threads "$NPROC" \
        --json "${extra[@]}"
      ;;
    sdpa)
      run_stage "$id" "bench_sdpa.py --device $DEVICE, shape of $model, $dtype ${lengths#fixed:} tokens/seq @$bt" 45 \
        "$PY" tools/bench_sdpa.py --model-dir "$mdir" --device "$DEVICE" --dtype "$dtype" \
        --tokens-per-sequence "${lengths#fixed:}" --batch-tokens "$bt" --seconds "$BENCH_SECONDS" \
        --threads "$NPROC" --json
      ;;
  esac
}

run_matrix() {  # run_matrix ENGINE_REGEX
  local id engine model dtype lengths bt
  while IFS="|" read -r id engine model dtype lengths bt _; do
    [ -n "$id" ] || continue
    [[ "$engine" =~ $1 ]] || continue
    bench_stage "$id" "$engine" "$model" "$dtype" "$lengths" "$bt"
  done <<<"$MATRIX"
}
run_matrix '^ours'
run_matrix '^(pytorch|sdpa)$'
run_matrix '^pytorch-compile$'

# ---- sanitizers and ncu -------------------------------------------------------------------
# Some container runtimes refuse these tools (no access to the performance counters, no
# debugger interface). A refusal is a skip with the tool's words (verdict sanitizer / ncu),
# not a failure of ours.
# cuBLAS's kernels are NVIDIA's, and slow under the sanitizers: ours are the ones checked.
CUBLAS_KERNELS='gemm|nvjet|xmma|cutlass|cublas|splitk|splitK'
sanitize() {  # sanitize ID TOOL
  local id=$1 tool=$2 title="compute-sanitizer $2 (cuBLAS kernels excluded), fastformer_gpu_tests --gtest_filter=*Small*"
  if [ "$GPU_OK" = 0 ]; then skip "$id" "$title" "$GPU_WHY"; return; fi
  if [ "$BUILT" = 0 ]; then skip "$id" "$title" "$BUILD_WHY"; return; fi
  if [ -z "$SANITIZER" ]; then skip "$id" "$title" "no compute-sanitizer (not on PATH, nor beside nvcc)"; return; fi
  local exclude=(--kernel-name-exclude "kns=gemm")
  "$SANITIZER" --help 2>&1 | grep -q 'regex' && exclude=(--kernel-name-exclude "regex=$CUBLAS_KERNELS")
  run_stage "$id" "$title" 90 "${WD[@]}" "$SANITIZER" --tool "$tool" --error-exitcode 99 --print-limit 40 \
    "${exclude[@]}" "$GPU_TESTS" '--gtest_filter=*Small*'
  [ "$STAGE_RC" = 0 ] || verdict "$id" sanitizer
}
sanitize memcheck memcheck
sanitize racecheck racecheck

# Per-kernel DRAM bytes and time of one base-long bf16 batch: the measured side of the
# 70%-of-copy target (--profile gives the engine's own view). The weight uploads (float32 in,
# converted on the device) come before the batch and are not profiled.
NCU_EXCLUDE=${GPU_CHECK_NCU_EXCLUDE:-from_float}
NCU_TITLE="ncu: per-kernel DRAM bytes and time, one base-long bf16 fixed:512 batch (kernels ^$NCU_EXCLUDE excluded)"
if [ "$GPU_OK" = 0 ]; then
  skip ncu "$NCU_TITLE" "$GPU_WHY"
elif [ -z "$NCU" ]; then
  skip ncu "$NCU_TITLE" "no ncu (Nsight Compute: not on PATH, beside nvcc, nor in /opt/nvidia)"
elif [ ! -x "$BENCH_BIN" ]; then
  skip ncu "$NCU_TITLE" "no fastformer-bench: ${BUILD_WHY:-see stage build}"
elif [ ! -f "$MODELS/base-long/.gpu-check-ok" ]; then
  skip ncu "$NCU_TITLE" "no base-long model (see stage model-base-long)"
else
  NCU_FILTER=()
  [ -z "$NCU_EXCLUDE" ] || NCU_FILTER=(--kernel-name-base function --kernel-name "regex:^(?!$NCU_EXCLUDE)")
  run_stage ncu "$NCU_TITLE" 90 \
    "${WD[@]}" "$NCU" --clock-control none --target-processes all --print-kernel-base function "${NCU_FILTER[@]}" \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base --launch-count 400 --log-file "$RUN/ncu.csv" \
    "$BENCH_BIN" --model-dir "$MODELS/base-long" --backend cuda --dtype bfloat16 \
    --lengths fixed:512 --batch-tokens 65536 --pool-batches 1 --warmup-batches 0 --seconds 0 --json
  verdict ncu ncu "$RUN/ncu.csv"
fi

# ---- report -------------------------------------------------------------------------------
echo "finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$RUN/meta.env"
echo "elapsed_s=$((SECONDS - T0))" >>"$RUN/meta.env"
mkdir -p "$(dirname "$REPORT")" 2>/dev/null
written=0
if [ -n "$PYR" ] && ${TIMEOUT:+$TIMEOUT 60} "$PYR" tests/gpu/report.py --run "$RUN" --out "$REPORT" \
  --summary "$RUN/summary.txt" >"$RUN/report.log" 2>&1; then
  written=1
else
  log "report.py failed; writing a plain report"
  tail -n 20 "$RUN/report.log" 2>/dev/null | sed 's/^/    /'
  {
    echo "# GPU check report (plain: tests/gpu/report.py failed)"
    echo
    echo "mode $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), ${GPU_WHY:-GPU present}"
    echo
    echo "cuBLASLt: ${CUBLASLT_WHY:-header $CUBLASLT_INC ($CUBLASLT_INC_VERSION), library $CUBLASLT_LIB_REAL ($CUBLASLT_LIB_VERSION)}"
    echo
    echo "| stage | status | rc | seconds | note |"
    echo "| --- | --- | --- | --- | --- |"
    awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $2, $3, $4, $5, $6}' "$RUN/stages.tsv"
    echo
    echo "## report.py"
    echo
    echo '```'
    tail -n 30 "$RUN/report.log" 2>/dev/null
    echo '```'
    for f in "$RUN"/*.out; do
      [ -s "$f" ] || continue
      echo
      echo "## $(basename "$f")"
      echo
      echo '```'
      tail -n 5 "$f"
      echo '```'
    done
  } >"$REPORT" && written=1
fi
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then
  tar -czf "$OUT/gpu-check-logs.tar.gz" -C "$WORK" "$(basename "$RUN")" 2>/dev/null || true
fi
[ -f "$RUN/summary.txt" ] && cat "$RUN/summary.txt"
log "done in $((SECONDS - T0))s of ${BUDGET}s; report: $REPORT; logs: $RUN"
[ "$written" = 1 ] || exit 1
exit 0

#!/usr/bin/env bash
# The GPU check of issue 4: build the CUDA engine, run its GPU tests and sanitizers, and
# measure it against PyTorch and an SDPA encoder, in one run of under 8 minutes on one H200.
#
#   bash tests/gpu/gpu-check.sh [REPORT_PATH]
#
# Run from a checkout on the lent machine (CUDA toolkit, CMake, a compiler and PyTorch;
# no package network), with .deps/ carried (deploy/carry-gpu-deps.sh; tests/gpu/README.md).
# Writes ONE markdown report: REPORT_PATH, else $OUT/gpu-report.md when OUT is set, else
# gpu-report.md; with OUT set, the logs too ($OUT/gpu-check-logs.tar.gz).
#
# Every stage runs under `timeout`, records ok / failed / timeout / skipped (with the
# reason) and the script goes on; it exits 0 whenever a report was written. Without a
# GPU it finishes in seconds, every GPU stage skipped with the reason.
#
# Environment knobs (defaults in brackets):
#   GPU_CHECK_BUDGET_S [450]      seconds for all stages together (the report follows)
#   GPU_CHECK_BENCH_SECONDS [3]   --seconds of each benchmark
#   GPU_CHECK_CUDA_ARCH [90]      CMAKE_CUDA_ARCHITECTURES
#   GPU_CHECK_BUILD_DIR [build-gpu]
#   GPU_CHECK_WORK [/tmp/fastformer-gpu-check]   logs, results and the models (kept and
#                                 reused by a later run on the same machine)
#   GPU_CHECK_CPU_SMOKE [0]       1: with no GPU, run the Python and bench stages on the
#                                 CPU with a tiny model, to test this script and the report
#   GPU_CHECK_BUILD [0]           1: configure and build even with no GPU
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

BUDGET=${GPU_CHECK_BUDGET_S:-450}
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
clean() { printf '%s' "$*" | tr '\t\n' '  ' | cut -c1-300; }
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

# run_stage ID TITLE LIMIT_S CMD...: stdout to $RUN/ID.out, stderr to $RUN/ID.err.
# The limit shrinks to what is left of the budget; returns the command's status.
run_stage() {
  local id=$1 title=$2 cap=$3
  shift 3
  local left=$((BUDGET - (SECONDS - T0)))
  if [ "$left" -lt 5 ]; then
    skip "$id" "$title" "time budget spent (GPU_CHECK_BUDGET_S=$BUDGET)"
    return 125
  fi
  local lim=$cap
  [ "$lim" -le "$left" ] || lim=$left
  local s=$SECONDS rc
  log "[$id] $title (limit ${lim}s)"
  if [ -n "$TIMEOUT" ]; then
    "$TIMEOUT" -k 10 "$lim" "$@" >"$RUN/$id.out" 2>"$RUN/$id.err" </dev/null
  else
    "$@" >"$RUN/$id.out" 2>"$RUN/$id.err" </dev/null
  fi
  rc=$?
  local d=$((SECONDS - s))
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

# ---- what this machine has ----------------------------------------------------------------
PY=""  # a python3 that imports torch
for p in python3 /usr/bin/python3 python; do
  if has "$p" && "$p" -c 'import torch' >/dev/null 2>&1; then PY=$p; break; fi
done
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
if [ -n "$NVCC" ]; then
  CUDA_BIN=$(dirname "$NVCC")
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

DEPS=$ROOT/.deps
if [ -d "$DEPS" ]; then
  DEPS_LD=$DEPS/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  DEPS_LD=${LD_LIBRARY_PATH:-}
fi
# Only our binaries get .deps/lib: Python and PyTorch keep the machine's own libraries.
WD=(env "LD_LIBRARY_PATH=$DEPS_LD")

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
  if [ -d .git ] && has git; then
    echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | grep -q . && echo '(with local changes)')"
  else
    echo "git: no .git in this copy of the tree"
  fi
  echo "cmake: $(cmake --version 2>/dev/null | head -1 || echo missing)"
  echo "ninja: $(ninja --version 2>/dev/null || echo missing)"
  echo "c++: $(c++ --version 2>/dev/null | head -1 || echo missing)"
  echo "nvcc: ${NVCC:-missing} $( [ -n "$NVCC" ] && "$NVCC" --version 2>/dev/null | grep -i release | sed 's/.*release/release/')"
  echo "compute-sanitizer: ${SANITIZER:-missing}"
  echo "ncu: ${NCU:-missing}"
  if [ -n "$PY" ]; then
    echo "python: $PY $("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' 2>&1 | tail -1)"
  else
    echo "python: no python3 that imports torch"
  fi
  if [ -f "$DEPS/MANIFEST.txt" ]; then
    sed -n 's/^# \(.deps: written.*\)/\1/p; s/^# \(from .*\)/\1/p' "$DEPS/MANIFEST.txt" | tr '\n' ' '; echo
  else
    echo ".deps: none carried"
  fi
} >"$RUN/env.txt" 2>&1
log "mode $MODE; report $REPORT; logs $RUN"
[ -z "$GPU_WHY" ] || log "$GPU_WHY"

# ---- stages -------------------------------------------------------------------------------
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

# Models, in the background while the engine builds.
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
  gpu) PRESETS="official base-long" ;;
  cpu-smoke) PRESETS="tiny" ;;
  *) PRESETS="" ;;
esac
MODELS_PID=""
if [ -z "$PRESETS" ]; then
  skip models "models (make_demo_model.py)" "$GPU_WHY"
elif [ -z "$PY" ]; then
  skip models "models (make_demo_model.py)" "no python3 that imports torch"
else
  (for p in $PRESETS; do make_model "$p"; done) &
  MODELS_PID=$!
fi

BUILT=0
if [ "$GPU_OK" = 0 ] && [ "${GPU_CHECK_BUILD:-0}" != 1 ]; then
  why="$GPU_WHY; nothing would run what it builds (GPU_CHECK_BUILD=1 builds anyway)"
  skip configure "configure ($BUILD_DIR, FASTFORMER_CUDA=ON, sm_$CUDA_ARCH)" "$why"
  skip build "build ($BUILD_DIR)" "$why"
elif [ -z "$NVCC" ]; then
  why="no CUDA compiler: nvcc not on PATH, nor in /usr/local/cuda/bin (set CUDACXX)"
  skip configure "configure ($BUILD_DIR, FASTFORMER_CUDA=ON, sm_$CUDA_ARCH)" "$why"
  skip build "build ($BUILD_DIR)" "$why"
elif ! has cmake; then
  skip configure "configure ($BUILD_DIR)" "no cmake"
  skip build "build ($BUILD_DIR)" "no cmake"
else
  GEN=()
  has ninja && GEN=(-G Ninja)
  if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then  # a build dir of another generator is not reusable
    old=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")
    want=Ninja
    [ "${#GEN[@]}" -gt 0 ] || want="Unix Makefiles"
    [ "$old" = "$want" ] || rm -rf "$BUILD_DIR"
  fi
  if run_stage configure "configure ($BUILD_DIR, FASTFORMER_SERVER=OFF, FASTFORMER_CUDA=ON, sm_$CUDA_ARCH)" 120 \
    "${WD[@]}" cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DFASTFORMER_SERVER=OFF -DFASTFORMER_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
    -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_PREFIX_PATH="$DEPS"; then
    run_stage build "build ($BUILD_DIR, $NPROC jobs)" 300 \
      "${WD[@]}" cmake --build "$BUILD_DIR" --parallel "$NPROC" && BUILT=1
  else
    skip build "build ($BUILD_DIR)" "configure failed"
  fi
fi

GPU_TESTS=""
[ "$BUILT" = 1 ] && GPU_TESTS=$(find "$BUILD_DIR" -name fastformer_gpu_tests -type f -perm -u+x 2>/dev/null | head -1)
if [ "$GPU_OK" = 0 ]; then
  skip ctest-gpu "ctest -L gpu" "$GPU_WHY"
  skip memcheck "compute-sanitizer memcheck" "$GPU_WHY"
  skip racecheck "compute-sanitizer racecheck" "$GPU_WHY"
elif [ "$BUILT" = 0 ]; then
  skip ctest-gpu "ctest -L gpu" "the build did not succeed"
  skip memcheck "compute-sanitizer memcheck" "the build did not succeed"
  skip racecheck "compute-sanitizer racecheck" "the build did not succeed"
else
  run_stage ctest-gpu "ctest --test-dir $BUILD_DIR -L gpu" 150 \
    "${WD[@]}" ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure --no-tests=error -j 4 --timeout 120
  if [ -z "$GPU_TESTS" ]; then
    skip memcheck "compute-sanitizer memcheck" "no fastformer_gpu_tests binary in $BUILD_DIR"
    skip racecheck "compute-sanitizer racecheck" "no fastformer_gpu_tests binary in $BUILD_DIR"
  elif [ -z "$SANITIZER" ]; then
    skip memcheck "compute-sanitizer memcheck" "no compute-sanitizer"
    skip racecheck "compute-sanitizer racecheck" "no compute-sanitizer"
  else
    run_stage memcheck "compute-sanitizer memcheck, fastformer_gpu_tests --gtest_filter=*Small*" 90 \
      "${WD[@]}" "$SANITIZER" --tool memcheck --error-exitcode 99 --print-limit 40 \
      "$GPU_TESTS" '--gtest_filter=*Small*'
    run_stage racecheck "compute-sanitizer racecheck, fastformer_gpu_tests --gtest_filter=*Small*" 120 \
      "${WD[@]}" "$SANITIZER" --tool racecheck --error-exitcode 99 --print-limit 40 \
      "$GPU_TESTS" '--gtest_filter=*Small*'
  fi
fi

if [ -n "$MODELS_PID" ]; then
  log "waiting for the models"
  wait "$MODELS_PID"
fi

# ---- benchmarks ---------------------------------------------------------------------------
# id|engine|model|dtype|lengths|batch_tokens|role   (engine: ours, pytorch, pytorch-compile, sdpa)
if [ "$MODE" = cpu-smoke ]; then
  BACKEND=cpu
  DEVICE=cpu
  MATRIX="ours-short|ours|tiny|float32|fixed:64|2048|short
ours-long|ours|tiny|float32|fixed:512|2048|long
ours-seq4096|ours|tiny|float32|fixed:128|2048|seq4096
ours-seq8192|ours|tiny|float32|fixed:256|2048|seq8192
ours-mix-fp32|ours|tiny|float32|uniform:16:256|2048|mix-ref
torch-eager|pytorch|tiny|float32|uniform:16:256|2048|ref
sdpa-512|sdpa|tiny|float32|fixed:64|2048|sdpa512
sdpa-4096|sdpa|tiny|float32|fixed:128|2048|sdpa4096
sdpa-8192|sdpa|tiny|float32|fixed:256|2048|sdpa8192
torch-compile|pytorch-compile|tiny|float32|uniform:16:256|2048|ref-compile"
else
  BACKEND=cuda
  DEVICE=cuda
  MATRIX="ours-bl-bf16-fixed512|ours|base-long|bfloat16|fixed:512|65536|short
ours-bl-bf16-fixed65536|ours|base-long|bfloat16|fixed:65536|65536|long
ours-bl-bf16-fixed4096|ours|base-long|bfloat16|fixed:4096|65536|seq4096
ours-bl-bf16-fixed8192|ours|base-long|bfloat16|fixed:8192|65536|seq8192
ours-off-fp32-mix|ours|official|float32|uniform:64:4096|65536|mix
ours-off-fp16-mix|ours|official|float16|uniform:64:4096|65536|mix
ours-off-bf16-mix|ours|official|bfloat16|uniform:64:4096|65536|mix
ours-bl-fp32-mix|ours|base-long|float32|uniform:64:4096|65536|mix
ours-bl-fp16-mix|ours|base-long|float16|uniform:64:4096|65536|mix
ours-bl-bf16-mix|ours|base-long|bfloat16|uniform:64:4096|65536|mix-ref
torch-eager|pytorch|base-long|bfloat16|uniform:64:4096|65536|ref
sdpa-512|sdpa|base-long|bfloat16|fixed:512|65536|sdpa512
sdpa-4096|sdpa|base-long|bfloat16|fixed:4096|65536|sdpa4096
sdpa-8192|sdpa|base-long|bfloat16|fixed:8192|65536|sdpa8192
torch-compile|pytorch-compile|base-long|bfloat16|uniform:64:4096|65536|ref-compile"
fi

BENCH_BIN=$BUILD_DIR/bin/fastformer-bench
if [ "$MODE" = cpu-smoke ] && [ ! -x "$BENCH_BIN" ] && [ -x build/bin/fastformer-bench ]; then
  BENCH_BIN=build/bin/fastformer-bench  # the CPU engine of a plain `make build`
fi
printf '%s\n' "$MATRIX" >"$RUN/benches.tsv"

if [ "$MODE" = no-gpu ]; then
  skip copy-bandwidth "device-to-device copy bandwidth (1 GiB)" "$GPU_WHY"
elif [ -z "$PY" ]; then
  skip copy-bandwidth "device-to-device copy bandwidth (1 GiB)" "no python3 that imports torch"
elif [ "$MODE" = cpu-smoke ]; then
  run_stage copy-bandwidth "copy bandwidth (CPU smoke, 64 MiB)" 60 \
    "$PY" tests/gpu/copy_bandwidth.py --device cpu --bytes 67108864 --repeats 3 --warmup 1
else
  run_stage copy-bandwidth "device-to-device copy bandwidth (1 GiB, CUDA events)" 60 \
    "$PY" tests/gpu/copy_bandwidth.py --device cuda --bytes 1073741824 --repeats 20
fi

bench_stage() {  # bench_stage ID ENGINE MODEL DTYPE LENGTHS BATCH_TOKENS
  local id=$1 engine=$2 model=$3 dtype=$4 lengths=$5 bt=$6
  local mdir=$MODELS/$model
  local title="$engine $model $dtype $lengths @$bt"
  if [ "$MODE" = no-gpu ]; then skip "$id" "$title" "$GPU_WHY"; return; fi
  if [ ! -f "$mdir/.gpu-check-ok" ]; then skip "$id" "$title" "model $model missing (see stage model-$model)"; return; fi
  case "$engine" in
    ours)
      if [ ! -x "$BENCH_BIN" ]; then skip "$id" "$title" "no $BENCH_BIN (see stage build)"; return; fi
      run_stage "$id" "fastformer-bench --backend $BACKEND, $model $dtype $lengths @$bt" 60 \
        "${WD[@]}" "$BENCH_BIN" --model-dir "$mdir" --backend "$BACKEND" --dtype "$dtype" \
        --lengths "$lengths" --batch-tokens "$bt" --seconds "$BENCH_SECONDS" --json
      ;;
    pytorch | pytorch-compile)
      if [ -z "$PY" ]; then skip "$id" "$title" "no python3 that imports torch"; return; fi
      local extra=() cap=150
      if [ "$engine" = pytorch-compile ]; then extra=(--compile); cap=240; fi
      run_stage "$id" "bench_pytorch.py --device $DEVICE${extra[*]:+ ${extra[*]}}, $model $dtype $lengths @$bt" "$cap" \
        "$PY" tools/bench_pytorch.py --model-dir "$mdir" --device "$DEVICE" --dtype "$dtype" \
        --lengths "$lengths" --batch-tokens "$bt" --seconds "$BENCH_SECONDS" --threads "$NPROC" \
        --json "${extra[@]}"
      ;;
    sdpa)
      if [ -z "$PY" ]; then skip "$id" "$title" "no python3 that imports torch"; return; fi
      run_stage "$id" "bench_sdpa.py --device $DEVICE, shape of $model, $dtype ${lengths#fixed:} tokens/seq @$bt" 90 \
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
run_matrix '^ours$'

# Per-kernel DRAM bytes and time of one base-long bf16 batch, for the 70%-of-copy target.
NCU_TITLE="ncu: per-kernel DRAM bytes and time, one base-long bf16 fixed:512 batch"
if [ "$GPU_OK" = 0 ]; then
  skip ncu "$NCU_TITLE" "$GPU_WHY"
elif [ -z "$NCU" ]; then
  skip ncu "$NCU_TITLE" "no ncu (Nsight Compute)"
elif [ ! -x "$BENCH_BIN" ] || [ ! -f "$MODELS/base-long/.gpu-check-ok" ]; then
  skip ncu "$NCU_TITLE" "no fastformer-bench or no base-long model"
else
  run_stage ncu "$NCU_TITLE" 120 \
    "${WD[@]}" "$NCU" --clock-control none --target-processes all --print-kernel-base function \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv --print-units base --launch-count 800 --log-file "$RUN/ncu.csv" \
    "$BENCH_BIN" --model-dir "$MODELS/base-long" --backend cuda --dtype bfloat16 \
    --lengths fixed:512 --batch-tokens 65536 --pool-batches 1 --warmup-batches 0 --seconds 0 --json
fi

run_matrix '^(pytorch|sdpa)$'
run_matrix '^pytorch-compile$'

# ---- report -------------------------------------------------------------------------------
echo "finished=$(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$RUN/meta.env"
echo "elapsed_s=$((SECONDS - T0))" >>"$RUN/meta.env"
mkdir -p "$(dirname "$REPORT")" 2>/dev/null
written=0
if [ -n "$PYR" ] && "$PYR" tests/gpu/report.py --run "$RUN" --out "$REPORT" --summary "$RUN/summary.txt" \
  >"$RUN/report.log" 2>&1; then
  written=1
else
  log "report.py failed; writing a plain report"
  tail -n 20 "$RUN/report.log" 2>/dev/null | sed 's/^/    /'
  {
    echo "# GPU check report (plain: tests/gpu/report.py failed)"
    echo
    echo "mode $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), ${GPU_WHY:-GPU present}"
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
log "done in $((SECONDS - T0))s; report: $REPORT; logs: $RUN"
[ "$written" = 1 ] || exit 1
exit 0

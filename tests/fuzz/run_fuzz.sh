#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS seconds, FUZZ_JOBS (default: the cores) at a time,
# and prints what each did (used by `make fuzz`).
#
#   tests/fuzz/run_fuzz.sh BIN_DIR WORK_DIR SECONDS TARGET...
#
# The seed corpus (tests/fuzz/corpus/<target>) and the regression inputs
# (tests/fuzz/regressions/<target>) are read, never written: new inputs go to
# WORK_DIR/corpus/<target> (kept between runs, so coverage builds up) and crashes to
# WORK_DIR/artifacts/<target>/. Exits non-zero when any target crashed, leaked, timed out
# or ran out of memory; the others still run.
set -uo pipefail
bin_dir=$1 work=$2 seconds=$3
shift 3
here="$(cd "$(dirname "$0")" && pwd)"
rss_mb=${FUZZ_RSS_MB:-2048}   # also the largest single allocation (-malloc_limit_mb)
timeout_s=${FUZZ_TIMEOUT:-10} # one input taking longer is a hang

jobs=${FUZZ_JOBS:-$(nproc)}   # targets fuzzed at once (each libFuzzer process is one thread)

# One target: runs it and writes its summary line (and "FAILED" marker) to WORK_DIR/TARGET.result.
run_one() {
  local target=$1
  local corpus="$work/corpus/$target" artifacts="$work/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  local log="$work/$target.log"
  local args=(-max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout_s"
              -print_final_stats=1 -artifact_prefix="$artifacts/")
  [[ -f "$here/$target.dict" ]] && args+=(-dict="$here/$target.dict")
  local inputs=("$corpus" "$here/corpus/$target")
  [[ -d "$here/regressions/$target" ]] && inputs+=("$here/regressions/$target")
  local start=$SECONDS
  "$bin_dir/$target" "${args[@]}" "${inputs[@]}" >"$log" 2>&1
  local rc=$?
  local elapsed=$((SECONDS - start))
  local runs cov
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
  local line="$target: ${runs:-?} executions in ${elapsed}s, ${cov:-no coverage line}"
  if [[ $rc -ne 0 ]]; then
    line+=", FAILED (exit $rc)"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*invariant failed|artifact_prefix|Test unit written)' "$log" | head -20
  fi
  echo "$line" >"$work/$target.result"
  echo "$line"
}

mkdir -p "$work"
# $jobs targets at a time, each for the full SECONDS: the wall time is about
# ceil(targets / jobs) x SECONDS.
running=0
for target in "$@"; do
  echo "== $target: ${seconds}s (log: $work/$target.log)"
  rm -f "$work/$target.result"
  run_one "$target" &
  running=$((running + 1))
  if [[ $running -ge $jobs ]]; then
    wait -n
    running=$((running - 1))
  fi
done
wait

failed=()
summary=()
for target in "$@"; do
  line=$(cat "$work/$target.result" 2>/dev/null || echo "$target: no result (the runner died)")
  summary+=("$line")
  [[ "$line" == *FAILED* || "$line" == *"no result"* ]] && failed+=("$target")
done
echo "== fuzz summary"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]} (inputs under $work/artifacts/; keep each under tests/fuzz/regressions/<target>/ once fixed)"
  exit 1
fi

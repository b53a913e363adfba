#!/usr/bin/env bash
# Runs each libFuzzer target for SECONDS seconds and prints what each did (used by `make fuzz`).
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

failed=()
summary=()
for target in "$@"; do
  corpus="$work/corpus/$target" artifacts="$work/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  log="$work/$target.log"
  args=(-max_total_time="$seconds" -rss_limit_mb="$rss_mb" -timeout="$timeout_s"
        -print_final_stats=1 -artifact_prefix="$artifacts/")
  [[ -f "$here/$target.dict" ]] && args+=(-dict="$here/$target.dict")
  inputs=("$corpus" "$here/corpus/$target")
  [[ -d "$here/regressions/$target" ]] && inputs+=("$here/regressions/$target")
  echo "== $target: ${seconds}s (log: $log)"
  start=$SECONDS
  "$bin_dir/$target" "${args[@]}" "${inputs[@]}" >"$log" 2>&1
  rc=$?
  elapsed=$((SECONDS - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -Eo 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' "$log" | tail -1)
  line="$target: ${runs:-?} executions in ${elapsed}s, ${cov:-no coverage line}"
  if [[ $rc -ne 0 ]]; then
    failed+=("$target")
    line+=", FAILED (exit $rc)"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*invariant failed|artifact_prefix|Test unit written)' "$log" | head -20
  fi
  echo "$line"
  summary+=("$line")
done
echo "== fuzz summary"
printf '  %s\n' "${summary[@]}"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz: failed: ${failed[*]} (inputs under $work/artifacts/; keep each under tests/fuzz/regressions/<target>/ once fixed)"
  exit 1
fi

#!/usr/bin/env bash
# Runs make targets at the same time, each one's output into its own log, printed whole when it
# ends (so the outputs never interleave), each one's wall time recorded by tools/step.sh:
#
#   tools/side_by_side.sh PREFIX TARGET...      e.g. "make test" test-deploy test-tokenizer
#
# Only for suites that time nothing (no latency bound, no rate, no deadline sized for an idle
# machine): their servers bind port 0 (tools/fastformer_testing/server_ports.py), so
# they cannot collide.
# Exits non-zero when any of them failed, naming each.
set -uo pipefail
prefix=${1:?PREFIX}
shift
logdir=$(mktemp -d /tmp/fastformer-side-by-side.XXXXXX)
pids=() names=()
for target in "$@"; do
  tools/step.sh "$prefix: $target" "${MAKE:-make}" --no-print-directory "$target" >"$logdir/$target.log" 2>&1 &
  pids+=($!)
  names+=("$target")
done
failed=()
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed+=("${names[$i]}")
  echo "---- ${names[$i]} (side by side with: ${names[*]}) ----"
  cat "$logdir/${names[$i]}.log"
done
rm -rf "$logdir"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "side_by_side: FAILED: ${failed[*]}" >&2
  exit 1
fi

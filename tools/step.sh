#!/usr/bin/env bash
# Runs one step and keeps its wall time on record (issue 32, point 6):
#
#   tools/step.sh NAME COMMAND...
#
# Prints "== NAME" before and "== NAME: N s (ok|FAILED, exit R)" after, and appends
# "NAME<TAB>seconds<TAB>exit status" to $FASTFORMER_STEP_LOG when it is set (.ci/run sets it and
# prints the table at the end; `make test` records each suite this way). Exits with the
# command's status.
set -uo pipefail
name=${1:?NAME}
shift
echo "== $name"
start=$(date +%s.%N)
"$@"
rc=$?
secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }')
if [ "$rc" -eq 0 ]; then state=ok; else state="FAILED, exit $rc"; fi
echo "== $name: $secs s ($state)"
if [ -n "${FASTFORMER_STEP_LOG:-}" ]; then
  printf '%s\t%s\t%s\n' "$name" "$secs" "$rc" >>"$FASTFORMER_STEP_LOG"
fi
exit "$rc"

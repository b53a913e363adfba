#!/usr/bin/env bash
# Runs one step and keeps its wall time on record (issue 32, point 6):
#
#   tools/step.sh NAME COMMAND...
#
# Prints "== NAME" before and "== NAME: N s (ok|FAILED, exit R; C s of CPU)" after, and appends
# "NAME<TAB>seconds<TAB>exit status<TAB>CPU seconds" to $FASTFORMER_STEP_LOG when it is set
# (.ci/run sets it and prints the table at the end; `make test` records each suite this way).
# The CPU time (user + system of the step's processes) tells a suite that waits (a candidate to
# run side by side) from one that keeps both cores busy. Exits with the command's status.
set -uo pipefail
name=${1:?NAME}
shift
echo "== $name"
TIMEFORMAT='%R %U %S'
times_file=$(mktemp /tmp/fastformer-step.XXXXXX)
{ time "$@" 2>&3 3>&-; } 3>&2 2>"$times_file"
rc=$?
read -r wall user sys <"$times_file" || true
rm -f "$times_file"
secs=$(awk -v w="${wall:-0}" 'BEGIN { printf "%.0f", w }')
cpu=$(awk -v u="${user:-0}" -v s="${sys:-0}" 'BEGIN { printf "%.1f", u + s }')
if [ "$rc" -eq 0 ]; then state=ok; else state="FAILED, exit $rc"; fi
echo "== $name: $secs s ($state; $cpu s of CPU)"
if [ -n "${FASTFORMER_STEP_LOG:-}" ]; then
  printf '%s\t%s\t%s\t%s\n' "$name" "$secs" "$rc" "$cpu" >>"$FASTFORMER_STEP_LOG"
fi
exit "$rc"

#!/usr/bin/env bash
# Prints the steps tools/step.sh recorded in LOG as a table, in the order they ended:
#   tools/step_table.sh LOG
set -euo pipefail
log=${1:?LOG}
[ -s "$log" ] || { echo "(no steps recorded in $log)"; exit 0; }
awk -F'\t' '
  { name[NR] = $1; secs[NR] = $2; rc[NR] = $3; cpu[NR] = $4; if (length($1) > w) w = length($1) }
  END {
    printf "%-*s  %8s  %8s  %s\n", w, "step", "wall s", "CPU s", "result"
    for (i = 1; i <= NR; i++)
      printf "%-*s  %8d  %8.1f  %s\n", w, name[i], secs[i], cpu[i], (rc[i] == 0 ? "ok" : "FAILED (exit " rc[i] ")")
  }' "$log"

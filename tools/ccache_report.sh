#!/usr/bin/env bash
# The compiler cache's counters since a snapshot (.ci/run ends with it):
#   tools/ccache_report.sh CCACHE_DIR BEFORE     BEFORE: `ccache --print-stats` taken earlier
set -uo pipefail
dir=${1:?CCACHE_DIR} before=${2:?BEFORE}
if ! command -v ccache >/dev/null; then
  echo "ccache: not installed (deploy/install-deps.sh installs it): every compile ran"
  exit 0
fi
CCACHE_DIR=$dir ccache --print-stats 2>/dev/null | awk -F'\t' -v dir="$dir" '
  FNR == NR { was[$1] = $2; next }
  { now[$1] = $2 - was[$1] }
  END {
    hit = now["direct_cache_hit"] + now["preprocessed_cache_hit"]
    miss = now["cache_miss"]
    total = hit + miss
    printf "ccache (%s), this run: %d compiles, %d hits (%d direct, %d preprocessed), %d misses", \
      dir, total, hit, now["direct_cache_hit"], now["preprocessed_cache_hit"], miss
    if (total > 0) printf ", hit rate %.1f%%", 100 * hit / total
    printf "; not cacheable (links, unsupported options): %d\n", \
      now["called_for_link"] + now["unsupported_compiler_option"] + now["unsupported_source_language"]
  }' <(echo "__start__	0"; cat "$before") - 2>/dev/null
size=$(CCACHE_DIR=$dir ccache --print-stats 2>/dev/null | awk -F'\t' '$1 == "cache_size_kibibyte" {printf "%.2f", $2 / 1048576}')
echo "ccache: $size GiB in $dir (max $(CCACHE_DIR=$dir ccache --get-config max_size 2>/dev/null))"

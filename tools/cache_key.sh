#!/usr/bin/env bash
# Prints a 16-hex-digit key over everything that decides a cached artefact (mk/cache.mk):
#
#   tools/cache_key.sh [--file F]... [--packages 'GLOB'...] [--text S]... [--machine]
#
#   --file F        F's contents (and its name)
#   --packages G    the installed Debian packages matching each dpkg-query glob, with versions
#   --text S        a string (arguments, an interpreter's version)
#   --machine       the CPU model and flags and the cores this process may use
# The same inputs give the same key on any machine and in any clone.
set -euo pipefail
{
  while [ $# -gt 0 ]; do
    case "$1" in
      --file) printf 'file %s\n' "$(basename "$2")"; cat "$2"; shift 2 ;;
      --packages) printf 'packages %s\n' "$2"
        # shellcheck disable=SC2086 # the globs are dpkg-query's
        dpkg-query -W -f='${db:Status-Abbrev} ${binary:Package} ${Version}\n' $2 2>/dev/null |
          awk '$1 == "ii" {print $2, $3}' | LC_ALL=C sort; shift 2 ;;
      --text) printf 'text %s\n' "$2"; shift 2 ;;
      --machine) printf 'machine\n'
        grep -m1 '^model name' /proc/cpuinfo || true
        grep -m1 '^flags' /proc/cpuinfo || true
        nproc; shift ;;
      *) echo "cache_key.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
  done
} | sha256sum | cut -c1-16

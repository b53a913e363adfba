#!/usr/bin/env bash
# The test suites' venvs, outside the checkout and keyed by what they hold (mk/cache.mk):
#
#   tools/cached_venv.sh path   NAME [options]   print the venv's directory
#   tools/cached_venv.sh ensure NAME [options]   make it if it is missing, then print it
#
# options:
#   --python PY              the interpreter the venv is made from (default /usr/bin/python3)
#   --system-site-packages   the venv sees PY's packages (Debian's torch, numpy, grpcio)
#   --post CMD               run CMD (with $VENV set, from the checkout) after pip, before
#                            the venv counts as made
#   --key-file F             F's contents also go into the key (the script --post runs)
#
# The requirements are tests/requirements/NAME.txt, whose versions come from
# tests/requirements/pins.txt (each pin written once). The directory is
# $VENV_CACHE/NAME-KEY (VENV_CACHE default /var/cache/fastformer/venv); KEY hashes the two
# files, --post (and --key-file), PY's version and, with --system-site-packages, the Debian python3 packages
# the venv sees. A venv is made under a lock (two runs at once make it once) and counts as
# made only once its .complete marker is written: one left half-made is made again.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:?path or ensure}
name=${2:?NAME}
shift 2
python=/usr/bin/python3 system=0 post="" key_files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --python) python=$2; shift 2 ;;
    --system-site-packages) system=1; shift ;;
    --post) post=$2; shift 2 ;;
    --key-file) key_files+=(--file "$2"); shift 2 ;;
    *) echo "cached_venv.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
reqs=$here/tests/requirements/$name.txt
pins=$here/tests/requirements/pins.txt
[ -f "$reqs" ] || { echo "cached_venv.sh: no $reqs" >&2; exit 2; }
key_args=(--file "$reqs" --file "$pins" "${key_files[@]}" --text "$post" --text "$(command -v "$python") $("$python" -VV 2>&1)")
[ "$system" = 0 ] || key_args+=(--packages 'python3*' --text system-site-packages)
key=$("$here/tools/cache_key.sh" "${key_args[@]}")
cache=${VENV_CACHE:-/var/cache/fastformer/venv}
venv=$cache/$name-$key
if [ "$mode" = path ] || [ -f "$venv/.complete" ]; then
  echo "$venv"
  exit 0
fi
[ "$mode" = ensure ] || { echo "cached_venv.sh: unknown mode '$mode' (path or ensure)" >&2; exit 2; }
mkdir -p "$cache"
exec 9>"$venv.lock"
flock -w 1800 9
if [ ! -f "$venv/.complete" ]; then
  echo "cached_venv.sh: making $venv ($name: $(grep -v '^ *#' "$reqs" | grep -v '^-' | xargs))" >&2
  rm -rf "$venv"
  venv_args=()
  [ "$system" = 0 ] || venv_args+=(--system-site-packages)
  "$python" -m venv "${venv_args[@]}" "$venv"
  (cd "$here/tests/requirements" && "$venv/bin/pip" install -q --disable-pip-version-check -r "$reqs") >&2
  if [ -n "$post" ]; then  # run from the checkout
    (cd "$here" && VENV=$venv bash -c "$post") >&2
  fi
  touch "$venv/.complete"
fi
echo "$venv"

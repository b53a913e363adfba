#!/usr/bin/env bash
# perf_analyzer, Triton's C++ load tester, into $VENV/bin: taken from the tritonclient VERSION
# wheel (the newer perf-analyzer packages do not install here). It links the CUDA runtime
# library (nvidia-cuda-runtime-cu12, in the venv; no GPU is used) and Debian's libb64-0d.
#   VENV=... tools/perf_analyzer_from_wheel.sh VERSION      (tools/cached_venv.sh --post)
set -euo pipefail
version=${1:?tritonclient version}
"$VENV/bin/pip" download -q --disable-pip-version-check --no-deps -d "$VENV/wheels" "tritonclient==$version"
"$VENV/bin/python" - "$VENV/wheels" "$VENV/bin/perf_analyzer" <<'PY'
import pathlib, sys, zipfile
w = zipfile.ZipFile(next(pathlib.Path(sys.argv[1]).glob("tritonclient-*.whl")))
out = pathlib.Path(sys.argv[2])
out.write_bytes(w.read(next(n for n in w.namelist() if n.endswith("/bin/perf_analyzer"))))
out.chmod(0o755)
PY

#!/usr/bin/env python3
"""The interpreter that runs tools/bench_onnxruntime.py and tools/bench_openvino.py: a venv
with ONNX Runtime and OpenVINO from PyPI.

    ort_env.py [--venv DIR] [--python PY] [--need onnxruntime,openvino]
                                            install if needed, print the venv's python

Debian's python3 is externally managed (no `pip install` into it), and ONNX Runtime has no
Debian package, so the benchmark gets its own venv, <repo>/.venv-bench (gitignored;
$FASTFORMER_BENCH_VENV moves it):

    PY -m venv --system-site-packages .venv-bench      (PY: the interpreter that imports torch)
    .venv-bench/bin/python -m pip install -c C onnxruntime 'openvino>=2024.0,<2027'

--system-site-packages keeps Debian's torch and numpy visible (torch exports the ONNX file;
the `onnx` package is not needed). The constraints file C pins numpy to the version PY
already has, so pip never pulls a numpy 2 into the venv that would shadow the one Debian's
torch 1.13 was built against (pip picks an onnxruntime release that accepts that numpy).
If PY is itself a venv (e.g. PyTorch from pip on Ubuntu), a .pth file adds its
site-packages. Idempotent, and safe to run concurrently (a lock file beside the venv);
nothing is fetched once `import onnxruntime, torch` works in the venv (and `import
openvino` for a caller that needs it: a venv made before OpenVINO joined is completed then).

Every install asks pip for both packages (PACKAGES). When that fails and the caller needs
only onnxruntime, onnxruntime alone is installed, so an OpenVINO problem never costs the
ONNX Runtime baseline.

ensure(need=("onnxruntime",)) -> Path of the venv python, or raises OrtUnavailable(reason):
used by run_benchmarks.py (make bench), bench_onnxruntime.py and
tests/golden/test_bench_onnxruntime.py; bench_openvino.py and its test pass
need=("openvino",). missing_openvino_message() is the error naming the fix.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = Path(os.environ.get("FASTFORMER_BENCH_VENV") or REPO / ".venv-bench")
CHECK = "import onnxruntime, torch, numpy"
# pip requirement per package: OpenVINO's 2024.0 .. 2026.x wheels exist for CPython 3.11 on
# x86-64 Linux (manylinux2014) and accept numpy < 2.6, so the numpy pin below holds.
PACKAGES = {"onnxruntime": "onnxruntime", "openvino": "openvino>=2024.0,<2027"}


class OrtUnavailable(RuntimeError):
    """ONNX Runtime could not be installed (no network, no python3-venv, no wheel, ...)."""


def _run(cmd, timeout=900):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout)


def _tail(p, n=15):
    text = (p.stdout or "") + (p.stderr or "")
    return "\n".join(text.strip().splitlines()[-n:])


def venv_python(venv: Path = DEFAULT_VENV) -> Path:
    return Path(venv) / "bin" / "python"


def check_code(need=("onnxruntime",)) -> str:
    """The import line a working venv runs: torch and numpy, and the packages of `need`."""
    return "import " + ", ".join(dict.fromkeys([*need, "torch", "numpy"]))


def works(python, need=("onnxruntime",)) -> bool:
    try:
        return Path(python).exists() and _run([python, "-c", check_code(need)], timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def missing_openvino_message(python=None) -> str:
    """What to do when `import openvino` fails in the interpreter that runs bench_openvino.py."""
    return (f"openvino is not importable in {python or sys.executable}: run "
            f"`/usr/bin/python3 tools/ort_env.py --need openvino` (installs {PACKAGES['openvino']!r} "
            f"from PyPI into {DEFAULT_VENV}), or run bench_openvino.py with {venv_python()}")


def _parent_info(python):
    """(numpy version or None, site-packages dirs, is a venv) of the creating interpreter."""
    code = ("import json, site, sys\n"
            "try:\n import numpy; v = numpy.__version__\nexcept Exception:\n v = None\n"
            "print(json.dumps([v, site.getsitepackages(), sys.prefix != sys.base_prefix]))")
    p = _run([python, "-c", code], timeout=300)
    if p.returncode != 0:
        raise OrtUnavailable(f"{python} does not run: {_tail(p)}")
    import json
    return tuple(json.loads(p.stdout.strip().splitlines()[-1]))


def ensure(venv: Path = DEFAULT_VENV, python=None, log=None, need=("onnxruntime",)) -> Path:
    """Create/complete the venv if needed; the venv's python (imports torch and `need`)."""
    venv = Path(venv)
    python = python or sys.executable
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    unknown = set(need) - set(PACKAGES)
    if unknown:
        raise ValueError(f"ort_env: unknown package(s) {sorted(unknown)}; known: {sorted(PACKAGES)}")
    py = venv_python(venv)
    if works(py, need):
        return py
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be installing right now
        if works(py, need):
            return py
        numpy_version, site_dirs, parent_is_venv = _parent_info(python)
        if not py.exists():
            if venv.exists():
                shutil.rmtree(venv)
            log(f"ort_env: creating {venv} ({python} -m venv --system-site-packages)")
            p = _run([python, "-m", "venv", "--system-site-packages", venv])
            if p.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise OrtUnavailable(f"`{python} -m venv` failed (is python3-venv installed? "
                                     f"deploy/install-deps.sh installs it):\n{_tail(p)}")
        if parent_is_venv:  # --system-site-packages reaches the base install, not this venv
            p = _run([py, "-c", "import site; print(site.getsitepackages()[0])"])
            if p.returncode == 0:
                Path(p.stdout.strip(), "_ort_env_parent.pth").write_text("\n".join(site_dirs) + "\n")
        constraints = venv / "constraints.txt"
        constraints.write_text(f"numpy=={numpy_version}\n" if numpy_version else "")
        wanted = [PACKAGES[k] for k in PACKAGES]
        p = _pip_install(py, constraints, wanted, venv, numpy_version, log)
        if p.returncode != 0 and set(need) <= {"onnxruntime"}:
            log(f"ort_env: that failed; installing onnxruntime alone:\n{_tail(p, 5)}")
            wanted = [PACKAGES["onnxruntime"]]
            p = _pip_install(py, constraints, wanted, venv, numpy_version, log)
        if p.returncode != 0:
            raise OrtUnavailable(f"pip install {' '.join(wanted)} failed:\n{_tail(p)}")
        code = check_code(need)
        p = _run([py, "-c", code])
        if p.returncode != 0:
            raise OrtUnavailable(f"{py}: `{code}` fails after the install:\n{_tail(p)}")
    return py


def _pip_install(py, constraints, requirements, venv, numpy_version, log):
    log(f"ort_env: pip install {' '.join(requirements)} into {venv}"
        + (f" (numpy pinned to {numpy_version})" if numpy_version else ""))
    try:
        return _run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                     "-c", constraints, *requirements])
    except subprocess.TimeoutExpired:
        raise OrtUnavailable(f"pip install {' '.join(requirements)} timed out") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--venv", default=str(DEFAULT_VENV))
    ap.add_argument("--python", default=sys.executable, help="the interpreter that imports torch")
    ap.add_argument("--need", default="onnxruntime",
                    help="comma-separated packages the venv must import (default onnxruntime; "
                         "both are installed either way)")
    a = ap.parse_args(argv)
    need = tuple(x for x in a.need.split(",") if x)
    try:
        print(ensure(Path(a.venv), a.python, need=need))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    except OrtUnavailable as e:
        print(f"ort_env: {' and '.join(need)} unavailable: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

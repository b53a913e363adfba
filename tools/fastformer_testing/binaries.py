"""The built programs and how a test or a tool runs them.

The binaries are looked up in $FASTFORMER_BIN_DIR (default <repo>/build/bin; make test-asan points
it at build-asan/bin), or in the directory a tool names (its --build-dir's bin). A missing one
FAILS the test that asked for it (call binary() inside the test or the fixture that needs it);
FASTFORMER_ALLOW_MISSING_BINARIES=1 turns that into a skip, while developing. Outside pytest it
raises HarnessError (outcome.py).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Mapping, Optional

from .outcome import fail, skip

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"


def use_tools():
    """Puts tools/ (make_demo_model, reference, torch_blas, ...) on sys.path."""
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))


def bin_dir() -> Path:
    return Path(os.environ.get("FASTFORMER_BIN_DIR", str(REPO / "build" / "bin")))


def binary(name: str, directory: Optional[os.PathLike] = None) -> Path:
    """The path of the built program `name` in `directory` (default bin_dir()); fails the test (or
    skips, see above) when it is missing."""
    path = Path(directory if directory is not None else bin_dir()) / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    msg = (f"{name} not found at {path}: build it first (make build, or cmake --build build --target {name}), "
           f"or point FASTFORMER_BIN_DIR at the directory holding it")
    if os.environ.get("FASTFORMER_ALLOW_MISSING_BINARIES") == "1":
        skip(msg)
    fail(msg)


def child_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The environment of a program under test: the caller's without FASTFORMER_* (the server reads
    those as flag defaults, so a developer's would change what runs), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FASTFORMER_")}
    env.update(extra or {})
    return env


def die_with_parent(cmd):
    """`cmd` killed when the test runner dies (setpriv --pdeathsig execs it: the pid is the program's)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGKILL", "--"] + list(cmd) if setpriv else list(cmd)

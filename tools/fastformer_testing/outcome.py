"""How the harness reports what stops it, in a test and in a tool alike.

Under pytest (the suites' conftest.py has imported it), fail() is pytest.fail and skip() is
pytest.skip, without a Python traceback. Anywhere else (tools/*.py, tests/gpu/server_stage.py
under a lent GPU machine's bare Python, with no pytest installed) both raise HarnessError, a
RuntimeError that carries the same message. pytest is never imported here: a tool that has it
installed still gets HarnessError.
"""

from __future__ import annotations

import sys


class HarnessError(RuntimeError):
    """What stopped the harness outside pytest: a missing binary, a server that exited or never
    became ready, a sanitizer report."""


def _pytest():
    return sys.modules.get("pytest")


def fail(message: str):
    pytest = _pytest()
    if pytest is not None:
        pytest.fail(message, pytrace=False)
    raise HarnessError(message)


def skip(message: str):
    pytest = _pytest()
    if pytest is not None:
        pytest.skip(message)
    raise HarnessError(message)

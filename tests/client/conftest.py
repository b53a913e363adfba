"""Fixtures for the fastformer-client and fastformer-loadgen tests (run:
/usr/bin/python3 -m pytest tests/client).

They are the end-to-end suite's own (tests/e2e/conftest.py): `e2e` (helpers, metrics parsing),
`models` (demo models) and `servers` (real fastformer-server processes on loopback, on ports
they bind themselves, stopped by the fixtures). That conftest is loaded here under its own
module name and its fixtures and failure-log hook re-exported, so both directories can be
collected together.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_E2E_CONFTEST = Path(__file__).resolve().parents[1] / "e2e" / "conftest.py"
_spec = importlib.util.spec_from_file_location("fastformer_e2e_fixtures", _E2E_CONFTEST)
_e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _e2e  # dataclasses look their module up there
_spec.loader.exec_module(_e2e)

stubs = _e2e.stubs
e2e = _e2e.e2e
models = _e2e.models
_session_servers = _e2e._session_servers
servers = _e2e.servers
pytest_runtest_makereport = _e2e.pytest_runtest_makereport  # server logs on failure

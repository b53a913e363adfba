"""Fixtures for the tests of the Python client package client/python (fastformer_client).

Run: /usr/bin/python3 -m pytest tests/python_client -q

The servers, demo models, float64 reference and helpers are those of the end-to-end suite:
tests/e2e/conftest.py is loaded under its own module name and its fixtures (`e2e`, `models`,
`servers`, ...) are re-exported here, so a real `fastformer-server` (build/bin, or
$FASTFORMER_BIN_DIR) runs on loopback with ephemeral ports. The package is imported from the
source tree: its stubs are generated on first import into the user's cache (client/python/
fastformer_client/_stubs.py); test_package.py checks the pip-installed form.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY_CLIENT = REPO / "client" / "python"


def _load(name, path):
    mod = sys.modules.get(name)
    if mod is None:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return mod


_e2e = _load("fastformer_e2e_conftest", REPO / "tests" / "e2e" / "conftest.py")
# The bad-input tables (cases, expected codes, message needles) of the server's suite.
bad_input = _load("fastformer_e2e_bad_input", REPO / "tests" / "e2e" / "test_server_bad_input.py")
# The "wordlevel" model: "head" plus a hand-written WordLevel tokenizer.json (tests/client/text_model.py).
text_model = _load("fastformer_client_text_model", REPO / "tests" / "client" / "text_model.py")

# Re-exported fixtures and the hook that attaches server logs to failed tests.
stubs = _e2e.stubs
e2e = _e2e.e2e
models = _e2e.models
_session_servers = _e2e._session_servers
servers = _e2e.servers
pytest_runtest_makereport = _e2e.pytest_runtest_makereport

if str(PY_CLIENT) not in sys.path:
    sys.path.insert(0, str(PY_CLIENT))

TOL = _e2e.TOL
assert_close = _e2e.assert_close
make_ids = _e2e.make_ids
make_embeddings = _e2e.make_embeddings
truncate = _e2e.truncate

# The server flags of the bad-input suite: a 2048-token request limit and a 256 KiB message limit.
HEAD_FLAGS = dict(bad_input.HEAD_FLAGS)


def pytest_configure(config):
    config.addinivalue_line("markers", "python_client: test of the Python client package (client/python)")


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.python_client)


@pytest.fixture(scope="session")
def ffc():
    """The fastformer_client package, from the source tree."""
    import fastformer_client
    assert Path(fastformer_client.__file__).resolve().is_relative_to(PY_CLIENT), fastformer_client.__file__
    return fastformer_client


@pytest.fixture
def head(servers):
    """The shared server of the "head" model (D 64, 3 labels, vocab 1000, 512 positions)."""
    return servers.shared("head", **HEAD_FLAGS)


@pytest.fixture
def noemb(servers):
    """The shared server of the "noemb" model (input embeddings only, no classifier head)."""
    return servers.shared("noemb")


@pytest.fixture
def wordlevel(servers, models):
    """The shared server of the "wordlevel" model ("head" plus a WordLevel tokenizer.json; the
    flags of head)."""
    text_model.register(models)
    return servers.shared("wordlevel", **HEAD_FLAGS)


@pytest.fixture(scope="session")
def tok():
    """The text model's tokenizer, by hand (tests/client/text_model.py: VOCAB, expected_ids, ...)."""
    return text_model


@pytest.fixture
def client(ffc, head):
    with ffc.Client(head.target, deadline_s=60.0) as c:
        yield c


def check_result_against_reference(label, model, seqs, kind, embeddings, token_embeddings=None, logits=None,
                                   normalize=False):
    """Client outputs (numpy) against the float64 reference, with the engine's tolerance."""
    import numpy as np
    assert embeddings.dtype == np.float32 and embeddings.shape == (len(seqs), model.hidden), \
        f"{label}: embeddings {embeddings.dtype} {embeddings.shape}"
    for i, s in enumerate(seqs):
        k = kind[i] if isinstance(kind, (list, tuple)) else kind
        r = model.reference(s, k)
        want = r.embedding / np.linalg.norm(r.embedding) if normalize else r.embedding
        assert_close(f"{label} seq {i} embedding", embeddings[i], want, TOL)
        if token_embeddings is not None:
            t = token_embeddings[i]
            assert t.dtype == np.float32 and t.shape == (len(s), model.hidden), f"{label} seq {i}: {t.dtype} {t.shape}"
            assert_close(f"{label} seq {i} token_embeddings", t, r.token_embeddings, TOL)
        if logits is not None:
            assert logits.dtype == np.float32 and logits.shape == (len(seqs), model.num_labels)
            assert_close(f"{label} seq {i} logits", logits[i], r.logits, TOL)


@pytest.fixture(scope="session")
def pyc():
    """Helpers for the test modules (no `from conftest import`)."""
    import types
    return types.SimpleNamespace(REPO=REPO, PY_CLIENT=PY_CLIENT, TOL=TOL, HEAD_FLAGS=HEAD_FLAGS,
                                 bad_input=bad_input, make_ids=make_ids, make_embeddings=make_embeddings,
                                 truncate=truncate, assert_close=assert_close,
                                 check=check_result_against_reference, held_port=_e2e.server_ports.held_port)

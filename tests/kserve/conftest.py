"""Fixtures for the Open Inference Protocol (KServe v2) tests: the real fastformer-server on
loopback, driven by Triton's own clients (tritonclient, perf_analyzer).

Run with the venv that `make test-kserve` makes (.venv-triton: tritonclient[grpc] from PyPI
over Debian's Python, whose PyTorch gives the float64 reference):

    .venv-triton/bin/python -m pytest tests/kserve

  model      a demo model (tools/make_demo_model.py) in a session tmp dir, with its float64
             reference (tools/reference.py)
  server     one fastformer-server for the session on ephemeral loopback ports
  start      start(**flags): a fresh server, stopped at the end of the test
  client     tritonclient.grpc.InferenceServerClient on `server`
  encode     the same sequences through fastformer.v1.Encoder (fastformer-client encode)

The binaries, the server process (Server derives from fastformer_testing's ServerProcess: start
on port 0, log, stop with the sanitizer-report check) come from tools/fastformer_testing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

if str(Path(__file__).resolve().parents[2] / "tools") not in sys.path:  # tools/: fastformer_testing, the tools
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fastformer_testing import REPO, ServerProcess, binary, server_opts, stop_all  # noqa: E402,F401  (REPO: tests)

import make_demo_model as mdm  # noqa: E402
import reference as ref  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

TOL = 1e-4  # the engine's tolerance to the float64 reference: |ours - ref| <= TOL * max(1, |ref|)
MODEL_NAME = "kserve-head"
# D 64, 4 heads, 2 layers, 512 positions, vocab 1000, 3 labels
MODEL_SPEC = dict(seed=11, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000,
                  num_labels=3, act="gelu", model_name=MODEL_NAME)


class Server(ServerProcess):
    """One fastformer-server subprocess (fastformer_testing.ServerProcess) on a model directory
    (MODEL_FLAG): `url` is its gRPC address, `metrics_port` its /metrics, `http_port` its HTTP
    listener. Every listener binds port 0 (unless a flag gives an address); these are the ports it
    reports in its log, read (and waited for) when first asked for."""

    MODEL_FLAG = "model-dir"

    def __init__(self, model_dir: Path, log_dir: Path, name: str, env_extra=None, **flags):
        super().__init__(log_dir / f"{name}.log", server_opts({self.MODEL_FLAG: model_dir}, flags), env=env_extra,
                         name=name)

    def wait_ready(self, headers=None, timeout=30.0):
        """Until the protocol's ServerReady says ready (after warm-up)."""
        client = grpcclient.InferenceServerClient(self.url)
        try:  # not listening yet, or UNAVAILABLE: not yet
            self.wait_for(lambda: client.is_server_ready(headers=headers), "ServerReady", timeout,
                          retry_on=(Exception,))
        finally:
            client.close()
        return self

    def metric(self, name: str, **labels) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        total = 0.0
        for line in self.scrape().splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total


# heavier (about 1.6 MFLOP per token): a queue of a few thousand tokens takes visible time
LOAD_SPEC = dict(seed=3, hidden=128, heads=4, layers=4, intermediate=512, max_positions=2048, vocab=1000,
                 num_labels=0, act="gelu", model_name="kserve-load")


class Model:
    def __init__(self, root: Path, spec=None):
        spec = spec or MODEL_SPEC
        self.dir = root / spec["model_name"]
        mdm.make_demo_model(self.dir, preset="tiny", log=lambda *a: None, **spec)
        self.ref_model, self.config = ref.load_model_dir(self.dir)
        self.name = spec["model_name"]
        self.hidden = self.config.hidden_size
        self.vocab = self.config.vocab_size
        self.max_positions = self.config.max_position_embeddings
        self.num_labels = spec["num_labels"]

    def reference(self, seqs, kind="ids"):
        """float64 reference results (embedding, token_embeddings, logits) per sequence."""
        return ref.reference_encode(self.ref_model, seqs, kind=kind)


@pytest.fixture(scope="session")
def model(tmp_path_factory):
    return Model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def load_model(tmp_path_factory):
    return Model(tmp_path_factory.mktemp("models"), LOAD_SPEC)


# late chunking's: 8,192 positions and a tokenizer (the others have 512)
LONG_SPEC = dict(seed=12, hidden=64, heads=4, layers=2, intermediate=128, max_positions=8192, vocab=1000,
                 num_labels=0, act="gelu", model_name="kserve-long", tokenizer=True)


@pytest.fixture(scope="session")
def long_model(tmp_path_factory):
    return Model(tmp_path_factory.mktemp("models"), LONG_SPEC)


@pytest.fixture(scope="session")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def server(model, logs):
    srv = Server(model.dir, logs, "shared").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture
def start(model, logs, request):
    started = []

    def _start(wait=True, headers=None, model_dir=None, **flags):
        """headers: what the readiness probe sends (a bearer token); model_dir: another model."""
        srv = Server(model_dir or model.dir, logs, f"{request.node.name}-{len(started)}", **flags)
        started.append(srv)
        return srv.wait_ready(headers=headers) if wait else srv

    yield _start
    stop_all(started)


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture
def encode(server, tmp_path):
    """encode(seqs, normalize=False) -> one dict per sequence, through fastformer.v1.Encoder."""

    def _encode(seqs, normalize=False, kind="ids"):
        lines = [json.dumps({"token_ids": [int(t) for t in s]} if kind == "ids"
                            else {"input_embeddings": np.asarray(s).tolist()}) for s in seqs]
        path = tmp_path / "encode-in.jsonl"
        path.write_text("\n".join(lines) + "\n")
        cmd = [str(binary("fastformer-client")), "encode", "--target", server.url, "--input", str(path),
               "--return-token-embeddings", "--return-logits"] + (["--normalize"] if normalize else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    return _encode


def close(ours, want, tol=TOL):
    """|ours - want| <= tol * max(1, |want|), elementwise; the worst ratio for messages."""
    ours, want = np.asarray(ours, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert ours.shape == want.shape, (ours.shape, want.shape)
    err = np.abs(ours - want) / np.maximum(1.0, np.abs(want))
    return float(err.max(initial=0.0)) <= tol, float(err.max(initial=0.0))

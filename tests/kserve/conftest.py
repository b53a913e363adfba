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

The binaries come from $FASTFORMER_BIN_DIR (default <repo>/build/bin); a missing one fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
if str(REPO / "tests" / "support") not in sys.path:  # server_ports: the ports a server bound itself
    sys.path.insert(0, str(REPO / "tests" / "support"))

import make_demo_model as mdm  # noqa: E402
import reference as ref  # noqa: E402
import server_ports  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

TOL = 1e-4  # the engine's tolerance to the float64 reference: |ours - ref| <= TOL * max(1, |ref|)
# A sanitizer's report in a server log (make test-asan runs this suite against the ASan server).
SANITIZER_REPORT = re.compile(r"^(==\d+==ERROR: \w+Sanitizer|WARNING: ThreadSanitizer|\S+:\d+:\d+: runtime error: )", re.M)
MODEL_NAME = "kserve-head"
# D 64, 4 heads, 2 layers, 512 positions, vocab 1000, 3 labels
MODEL_SPEC = dict(seed=11, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000,
                  num_labels=3, act="gelu", model_name=MODEL_NAME)


def binary(name: str) -> Path:
    path = Path(os.environ.get("FASTFORMER_BIN_DIR", REPO / "build" / "bin")) / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"{name} not found at {path}: build it first, or set FASTFORMER_BIN_DIR", pytrace=False)
    return path


class Server(server_ports.Listeners):
    """One fastformer-server subprocess; `url` is its gRPC address, `metrics_port` its /metrics,
    `http_port` its HTTP listener. Every listener binds port 0 (unless a flag gives an address);
    these are the ports it reports in its log, read (and waited for) when first asked for."""

    def __init__(self, model_dir: Path, log_dir: Path, name: str, **flags):
        opts = {"model-dir": model_dir, "listen": server_ports.ANY, "metrics-listen": server_ports.ANY,
                "http-listen": server_ports.ANY, "backend": "cpu", "threads": 2}
        opts.update({k.replace("_", "-"): v for k, v in flags.items()})
        self.cmd = [str(binary("fastformer-server"))]
        for k, v in opts.items():
            self.cmd += [f"--{k}", str(v)]
        self._launch(log_dir / f"{name}.log", opts, {k: v for k, v in os.environ.items()
                                                      if not k.startswith("FASTFORMER_")})

    def _launch(self, log_path: Path, opts: dict, env: dict):
        """Starts self.cmd, its output to log_path; `ports` reads the ports it binds from there."""
        self.log_path = log_path
        setpriv = shutil.which("setpriv")  # the server dies with the test runner
        cmd = [setpriv, "--pdeathsig", "SIGKILL", "--"] + self.cmd if setpriv else self.cmd
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.ports = server_ports.ServerPorts(
            self.log_path, self.proc, {"grpc": opts["listen"], "metrics": opts["metrics-listen"],
                                       "http": opts["http-listen"]}, name="fastformer-server", command=self.cmd)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_ready(self, headers=None, timeout=30.0):
        """Until the protocol's ServerReady says ready (after warm-up)."""
        client = grpcclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"fastformer-server exited with {self.proc.returncode}\n{self.log()}", pytrace=False)
                try:
                    if client.is_server_ready(headers=headers):
                        return self
                except Exception:  # not listening yet, or UNAVAILABLE
                    pass
                time.sleep(0.05)
        finally:
            client.close()
        pytest.fail(f"fastformer-server not ready after {timeout} s\n{self.log()}", pytrace=False)

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

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

    def stop(self):
        """Stops the server; fails when its log holds a sanitizer report."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        text = self.log_path.read_text(errors="replace")
        if m := SANITIZER_REPORT.search(text):
            pytest.fail(f"sanitizer report in {self.log_path}:\n{text[max(0, m.start() - 200):][:12000]}",
                        pytrace=False)


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
    for srv in started:
        srv.stop()


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

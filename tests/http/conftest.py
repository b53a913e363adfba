"""Fixtures for the HTTP listener's tests (tests/http): the real fastformer-server on loopback,
driven by third-party clients (openai, langchain-openai, llama-index's TEI embeddings,
huggingface_hub, tritonclient.http, perf_analyzer), curl and raw sockets.

Run with the venv that `make test-http` makes (.venv-http, mk/http.mk: those clients from PyPI
over Debian's Python, whose PyTorch gives the float64 reference):

    .venv-http/bin/python -m pytest tests/http

  text_model   a demo model (tools/make_demo_model.py) with the demo WordPiece tokenizer.json, a
               3-label classifier head and labels.json; its float64 reference (tools/reference.py)
  embed_model  the same kind with a tokenizer and no classifier head (POST / is /embed there)
  ids_model    no tokenizer (token ids only), a classifier head and no label names (LABEL_i)
  server       one fastformer-server on text_model for the session, with
               --served-model-name alias1,alias2; embed_server, ids_server the same on the others
  start        start(model, **flags): a fresh server, stopped at the end of the test
  grpc_encode  the same inputs through fastformer.v1.Encoder (fastformer-client encode)
  recorder     recorder(port): a forwarding proxy in front of a server that keeps every request
               (what a third-party client actually sends)

The binaries, the server process (Server derives from fastformer_testing's ServerProcess: start
on port 0, log, stop with the sanitizer-report check) come from tools/fastformer_testing.
Expected token ids are worked out by hand from DEMO_WORDS (a token's id is its position), as
tests/kserve/test_text.py does, never asked of the server.
"""

from __future__ import annotations

import concurrent.futures as cf
import http.client
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

if str(Path(__file__).resolve().parents[2] / "tools") not in sys.path:  # tools/: fastformer_testing, the tools
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fastformer_testing import REPO, ServerProcess, binary, server_opts, stop_all  # noqa: E402,F401  (REPO: tests)

import make_demo_model as mdm  # noqa: E402
import reference as ref  # noqa: E402

TOL = 1e-4  # the engine's tolerance to the float64 reference: |ours - ref| <= TOL * max(1, |ref|)
GRPC_TOL = 1e-5  # HTTP against the gRPC Encoder's answer for the same input

BASE_SPEC = dict(hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000, act="gelu")
TEXT_SPEC = dict(BASE_SPEC, seed=11, num_labels=3, model_name="http-text", tokenizer=True)
EMBED_SPEC = dict(BASE_SPEC, seed=12, num_labels=0, model_name="http-embed", tokenizer=True)
IDS_SPEC = dict(BASE_SPEC, seed=13, num_labels=3, model_name="http-ids")
# late chunking's: the demo tokenizer and 8,192 positions (the others have 512)
LONG_SPEC = dict(BASE_SPEC, seed=14, num_labels=0, model_name="http-long", tokenizer=True, max_positions=8192)
TEXT_LABELS = ["negative", "neutral", "positive"]  # text_model's labels.json
ALIASES = ["alias1", "alias2"]  # the shared server's --served-model-name

V = {w: i for i, w in enumerate(mdm.DEMO_WORDS)}


def ids(*tokens):
    return [V[t] for t in tokens]


# text -> its ids by hand: lower-cased, accents stripped, punctuation split, ## continuations
TEXTS = {
    "The quick brown foxes jumped.": ids("[CLS]", "the", "quick", "brown", "fox", "##es", "jump", "##ed", ".", "[SEP]"),
    "Café, HELLO world!": ids("[CLS]", "cafe", ",", "hello", "world", "!", "[SEP]"),
    "zebra": ids("[CLS]", "[UNK]", "[SEP]"),
    "the lazy dog": ids("[CLS]", "the", "lazy", "dog", "[SEP]"),
}
TEXT = "The quick brown foxes jumped."  # the one text most tests send


# ----------------------------------------------------------------------------- plain HTTP


@dataclass
class Reply:
    status: int
    headers: dict  # lower-cased names
    body: bytes

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError:
            raise AssertionError(f"HTTP {self.status}: the body is not JSON: {self.body[:500]!r}") from None

    def error_message(self) -> str:
        """The error text in any of the three APIs' shapes."""
        e = self.json()["error"]
        return e["message"] if isinstance(e, dict) else e


def call(port, method, path, body=None, headers=None, timeout=30.0) -> Reply:
    """One request on a fresh connection. A dict or list body is sent as JSON; bytes as they are."""
    headers = dict(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


# ----------------------------------------------------------------------------- the server


class Server(ServerProcess):
    """One fastformer-server subprocess (fastformer_testing.ServerProcess): gRPC on `port` (`url`),
    /metrics on `metrics_port`, the HTTP listener on `http_port` (`base`: its http:// root). Every
    listener binds port 0 (unless a flag gives an address); these are the ports it reports in its
    log, read (and waited for) when first asked for."""

    def __init__(self, model_dir: Path, log_dir: Path, name: str, env_extra=None, **flags):
        super().__init__(log_dir / f"{name}.log", server_opts({"model-dir": model_dir}, flags), env=env_extra,
                         name=name)

    def wait_ready(self, timeout=30.0):
        """Until GET /health answers 200 (after warm-up; 503 before), and the log says SERVING."""
        self.ports.get("http", timeout)  # the port it bound (fails at once if it exits first)

        def ready():
            r = call(self.http_port, "GET", "/health", timeout=2)
            assert r.status in (200, 503), f"GET /health before ready: {r.status} {r.body[:300]!r}"
            return r.status == 200 and "SERVING" in self.log_text()

        self.wait_for(ready, "GET /health 200 and SERVING in the log", timeout)
        return self

    def call(self, method, path, body=None, headers=None, timeout=30.0) -> Reply:
        return call(self.http_port, method, path, body, headers, timeout)


class Model:
    def __init__(self, root: Path, spec: dict, labels=None):
        self.dir = root / spec["model_name"]
        mdm.make_demo_model(self.dir, preset="tiny", log=lambda *a: None, **spec)
        if labels:
            (self.dir / "labels.json").write_text(json.dumps({"labels": labels}))
        self.ref_model, self.config = ref.load_model_dir(self.dir)
        self.name = spec["model_name"]
        self.hidden = self.config.hidden_size
        self.vocab = self.config.vocab_size
        self.num_labels = spec["num_labels"]
        self.labels = labels or [f"LABEL_{i}" for i in range(self.num_labels)]
        self._cache = {}

    def reference(self, seqs, kind="ids"):
        """float64 reference results (embedding, token_embeddings, logits) per sequence."""
        return ref.reference_encode(self.ref_model, seqs, kind=kind)

    def unit(self, seq):
        """The L2-normalised float64 reference embedding of one id sequence (cached)."""
        key = tuple(seq)
        if key not in self._cache:
            self._cache[key] = unit(self.reference([list(seq)])[0].embedding)
        return self._cache[key]


def unit(v):
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def close(ours, want, tol=TOL):
    """|ours - want| <= tol * max(1, |want|), elementwise; the worst ratio for messages."""
    ours, want = np.asarray(ours, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert ours.shape == want.shape, (ours.shape, want.shape)
    err = np.abs(ours - want) / np.maximum(1.0, np.abs(want))
    return float(err.max(initial=0.0)) <= tol, float(err.max(initial=0.0))


def assert_close(ours, want, tol=TOL, what="embedding"):
    ok, worst = close(ours, want, tol)
    assert ok, f"{what}: differs from the expectation by {worst:.2e} (tolerance {tol})"


@pytest.fixture(scope="session")
def curl(tmp_path_factory):
    """curl on the command line: curl(srv, method, path, body=None, headers=()) -> Reply."""
    exe = shutil.which("curl")
    if exe is None:
        pytest.fail("curl is not installed (apt-get install curl)", pytrace=False)
    root = tmp_path_factory.mktemp("curl")
    count = [0]

    def _curl(srv, method, path, body=None, headers=()) -> Reply:
        count[0] += 1
        out, head = root / f"{count[0]}.body", root / f"{count[0]}.head"
        cmd = [exe, "-s", "-S", "-X", method, "-o", str(out), "-D", str(head), "-w", "%{http_code}",
               "--max-time", "30"]
        for h in headers:
            cmd += ["-H", h]
        if body is not None:
            data = root / f"{count[0]}.in"
            data.write_bytes(body if isinstance(body, bytes) else json.dumps(body).encode())
            cmd += ["-H", "Content-Type: application/json", "--data-binary", f"@{data}"]
        done = subprocess.run(cmd + [f"{srv.base}{path}"], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"curl {method} {path}: exit {done.returncode}: {done.stderr}"
        hdrs = {}
        for line in head.read_text(errors="replace").splitlines()[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                hdrs[k.strip().lower()] = v.strip()
        return Reply(int(done.stdout.strip()), hdrs, out.read_bytes() if out.exists() else b"")

    return _curl


@pytest.fixture(scope="session")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def text_model(models_root):
    return Model(models_root, TEXT_SPEC, labels=TEXT_LABELS)


@pytest.fixture(scope="session")
def embed_model(models_root):
    return Model(models_root, EMBED_SPEC)


@pytest.fixture(scope="session")
def ids_model(models_root):
    return Model(models_root, IDS_SPEC)


@pytest.fixture(scope="session")
def long_model(models_root):
    return Model(models_root, LONG_SPEC)


@pytest.fixture(scope="session")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def server(text_model, logs):
    srv = Server(text_model.dir, logs, "shared-text", served_model_name=",".join(ALIASES)).wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def embed_server(embed_model, logs):
    srv = Server(embed_model.dir, logs, "shared-embed").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def ids_server(ids_model, logs):
    srv = Server(ids_model.dir, logs, "shared-ids").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture
def start(logs, request):
    started = []

    def _start(model, wait=True, env_extra=None, **flags):
        srv = Server(model.dir, logs, f"{request.node.name}-{len(started)}", env_extra=env_extra, **flags)
        started.append(srv)
        return srv.wait_ready() if wait else srv

    yield _start
    stop_all(started)


@pytest.fixture(scope="session")
def grpc_encode(tmp_path_factory):
    """grpc_encode(server, inputs, kind="ids"|"text", normalize=True) -> one dict per input,
    through fastformer.v1.Encoder (fastformer-client encode)."""
    root = tmp_path_factory.mktemp("encode")
    count = [0]

    def _encode(srv, inputs, kind="ids", normalize=True, token_embeddings=False):
        lines = [json.dumps({"token_ids": [int(t) for t in s]} if kind == "ids" else {"text": s}) for s in inputs]
        count[0] += 1
        path = root / f"in-{count[0]}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        cmd = [str(binary("fastformer-client")), "encode", "--target", srv.url, "--input", str(path)]
        cmd += (["--normalize"] if normalize else []) + (["--return-token-embeddings"] if token_embeddings else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]

    return _encode


# ----------------------------------------------------------------------------- what a client sends


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict  # lower-cased names
    body: bytes

    def json(self):
        return json.loads(self.body)


class Recorder:
    """A forwarding HTTP proxy on loopback in front of `upstream` (a port): every request it
    forwards is kept in `requests`, and the server's answer is passed back unchanged."""

    def __init__(self, upstream: int):
        self.requests: list[Recorded] = []
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self):
                n = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(n)
                recorder.requests.append(Recorded(self.command, self.path,
                                                  {k.lower(): v for k, v in self.headers.items()}, body))
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("host", "connection", "content-length", "accept-encoding")}
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=30)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    r = conn.getresponse()
                    data = r.read()
                    self.send_response(r.status)
                    for k, v in r.getheaders():
                        if k.lower() not in ("content-length", "connection", "transfer-encoding", "server", "date"):
                            self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def recorder():
    made = []

    def _make(upstream: int) -> Recorder:
        made.append(Recorder(upstream))
        return made[-1]

    yield _make
    for r in made:
        r.close()


# ----------------------------------------------------------------------------- load alongside


@dataclass
class Load:
    """Good /v1/embeddings requests looped from `threads` threads while a test does something
    else: each answer must be 200 and the expected embedding."""

    srv: Server
    input: object  # the /v1/embeddings input: one text or one id sequence
    want: np.ndarray
    threads: int = 4
    headers: dict = field(default_factory=dict)
    done: list = field(default_factory=list)
    failures: list = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._pool = cf.ThreadPoolExecutor(self.threads)
        self._futures = []

    def _loop(self, k):
        n = 0
        while not self._stop.is_set():
            try:
                r = self.srv.call("POST", "/v1/embeddings", {"input": self.input}, self.headers, timeout=20)
                if r.status != 200:
                    self.failures.append(f"thread {k}: HTTP {r.status} {r.body[:300]!r}")
                else:
                    got = r.json()["data"][0]["embedding"]
                    ok, worst = close(got, self.want)
                    if not ok:
                        self.failures.append(f"thread {k}: embedding off by {worst:.2e}")
            except Exception as e:  # noqa: BLE001 (any failure is a failure of the good traffic)
                self.failures.append(f"thread {k}: {type(e).__name__}: {e}")
            n += 1
            self.done[k] = n

    def __enter__(self):
        self.done = [0] * self.threads
        self._futures = [self._pool.submit(self._loop, k) for k in range(self.threads)]
        self.wait_each(1)
        return self

    def wait_each(self, more=1, timeout=20.0):
        """Until every thread has finished `more` further requests."""
        target = [d + more for d in self.done]
        deadline = time.monotonic() + timeout
        while any(d < t for d, t in zip(self.done, target)):
            assert time.monotonic() < deadline, f"good requests stalled: {self.done} (wanted {target})"
            assert not self.failures, self.failures[:5]
            time.sleep(0.01)

    def __exit__(self, *exc):
        if exc[0] is None:
            self.wait_each(1)
        self._stop.set()
        for f in self._futures:
            f.result(timeout=30)
        self._pool.shutdown()
        if exc[0] is None:
            assert not self.failures, f"{len(self.failures)} good requests failed: {self.failures[:5]}"
            assert sum(self.done) >= 2 * self.threads
            r = self.srv.call("GET", "/health")
            assert r.status == 200, f"GET /health afterwards: {r.status}"
        return False

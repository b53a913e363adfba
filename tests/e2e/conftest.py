"""Shared fixtures for the end-to-end tests of fastformer-server (run: /usr/bin/python3 -m pytest tests/e2e).

The real `fastformer-server` runs on loopback with ephemeral ports, started and stopped by the
tests. What the tests get, all through fixtures (never `from conftest import ...`, which breaks
when several test directories with a conftest.py are collected together):

  e2e       the helpers: generated protobuf modules (e2e.pb, e2e.pb_grpc, e2e.health_pb, ...),
            request building, reference comparison, metrics parsing, gRPC error helpers.
  models    demo models made by tools/make_demo_model.py in a session tmp dir, each with its
            float64 reference (tools/reference.py) and a cache of reference results.
  servers   ServerPool: `servers.start(model, **flags)` a fresh server stopped at the end of
            the test; `servers.shared(model, **flags)` one reused by every test asking for the
            same configuration, stopped at the end of the session.

The binary, the server process (Server derives from fastformer_testing's ServerProcess), its
ports and the sanitizer-report check come from tools/fastformer_testing. A missing
binary is a test FAILURE (FASTFORMER_ALLOW_MISSING_BINARIES=1 turns it into a skip, while
developing). When a test fails, the log (stderr) of every server it used is attached to the report.

Python stubs are generated at session start from proto/ (and tests/e2e/protos/ for health and
reflection) into a temporary directory with protoc + grpc_python_plugin; nothing generated is
committed.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE.parents[1] / "tools") not in sys.path:  # tools/: fastformer_testing, the tools
    sys.path.insert(0, str(HERE.parents[1] / "tools"))

import grpc  # noqa: E402
from fastformer_testing import (REPO, ServerProcess, binary, die_with_parent, fail_on_sanitizer_reports,  # noqa: E402
                                scrape_metrics, server_opts, server_ports, stop_all)

import make_demo_model as mdm  # noqa: E402
import reference as ref  # noqa: E402

ENCODER_SERVICE = "fastformer.v1.Encoder"  # its health entry turns SERVING only after warm-up
TOL = 1e-4  # the engine's tolerance: |ours - ref| <= TOL * max(1, |ref|)
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
RPC_TIMEOUT_S = 60.0


def _load_golden_helpers():
    """tests/golden/conftest.py holds assert_close (the engine's tolerance check); load it under
    its own module name so both suites use the same comparison."""
    spec = importlib.util.spec_from_file_location("fastformer_golden_helpers",
                                                  REPO / "tests" / "golden" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_golden = _load_golden_helpers()
assert_close = _golden.assert_close


# ----------------------------------------------------------------------------- markers, failure logs


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: end-to-end test of fastformer-server (real binary on loopback)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and rep.when in ("setup", "call"):
        pool = item.funcargs.get("servers") if hasattr(item, "funcargs") else None
        for srv in (pool.used if pool is not None else []):
            rep.sections.append((f"{srv.title} log: {srv.log_path}", srv.log_tail()))


# ----------------------------------------------------------------------------- stubs


def _generate_stubs(out_dir: Path) -> types.SimpleNamespace:
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin") or "/usr/bin/grpc_python_plugin"
    if protoc and os.path.exists(plugin):
        base = [protoc, f"--plugin=protoc-gen-grpc_python={plugin}"]
    else:  # grpc_tools bundles protoc and the plugin
        base = [sys.executable, "-m", "grpc_tools.protoc"]
    jobs = [(REPO / "proto", "fastformer/v1/encoder.proto"),
            (HERE / "protos", "grpc_reflection_v1alpha.proto")]
    try:
        importlib.import_module("grpc_health.v1.health_pb2")
        have_grpc_health = True
    except ImportError:
        have_grpc_health = False
        jobs.append((HERE / "protos", "grpc_health_v1.proto"))
    for include, proto in jobs:
        cmd = base + [f"-I{include}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", proto]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"stub generation failed: {' '.join(cmd)}\n{p.stderr}")
    sys.path.insert(0, str(out_dir))
    ns = types.SimpleNamespace()
    ns.pb = importlib.import_module("fastformer.v1.encoder_pb2")
    ns.pb_grpc = importlib.import_module("fastformer.v1.encoder_pb2_grpc")
    ns.refl_pb = importlib.import_module("grpc_reflection_v1alpha_pb2")
    ns.refl_pb_grpc = importlib.import_module("grpc_reflection_v1alpha_pb2_grpc")
    if have_grpc_health:
        ns.health_pb = importlib.import_module("grpc_health.v1.health_pb2")
        ns.health_pb_grpc = importlib.import_module("grpc_health.v1.health_pb2_grpc")
    else:
        ns.health_pb = importlib.import_module("grpc_health_v1_pb2")
        ns.health_pb_grpc = importlib.import_module("grpc_health_v1_pb2_grpc")
    return ns


# ----------------------------------------------------------------------------- metrics


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


class Metrics:
    """A parsed Prometheus text exposition: `types` {family: type}, `samples` [(name, labels, value)]."""

    def __init__(self, text: str):
        self.text = text
        self.types: Dict[str, str] = {}
        self.samples = []
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            m = _SAMPLE_RE.match(line)
            if not m:
                raise ValueError(f"unparsable metrics line: {line!r}")
            labels = dict(_LABEL_RE.findall(m.group(2) or ""))
            self.samples.append((m.group(1), labels, float(m.group(3))))

    def series(self, name, **labels):
        return [(l, v) for n, l, v in self.samples
                if n == name and all(l.get(k) == str(want) for k, want in labels.items())]

    def has(self, name, **labels) -> bool:
        return bool(self.series(name, **labels))

    def value(self, name, **labels) -> float:
        """Sum over the series of `name` whose labels include `labels` (0 when there is none)."""
        return float(sum(v for _, v in self.series(name, **labels)))


# ----------------------------------------------------------------------------- the server


def rpc_code(fn, *args, **kwargs):
    """(status code, details, response) of one call; code OK when it returned."""
    try:
        return grpc.StatusCode.OK, "", fn(*args, **kwargs)
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


class Server(ServerProcess):
    """One fastformer-server subprocess on 127.0.0.1 (fastformer_testing.ServerProcess: start, log,
    stop). Its gRPC, metrics and HTTP listeners bind port 0 (unless the flags give an address):
    `port`, `metrics_port`, `http_port` and `target` are the ports it reports in its log, read
    (and waited for) when first asked for. Here: the gRPC channel, health and metrics."""

    def __init__(self, stubs, model, flags: Dict[str, object], log_dir: Path, name: str,
                 extra_env: Optional[Dict[str, str]] = None):
        self.stubs = stubs
        self.model = model
        self._channels = []
        self.channel = self.stub = self.health = self.reflection = None
        super().__init__(Path(log_dir) / f"{name}.log", server_opts({"model-dir": model.dir}, flags), env=extra_env,
                         name=name, start_timeout=START_TIMEOUT_S, stop_grace=STOP_GRACE_S)

    # --- gRPC
    def wait_listening(self, timeout=START_TIMEOUT_S):
        """Wait until the gRPC port accepts TCP connections, then open the default channel. (A gRPC
        channel that tried before the server listened backs off for seconds before it retries.)"""
        self.ports.get("grpc", timeout)  # the port it bound, from its log (fails if it exits first)
        if self.channel is None:
            host, _, port = self.target.rpartition(":")
            self.wait_for(lambda: socket.create_connection((host.strip("[]"), int(port)), timeout=1).close() or True,
                          f"{self.target} to accept connections", timeout, interval=0.005)
            self.channel = self.new_channel()
            self.stub = self.stubs.pb_grpc.EncoderStub(self.channel)
            self.health = self.stubs.health_pb_grpc.HealthStub(self.channel)
            self.reflection = self.stubs.refl_pb_grpc.ServerReflectionStub(self.channel)
        return self

    def new_channel(self, own_connection=False):
        """A channel to the server; own_connection: its own TCP connection (a separate client)."""
        opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)]
        if own_connection:
            opts.append(("grpc.use_local_subchannel_pool", 1))
        ch = grpc.insecure_channel(self.target, options=opts)
        self._channels.append(ch)
        return ch

    def health_status(self, service="", timeout=2.0) -> str:
        """SERVING / NOT_SERVING / ... or the gRPC code name when the check itself failed."""
        code, _, resp = rpc_code(self.health.Check, self.stubs.health_pb.HealthCheckRequest(service=service),
                                 timeout=timeout)
        if code != grpc.StatusCode.OK:
            return code.name
        return self.stubs.health_pb.HealthCheckResponse.ServingStatus.Name(resp.status)

    def wait_serving(self, timeout=START_TIMEOUT_S):
        # The Encoder's own health entry: gRPC's default one ("") answers SERVING from the moment
        # the port opens until the server sets it NOT_SERVING, a short window in which a probe of
        # "" would take a warming-up server for a ready one.
        deadline = time.monotonic() + timeout
        self.wait_listening(timeout)
        self.wait_for(lambda: self.health_status(service=ENCODER_SERVICE, timeout=1.0) == "SERVING",
                      f"health SERVING of {ENCODER_SERVICE}", max(0.0, deadline - time.monotonic()), interval=0.02)
        return self

    # --- metrics
    def metrics(self) -> Metrics:
        return Metrics(self.scrape())

    def metrics_when(self, pred, timeout=5.0) -> Metrics:
        """Scrape until pred(metrics) holds (metrics may be recorded just after an answer is sent);
        returns the last scrape either way, for the caller's assertions."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            if pred(m) or time.monotonic() >= deadline:
                return m
            time.sleep(0.05)

    # --- process
    def begin_stop(self):
        """Close this side's channels (an idle open connection slows the server's exit) and send SIGTERM."""
        for ch in self._channels:
            ch.close()
        self._channels.clear()
        self.channel = self.stub = self.health = self.reflection = None
        super().begin_stop()


class _SessionServers:
    """The servers shared between tests (key: model and flags), stopped at session end."""

    def __init__(self, stubs, log_dir: Path):
        self.stubs = stubs
        self.log_dir = log_dir
        self.cache: Dict[tuple, Server] = {}
        self.count = 0

    def new(self, model, flags, tag, extra_env=None):
        self.count += 1
        name = f"{self.count:02d}-{tag}-{model.key}"
        return Server(self.stubs, model, flags, self.log_dir, name, extra_env)

    def close(self):
        """Stops them all; a sanitizer report in their logs fails the session's last test."""
        stop_all(self.cache.values())
        self.cache.clear()


class ServerPool:
    """What the `servers` fixture hands to a test."""

    def __init__(self, session: _SessionServers, models, test_name: str):
        self._session = session
        self._models = models
        self._test = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_name)[:60]
        self.fresh: List[Server] = []
        self.used: List[Server] = []

    def start(self, model_key: str, wait=True, extra_env=None, **flags) -> Server:
        """A new server for this test only (stopped at its end); waits for SERVING unless wait=False.
        extra_env: environment variables for it (e.g. FASTFORMER_TEST_FAULTS), else none of FASTFORMER_*."""
        model = self._models.get(model_key)
        srv = self._session.new(model, flags, self._test, extra_env)
        self.fresh.append(srv)
        self.used.append(srv)
        return srv.wait_serving() if wait else srv

    def shared(self, model_key: str, **flags) -> Server:
        """A server reused by every test asking for the same model and flags."""
        key = (model_key, tuple(sorted(flags.items())))
        srv = self._session.cache.get(key)
        if srv is not None and not srv.alive():
            self.used.append(srv)
            del self._session.cache[key]
            pytest.fail(f"shared {srv.title} died (exit {srv.proc.returncode}) during an earlier "
                        f"test\nlog:\n{srv.log_tail()}", pytrace=False)
        if srv is None:
            srv = self._session.new(self._models.get(model_key), flags, "shared")
            self.used.append(srv)
            try:
                srv.wait_serving()
            except BaseException:
                srv.stop(check=False)
                raise
            self._session.cache[key] = srv
        elif srv not in self.used:
            self.used.append(srv)
        return srv

    def close(self):
        stop_all(self.fresh, check=False)


# ----------------------------------------------------------------------------- models


@dataclass
class DemoModel:
    key: str
    dir: Path
    model: object           # reference Model, float64
    config: object          # reference Config
    num_labels: int
    word_embedding: bool
    _cache: dict = field(default_factory=dict)

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def max_positions(self) -> int:
        return self.config.max_position_embeddings

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    def reference(self, seq, kind="ids"):
        """reference_encode of one sequence (a token-id list or an [n, D] array), cached."""
        key = (kind, tuple(int(x) for x in seq)) if kind == "ids" else (kind, np.asarray(seq).tobytes())
        r = self._cache.get(key)
        if r is None:
            r = ref.reference_encode(self.model, [seq], kind=kind)[0]
            self._cache[key] = r
        return r


# key -> make_demo_model arguments
MODEL_SPECS = {
    # the main demo model: D 64, 4 heads, 2 layers, I 128, 512 positions, vocab 1000, 3 labels
    "head": dict(seed=7, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000,
                 num_labels=3, act="gelu", model_name="e2e-head"),
    # "head"'s shape with the demo WordPiece tokenizer.json (make_demo_model --tokenizer): takes text
    "text": dict(seed=9, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000,
                 num_labels=3, act="gelu", tokenizer=True, model_name="e2e-text"),
    # no classifier head and no word embedding: accepts only input embeddings, no logits
    "noemb": dict(seed=8, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000,
                  num_labels=0, act="gelu", word_embedding=False, model_name="e2e-noemb"),
    # late chunking's clients: "text"'s shape and tokenizer with 8,192 positions, no head
    "long": dict(seed=11, hidden=64, heads=4, layers=2, intermediate=128, max_positions=8192, vocab=1000,
                 num_labels=0, act="gelu", tokenizer=True, model_name="e2e-long"),
    # heavier (about 1.6 MFLOP per token): a queue of a few thousand tokens takes visible time
    "load": dict(seed=3, hidden=128, heads=4, layers=4, intermediate=512, max_positions=2048, vocab=1000,
                 num_labels=3, act="gelu_new", model_name="e2e-load"),
    # a 128 MB float16 word embedding that the server converts at load: start-up takes visible time
    "slowload": dict(seed=1, hidden=64, heads=4, layers=2, intermediate=128, max_positions=512,
                     vocab=1_000_000, num_labels=0, act="gelu", dtype="float16", model_name="e2e-slowload"),
}


class Models:
    def __init__(self, root: Path):
        self.root = root
        self._made: Dict[str, DemoModel] = {}

    def get(self, key: str) -> DemoModel:
        m = self._made.get(key)
        if m is None:
            spec = dict(MODEL_SPECS[key])
            d = self.root / key
            mdm.make_demo_model(d, preset="tiny", log=lambda *a: None, **spec)
            model, cfg = ref.load_model_dir(d)
            m = DemoModel(key, d, model, cfg, num_labels=spec["num_labels"],
                          word_embedding=spec.get("word_embedding", True))
            self._made[key] = m
        return m


# ----------------------------------------------------------------------------- inputs and checks


def make_ids(rng, n, vocab, pad=0, pad_frac=0.15):
    """n token ids in [0, vocab) with interior pad tokens (a run of them, and the last one when
    n >= 3); the first is never pad, so no sequence is all pad."""
    ids = rng.integers(0, vocab - 1, n)
    ids = np.where(ids >= pad, ids + 1, ids)  # never pad
    if n >= 3:
        ids[rng.random(n) < pad_frac] = pad
        ids[n // 3: n // 3 + max(1, n // 10)] = pad
        ids[-1] = pad
        ids[0] = ids[0] if ids[0] != pad else (pad + 1) % vocab
    return [int(x) for x in ids]


def make_embeddings(rng, n, hidden):
    """[n, hidden] float32-representable values (as float64), so both sides start from the same numbers."""
    return rng.standard_normal((n, hidden)).astype(np.float32).astype(np.float64)


def make_request(pb, seqs, kind="ids", request_id="", tokens=False, logits=False, normalize=False,
                 truncation=0):
    req = pb.EncodeRequest(request_id=request_id, return_token_embeddings=tokens, return_logits=logits,
                           normalize=normalize, truncation=truncation)
    for s in seqs:
        q = req.sequences.add()
        if kind == "ids":
            q.token_ids.extend(int(x) for x in s)
        else:
            q.input_embeddings.extend(np.asarray(s, dtype=np.float32).ravel().tolist())
    return req


def truncate(seq, max_len, truncation):
    """What the server must encode for TRUNCATION_RIGHT (1) / LEFT (2)."""
    if len(seq) <= max_len:
        return seq
    return seq[:max_len] if truncation == 1 else seq[len(seq) - max_len:]


def check_encoding(label, enc, r, n, hidden, tokens=False, logits=False, normalize=False, tol=TOL):
    """One Encoding against a reference EncodeResult of an n-token sequence."""
    assert enc.num_tokens == n, f"{label}: num_tokens {enc.num_tokens}, expected {n}"
    want = r.embedding / np.linalg.norm(r.embedding) if normalize else r.embedding
    assert_close(f"{label} embedding", list(enc.embedding), want, tol)
    if normalize:
        norm = float(np.linalg.norm(np.asarray(enc.embedding, dtype=np.float64)))
        assert abs(norm - 1.0) < 1e-5, f"{label}: normalized embedding has norm {norm}"
    if tokens:
        got = np.asarray(enc.token_embeddings, dtype=np.float64)
        assert got.size == n * hidden, f"{label}: {got.size} token_embeddings values, expected n*D = {n * hidden}"
        assert_close(f"{label} token_embeddings", got.reshape(n, hidden), r.token_embeddings, tol)
    else:
        assert len(enc.token_embeddings) == 0, f"{label}: token_embeddings returned but not asked for"
    if logits:
        assert_close(f"{label} logits", list(enc.logits), r.logits, tol)
    else:
        assert len(enc.logits) == 0, f"{label}: logits returned but not asked for"


def check_response(label, resp, model, seqs, kind="ids", tokens=False, logits=False, normalize=False,
                   truncation=0, request_id=None):
    """A whole EncodeResponse: request_id, one encoding per sequence in order, each against the reference."""
    if request_id is not None:
        assert resp.request_id == request_id, f"{label}: request_id {resp.request_id!r}, expected {request_id!r}"
    assert not resp.HasField("error"), f"{label}: unexpected error {resp.error.code}: {resp.error.message}"
    assert len(resp.encodings) == len(seqs), f"{label}: {len(resp.encodings)} encodings for {len(seqs)} sequences"
    for i, (enc, s) in enumerate(zip(resp.encodings, seqs)):
        t = truncate(s, model.max_positions, truncation) if truncation else s
        check_encoding(f"{label} seq {i} (n={len(t)})", enc, model.reference(t, kind), len(t), model.hidden,
                       tokens=tokens, logits=logits, normalize=normalize)


def wait_until(fn, timeout, interval=0.05):
    """Poll fn() until it returns a truthy value (returned) or timeout (returns the last value)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    return _generate_stubs(tmp_path_factory.mktemp("stubs"))


@pytest.fixture(scope="session")
def e2e(stubs):
    ns = types.SimpleNamespace(**vars(stubs))
    ns.REPO = REPO
    ns.TOL = TOL
    ns.RPC_TIMEOUT_S = RPC_TIMEOUT_S
    ns.Metrics = Metrics
    ns.scrape = scrape_metrics
    ns.held_port = server_ports.held_port  # a port nothing listens on (a stopped server's address)
    ns.server_ports = server_ports
    ns.require_binary = binary
    ns.die_with_parent = die_with_parent
    ns.rpc_code = rpc_code
    ns.assert_close = assert_close
    ns.make_ids = make_ids
    ns.make_embeddings = make_embeddings
    ns.make_request = lambda *a, **k: make_request(stubs.pb, *a, **k)
    ns.check_encoding = check_encoding
    ns.check_response = check_response
    ns.wait_until = wait_until
    return ns


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    return Models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def _session_servers(stubs, tmp_path_factory):
    pool = _SessionServers(stubs, tmp_path_factory.mktemp("server-logs"))
    yield pool
    pool.close()


@pytest.fixture
def servers(_session_servers, models, request):
    pool = ServerPool(_session_servers, models, request.node.name)
    yield pool
    pool.close()
    fail_on_sanitizer_reports(pool.used)

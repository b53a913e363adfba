"""Fixtures for the model repository tests (tests/repository, issue 25): the real
fastformer-server on loopback serving a Triton-layout repository (--model-repository), driven
by Triton's own clients (tritonclient.grpc and tritonclient.http) and fastformer-loadgen.

Run with the venv that `make test-repository` makes (.venv-triton with tritonclient[grpc,http],
mk/repository.mk; Debian's PyTorch gives the float64 reference):

    .venv-triton/bin/python -m pytest tests/repository

  sources    the demo models (tools/make_demo_model.py), made once a session, each with its
             float64 reference (tools/reference.py): EMBED_V1 and EMBED_V2 (one shape, other
             seeds: their outputs differ) and CLASSIFY (another shape, a 3-label head)
  repo       a fresh repository directory for the test: repo.add("embed", 1, sources.v1), ...
             (each version is copied elsewhere, then renamed into place, so a polling server
             never sees half a directory)
  start      start(repo, **flags): a fresh fastformer-server on the repository, on ephemeral
             loopback ports (gRPC, /metrics, HTTP), stopped at the end of the test (a
             sanitizer report in its log fails the test)
  v1api      fastformer.v1 messages and a raw Encode / GetModelInfo caller, built at run time
             from proto/fastformer/v1/encoder.proto (protoc's descriptor set: no generated
             code, so any protobuf runtime works)

Helpers come by import, not by copy: the binaries, the server process (its start on port 0,
the bound ports read from its log, its stop with the sanitizer-report check) and the clean
environment from tools/fastformer_testing; TOL, close and the Server's KServe
readiness and metrics from tests/kserve/conftest.py; the raw HTTP `call` from
tests/http/conftest.py. fastformer-loadgen comes from $FASTFORMER_LOADGEN when set (test-tsan
runs the TSan server against the Release load generator).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _import(name: str, path: Path):
    """Another suite's conftest as a plain module (its fixtures are not registered here)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


kserve = _import("kserve_conftest", REPO / "tests" / "kserve" / "conftest.py")  # puts tools/ (fastformer_testing) on sys.path
http_helpers = _import("http_conftest", REPO / "tests" / "http" / "conftest.py")

import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
from fastformer_testing import binary, child_env, stop_all  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402

mdm, ref = kserve.mdm, kserve.ref
close, TOL = kserve.close, kserve.TOL
call = http_helpers.call  # call(port, method, path, body=None, headers=None) -> Reply(status, headers, body)

# Small models, so that loads and warm-ups take milliseconds and the suite stays fast.
EMBED_SHAPE = dict(hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000, act="gelu",
                   num_labels=0, model_name="embed")
EMBED_V1 = dict(EMBED_SHAPE, seed=101)
EMBED_V2 = dict(EMBED_SHAPE, seed=202)
CLASSIFY = dict(hidden=32, heads=4, layers=1, intermediate=64, max_positions=256, vocab=500, act="gelu",
                num_labels=3, seed=303, model_name="classify")

rng = np.random.default_rng(25)


class Source:
    """One demo model directory and its float64 reference (cached per sequence)."""

    def __init__(self, root: Path, spec: dict, tag: str):
        self.dir = root / tag
        mdm.make_demo_model(self.dir, preset="tiny", log=lambda *a: None, **spec)
        self.ref_model, self.config = ref.load_model_dir(self.dir)
        self.tag = tag
        self.hidden = self.config.hidden_size
        self.vocab = self.config.vocab_size
        self.max_positions = self.config.max_position_embeddings
        self.num_labels = spec["num_labels"]
        self._cache: dict = {}
        self._lock = threading.Lock()

    def reference(self, seq):
        """The float64 reference (embedding, token_embeddings, logits) of one id sequence."""
        key = tuple(int(t) for t in seq)
        with self._lock:
            if key not in self._cache:
                self._cache[key] = ref.reference_encode(self.ref_model, [list(key)])[0]
            return self._cache[key]

    def seqs(self, lengths):
        """Random id sequences (no pad token) of these lengths."""
        return [rng.integers(1, self.vocab, n).tolist() for n in lengths]


@dataclass
class Sources:
    v1: Source
    v2: Source
    classify: Source


@pytest.fixture(scope="session")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return Sources(Source(root, EMBED_V1, "embed-v1"), Source(root, EMBED_V2, "embed-v2"),
                   Source(root, CLASSIFY, "classify"))


class Repo:
    """A model repository directory: <root>/<model>/<version>/ (Triton's layout)."""

    def __init__(self, root: Path, staging: Path):
        self.root = root
        self.staging = staging
        root.mkdir(parents=True, exist_ok=True)
        staging.mkdir(parents=True, exist_ok=True)
        self.versions: dict = {}  # (model, version) -> Source

    def add(self, model: str, version: int, source: Source, mutate=None) -> Path:
        """Copies source's files to <model>/<version>, atomically (a rename on one filesystem);
        mutate(dir), when given, changes the copy first (a broken version)."""
        tmp = self.staging / f"{model}-{version}-{time.monotonic_ns()}"
        shutil.copytree(source.dir, tmp / str(version))
        if mutate:
            mutate(tmp / str(version))
        if (self.root / model).is_dir():
            os.rename(tmp / str(version), self.root / model / str(version))
        else:  # a new model: its directory appears with its first version in it
            os.rename(tmp, self.root / model)
        self.versions[(model, str(version))] = source
        return self.root / model / str(version)

    def config(self, model: str, text: str):
        (self.root / model).mkdir(exist_ok=True)
        tmp = self.staging / f"{model}-config.pbtxt"
        tmp.write_text(text)
        os.rename(tmp, self.root / model / "config.pbtxt")

    def source(self, model: str, version: str) -> Source:
        return self.versions[(model, str(version))]


@pytest.fixture
def repo(tmp_path):
    return Repo(tmp_path / "repository", tmp_path / "staging")


class Server(kserve.Server):
    """One fastformer-server on a repository (Server(repository, log_dir, name, env_extra=None,
    **flags)): gRPC `url`, /metrics on `metrics_port`, the HTTP listener on `http_port`. Flag
    values may be lists (a repeated flag: --load-model). `pid` is the server's (setpriv execs it)."""

    MODEL_FLAG = "model-repository"

    @property
    def http_url(self) -> str:
        return self.ports.address("http")

    def grpc(self) -> grpcclient.InferenceServerClient:
        return grpcclient.InferenceServerClient(self.url)

    def http(self) -> httpclient.InferenceServerClient:
        return httpclient.InferenceServerClient(self.http_url, network_timeout=60.0, connection_timeout=10.0)

    def rest(self, method, path, body=None, headers=None, timeout=30.0):
        return call(self.http_port, method, path, body, headers, timeout)

    def sighup(self):
        os.kill(self.proc.pid, signal.SIGHUP)

    def index(self, client=None):
        """RepositoryIndex over gRPC: {(name, version): (state, reason)}, and the list in order."""
        own = client is None
        client = client or self.grpc()
        try:
            models = client.get_model_repository_index(as_json=True).get("models", [])
        finally:
            if own:
                client.close()
        return {(m["name"], m.get("version", "")): (m.get("state", ""), m.get("reason", "")) for m in models}, models

    def wait_for(self, predicate, what: str, timeout=20.0, interval=0.05,
                 retry_on=(InferenceServerException, OSError, AssertionError)):
        """ServerProcess.wait_for, where a client's error or a failed assertion is "not yet"."""
        return super().wait_for(predicate, what, timeout, interval, retry_on)

    def rss_kib(self):
        """(VmRSS, VmHWM) of the server process in KiB."""
        fields = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "VmHWM"):
                    fields[k] = int(v.split()[0])
        return fields.get("VmRSS", 0), fields.get("VmHWM", 0)


@pytest.fixture(scope="session")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("logs")


@pytest.fixture
def start(logs, request):
    started = []

    def _start(repo: Repo, wait=True, env_extra=None, **flags) -> Server:
        """env_extra: more environment (FASTFORMER_TEST_FAULTS, server/cmd/test_faults.h)."""
        srv = Server(repo.root, logs, f"{request.node.name}-{len(started)}", env_extra=env_extra, **flags)
        started.append(srv)
        return srv.wait_ready() if wait else srv

    yield _start
    stop_all(started)


# ----------------------------------------------------------------------------- requests and checks


def ids_input(module, seqs, name="input_ids"):
    """One INT64 [B, max len] input (grpcclient or httpclient), right-padded with 0, and its mask."""
    L = max(len(s) for s in seqs)
    ids = np.zeros((len(seqs), L), dtype=np.int64)
    mask = np.zeros((len(seqs), L), dtype=np.int64)
    for r, s in enumerate(seqs):
        ids[r, :len(s)] = s
        mask[r, :len(s)] = 1
    inputs = []
    for n, a in ((name, ids), ("attention_mask", mask)):
        t = module.InferInput(n, list(a.shape), "INT64")
        t.set_data_from_numpy(a)
        inputs.append(t)
    return inputs


def infer(client, module, model, seqs, version="", outputs=("embedding",), **kw):
    """client.infer of id sequences; the result."""
    return client.infer(model, ids_input(module, seqs), model_version=version,
                        outputs=[module.InferRequestedOutput(o) for o in outputs], **kw)


def response_model(result):
    """(model_name, model_version) of a tritonclient gRPC or HTTP result."""
    r = result.get_response()
    if isinstance(r, dict):
        return r.get("model_name"), r.get("model_version")
    return r.model_name, r.model_version


def check_result(result, source: Source, seqs, what=""):
    """Every row's embedding (and logits, when answered) equals source's float64 reference."""
    emb = result.as_numpy("embedding")
    assert emb is not None and emb.shape == (len(seqs), source.hidden), (what, None if emb is None else emb.shape)
    for r, s in enumerate(seqs):
        want = source.reference(s)
        ok, worst = close(emb[r], want.embedding)
        assert ok, f"{what} row {r}: embedding differs from {source.tag}'s float64 reference by {worst:.2e} " \
                   f"(tolerance {TOL})"
        logits = result.as_numpy("logits")
        if logits is not None:
            ok, worst = close(logits[r], want.logits)
            assert ok, f"{what} row {r}: logits differ from {source.tag}'s reference by {worst:.2e}"


def matches(result, source: Source, seqs) -> bool:
    emb = result.as_numpy("embedding")
    if emb is None or emb.shape != (len(seqs), source.hidden):
        return False
    return all(close(emb[r], source.reference(s).embedding)[0] for r, s in enumerate(seqs))


def grpc_error(call_, *args, **kw) -> InferenceServerException:
    """The InferenceServerException that call_ raises (fails when it does not)."""
    with pytest.raises(InferenceServerException) as e:
        call_(*args, **kw)
    return e.value


def desc(e) -> str:
    """An InferenceServerException for a message: its status and text (its repr says nothing)."""
    return f"{e.status()}: {e.message()}"


def percentile(values, p):
    return float(np.percentile(np.asarray(values, dtype=np.float64), p)) if values else float("nan")


# ----------------------------------------------------------------------------- fastformer-loadgen


def loadgen_binary() -> Path:
    override = os.environ.get("FASTFORMER_LOADGEN")
    if override:
        path = Path(override)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"FASTFORMER_LOADGEN={override} is not an executable", pytrace=False)
        return path
    return binary("fastformer-loadgen")


def loadgen_cmd(srv: Server, *args) -> list:
    return [str(loadgen_binary()), "--target", srv.url, "--json", *[str(a) for a in args]]


def parse_loadgen(stdout: str):
    import json
    steps = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert steps, f"fastformer-loadgen printed no JSON step:\n{stdout[-2000:]}"
    return steps


def run_loadgen(srv: Server, *args, timeout=120):
    """Runs fastformer-loadgen to the end; its JSON steps (the exit status must be 0)."""
    out = subprocess.run(loadgen_cmd(srv, *args), capture_output=True, text=True, timeout=timeout, env=child_env())
    assert out.returncode == 0, f"fastformer-loadgen exited {out.returncode}:\n{out.stderr[-3000:]}"
    return parse_loadgen(out.stdout)


class LoadgenProcess:
    """fastformer-loadgen in the background; result() waits for it and parses its steps."""

    def __init__(self, srv: Server, *args):
        self.proc = subprocess.Popen(loadgen_cmd(srv, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=child_env())

    def result(self, timeout=120):
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"fastformer-loadgen did not finish within {timeout} s:\n{err[-3000:]}", pytrace=False)
        assert self.proc.returncode == 0, f"fastformer-loadgen exited {self.proc.returncode}:\n{err[-3000:]}"
        return parse_loadgen(out)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def assert_no_loadgen_errors(step, what="fastformer-loadgen"):
    assert step["errors"] == {} and step["warmup_errors"] == {}, \
        f"{what}: failed requests: measured {step['errors']}, warm-up {step['warmup_errors']}"
    assert step["succeeded"] == step["requests"] and step["requests"] > 0, step


# ----------------------------------------------------------------------------- fastformer.v1, raw


class V1Api:
    """fastformer.v1 messages from the .proto via protoc's descriptor set, and raw unary calls."""

    def __init__(self, workdir: Path):
        import grpc
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        self._grpc = grpc
        desc = workdir / "encoder.desc"
        proto_root = REPO / "proto"
        protoc = shutil.which("protoc")
        base = [protoc] if protoc else [sys.executable, "-m", "grpc_tools.protoc"]
        subprocess.run(base + [f"-I{proto_root}", "--include_imports", f"--descriptor_set_out={desc}",
                               str(proto_root / "fastformer" / "v1" / "encoder.proto")], check=True)
        pool = descriptor_pool.DescriptorPool()
        for f in descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes()).file:
            pool.Add(f)
        for name in ("EncodeRequest", "EncodeResponse", "GetModelInfoRequest", "ModelInfo", "Sequence"):
            setattr(self, name, message_factory.GetMessageClass(pool.FindMessageTypeByName(f"fastformer.v1.{name}")))

    def _unary(self, url, method, request, response_cls, timeout):
        with self._grpc.insecure_channel(url) as channel:
            fn = channel.unary_unary(f"/fastformer.v1.Encoder/{method}",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=response_cls.FromString)
            return fn(request, timeout=timeout)

    def encode(self, url, seqs, model_name="", model_version="", return_logits=False, timeout=30.0):
        req = self.EncodeRequest(model_name=model_name, model_version=model_version, return_logits=return_logits)
        for s in seqs:
            req.sequences.add(token_ids=[int(t) for t in s])
        return self._unary(url, "Encode", req, self.EncodeResponse, timeout)

    def model_info(self, url, model_name="", model_version="", timeout=30.0):
        request = self.GetModelInfoRequest(model_name=model_name, model_version=model_version)
        return self._unary(url, "GetModelInfo", request,
                           self.ModelInfo, timeout)


@pytest.fixture(scope="session")
def v1api(tmp_path_factory):
    return V1Api(tmp_path_factory.mktemp("v1api"))

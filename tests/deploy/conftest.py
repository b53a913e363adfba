"""Fixtures for the deployment-file tests (run: make test-deploy, or
FASTFORMER_BIN_DIR=build/bin /usr/bin/python3 -m pytest tests/deploy).

What the tests get, through fixtures (never `from conftest import ...`):

  deploy_files  paths of the files under test (deploy/compose.yaml, deploy/k8s/, deploy/kserve/, ...)
  flags         fastformer-server's options parsed from its --help: name, env var, default, choices
  model_repository  a model repository (Triton layout) made here: two models, LIVE_MODELS, each
                with version 1 (a copy of the tiny model)
  live_server   a real fastformer-server on that repository (ephemeral ports, default model
                LIVE_MODELS[0], one Encode sent first), up for the session; live_page: its
                /metrics, parsed (deploy_promql.Exposition). Two models, so that every per-model
                series comes twice and a query that forgets to aggregate them shows
  start_server  start_server(**env): a fresh server (one --model-dir) for one test
  run_server_env  run_server_env(env, args=(), while_up=None): starts the real server with a
                deployment file's FASTFORMER_* environment and command-line arguments (model
                paths, addresses and backend swapped for the test's) and returns its log: proves
                the values are ones the server accepts; while_up(server) runs while it serves
                (server.local_port(port) is where a port the file declares is listened on here)

The binaries, the server process (_Server derives from fastformer_testing's ServerProcess) and its
ports come from tools/fastformer_testing; a missing binary is a test failure.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for _path in (HERE, HERE.parents[1] / "tools"):  # deploy_*.py; fastformer_testing
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import deploy_flags  # noqa: E402
import deploy_promql  # noqa: E402
from fastformer_testing import REPO, ServerProcess, binary, child_env, server_ports, stop_all  # noqa: E402
from fastformer_testing.server import LISTENER_FLAGS  # noqa: E402

START_TIMEOUT_S = 30.0
LIVE_MODELS = ("tiny", "tiny-b")   # the live server's repository: <repo>/<name>/1/

# The listening flags: variable, and the port the server listens on without it (its default;
# test_compose_server_matches_flags checks these against --help).
_ADDRESSES = {"listen": ("FASTFORMER_LISTEN", 50051), "http-listen": ("FASTFORMER_HTTP_LISTEN", 8000),
              "metrics-listen": ("FASTFORMER_METRICS_LISTEN", 8002)}


def _tool(name: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found: install Debian's prometheus package (deploy/install-deps.sh)", pytrace=False)
    return path


def _arg_value(args, name):
    """The value of --name in an argument list (--name V or --name=V; the last one wins), else None."""
    value = None
    for i, a in enumerate(args):
        if a == f"--{name}" and i + 1 < len(args):
            value = args[i + 1]
        elif a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
    return value


def _set_arg(args, name, value):
    """args with every --name V / --name=V given the value `value`."""
    out, skip = [], False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a == f"--{name}" and i + 1 < len(args):
            out += [a, value]
            skip = True
        elif a.startswith(f"--{name}="):
            out.append(f"--{name}={value}")
        else:
            out.append(a)
    return out


class _Server(ServerProcess):
    """fastformer-server on 127.0.0.1 with ephemeral ports (fastformer_testing.ServerProcess); env =
    the FASTFORMER_* variables to run with, args = its command-line arguments. Without a model
    variable the model is model_dir (--model-dir); a model variable or argument that is set is used
    as given (the caller has put its own paths there). Every listening address, whether from env,
    args or the default, is moved to 127.0.0.1:0, a port the server binds itself and reports in its
    log (port, metrics_port, http_port, target: read from there when first asked for):
    local_port(p) says where the port p the caller's file declares (or the default one) went."""

    def __init__(self, model_dir: Path, log_path: Path, env=None, args=()):
        env = dict(env or {})
        args = [str(a) for a in args]
        if not any(env.get(k) for k in ("FASTFORMER_MODEL_DIR", "FASTFORMER_MODEL_REPOSITORY")) and \
                _arg_value(args, "model-dir") is None and _arg_value(args, "model-repository") is None:
            env["FASTFORMER_MODEL_DIR"] = str(model_dir)
        self.declared = {}   # a port the caller's file declares -> the listener that stands for it here
        for flag, (var, default_port) in _ADDRESSES.items():
            declared = _arg_value(args, flag) or env.get(var) or f"0.0.0.0:{default_port}"
            self.declared[server_ports.port_of(declared)] = LISTENER_FLAGS[flag]
            env[var] = server_ports.ANY
            args = _set_arg(args, flag, env[var])
        env.setdefault("FASTFORMER_BACKEND", "cpu")
        env.setdefault("FASTFORMER_THREADS", "1")
        self.args = args
        super().__init__(log_path, args=args, env=env, start_timeout=START_TIMEOUT_S, stop_grace=10.0)

    def local_port(self, declared: int) -> int:
        """The port on 127.0.0.1 that stands for the port `declared` of the file under test."""
        assert declared in self.declared, f"port {declared} is none of the server's ports {sorted(self.declared)}"
        return self.ports[self.declared[declared]]

    def wait_serving(self):
        self.wait_for(lambda: "SERVING fastformer.v1" in self.log_text(),   # text and json log formats
                      "SERVING fastformer.v1 in the log", interval=0.02)
        return self


@pytest.fixture(scope="session")
def deploy_files():
    d = REPO / "deploy"
    return types.SimpleNamespace(
        repo=REPO, deploy=d, compose=d / "compose.yaml", prometheus=d / "prometheus" / "prometheus.yml",
        rules=sorted((d / "prometheus" / "rules").glob("*.y*ml")), grafana=d / "grafana",
        dashboard=d / "grafana" / "fastformer-dashboard.json",
        datasources=sorted((d / "grafana" / "provisioning" / "datasources").glob("*.y*ml")),
        dashboard_providers=sorted((d / "grafana" / "provisioning" / "dashboards").glob("*.y*ml")),
        k8s=d / "k8s", adapter_rules=d / "k8s" / "prometheus-adapter-rules.yaml", kserve=d / "kserve",
        dockerfile=REPO / "Dockerfile")


@pytest.fixture(scope="session")
def promtool():
    return _tool("promtool")


@pytest.fixture(scope="session")
def help_text():
    p = subprocess.run([str(binary("fastformer-server")), "--help"], capture_output=True, text=True, timeout=30,
                       env=child_env())
    assert p.returncode == 0, f"fastformer-server --help exited with {p.returncode}:\n{p.stderr}"
    return p.stdout


@pytest.fixture(scope="session")
def flags(help_text):
    parsed = deploy_flags.parse_help(help_text)
    # The checks below read these; if --help stops printing them in this form, fail loudly here.
    for name in ("model-dir", "model-repository", "listen", "metrics-listen", "shutdown-timeout-s"):
        assert name in parsed, f"--{name} not found in fastformer-server --help (format changed?):\n{help_text}"
    for name in ("listen", "metrics-listen", "shutdown-timeout-s"):
        assert parsed[name].default, f"--{name} has no default in --help:\n{help_text}"
    return parsed


@pytest.fixture(scope="session")
def client_health_flags():
    p = subprocess.run([str(binary("fastformer-client")), "health", "--help"], capture_output=True, text=True,
                       timeout=30, env=child_env())
    assert p.returncode == 0, f"fastformer-client health --help exited with {p.returncode}:\n{p.stderr}"
    return deploy_flags.parse_help(p.stdout)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model") / "tiny"
    p = subprocess.run([sys.executable, str(REPO / "tools" / "make_demo_model.py"), "--preset", "tiny", "--seed", "1",
                        "--out", str(d)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"make_demo_model.py failed:\n{p.stdout}\n{p.stderr}"
    return d


@pytest.fixture(scope="session")
def model_repository(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name in LIVE_MODELS:
        shutil.copytree(tiny_model, root / name / "1")
    return root


def _tokens_total(text: str) -> float:
    """fastformer_tokens_total summed over its series (one per model and version)."""
    return sum(float(v) for v in re.findall(r"^fastformer_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M))


@pytest.fixture(scope="session")
def live_server(tiny_model, model_repository, tmp_path_factory):
    """A live server on the two-model repository after one Encode of 4 tokens (so every histogram
    and counter of the default model has moved), up for the session: .page (its /metrics then,
    parsed), .metrics_port, .target, .scrape(), .encode()."""
    srv = _Server(tiny_model, tmp_path_factory.mktemp("live") / "server.log",
                  {"FASTFORMER_MODEL_REPOSITORY": str(model_repository),
                   "FASTFORMER_DEFAULT_MODEL": LIVE_MODELS[0]}).wait_serving()

    def encode():
        p = subprocess.run([str(binary("fastformer-client")), "encode", "--target", srv.target, "--ids", "5,6,7,8",
                            "--deadline-ms", "20000"], capture_output=True, text=True, timeout=30, env=child_env())
        assert p.returncode == 0, f"fastformer-client encode failed ({p.returncode}):\n{p.stderr}\nserver:\n{srv.log_tail()}"

    try:
        encode()
        deadline = time.monotonic() + 5
        while True:   # the counters may be recorded just after the answer is sent
            text = srv.scrape()
            if _tokens_total(text) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert _tokens_total(text) == 4, f"the Encode of 4 tokens is not counted:\n{text}"
        srv.page = deploy_promql.Exposition(text)
        srv.encode = encode
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def start_server(tiny_model, tmp_path):
    """start_server(**env) -> a fresh server (stopped at the end of the test), SERVING."""
    started = []

    def start(**env):
        srv = _Server(tiny_model, tmp_path / f"server-{len(started)}.log", env)
        started.append(srv)
        return srv.wait_serving()

    yield start
    stop_all(started)   # signals all first: they drain and exit in parallel


@pytest.fixture(scope="session")
def live_page(live_server):
    return live_server.page


@pytest.fixture(scope="session")
def run_server_env(tiny_model, model_repository, tmp_path_factory):
    """run(env, args=(), while_up=None) -> (log until SERVING and after SIGTERM, the env it ran with):
    the real server started with a deployment's FASTFORMER_* variables and arguments. A model
    directory that is set becomes the tiny model, a model repository the two-model repository
    (a variable set to "" stays "": that is how a manifest clears the image's), addresses move
    to port 0 on 127.0.0.1 (server.local_port), backend (cuda -> cpu), dtype (float32, the
    parity checks' dtype, where auto would be bfloat16 on a CPU with AVX512_BF16 or AMX) and
    threads are the test's, so check those values separately (choices from --help). while_up(server) runs while it is SERVING: probes, say."""
    logs = tmp_path_factory.mktemp("env-runs")
    count = [0]

    def run(env, args=(), while_up=None):
        count[0] += 1
        env = {k: str(v) for k, v in env.items() if k.startswith("FASTFORMER_")}
        args = [str(a) for a in args]
        if env.get("FASTFORMER_MODEL_DIR"):
            env["FASTFORMER_MODEL_DIR"] = str(tiny_model)
        if env.get("FASTFORMER_MODEL_REPOSITORY"):
            env["FASTFORMER_MODEL_REPOSITORY"] = str(model_repository)
        for flag, value in (("model-dir", tiny_model), ("model-repository", model_repository),
                            ("backend", "cpu"), ("dtype", "float32"), ("threads", "1")):
            if _arg_value(args, flag) is not None:
                args = _set_arg(args, flag, str(value))
        env["FASTFORMER_BACKEND"] = "cpu"
        env["FASTFORMER_DTYPE"] = "float32"
        env["FASTFORMER_THREADS"] = "1"   # 0 (all cores) would be as valid; the test keeps to one
        srv = _Server(tiny_model, logs / f"run-{count[0]}.log", env, args)
        try:
            srv.wait_serving()
            if while_up is not None:
                while_up(srv)
        finally:
            log = srv.stop()
        return log, srv.env

    return run

"""The server process: one fastformer-server on loopback, as every suite and every tool starts it.

A suite's Server derives from ServerProcess and adds its protocol (how it knows the server is
ready: gRPC health, GET /health, KServe's ServerReady, a log line; its clients); a tool (tools/
bench_*.py, soak.py, compare_builds.py) uses it as it is. ServerProcess:

  start    the built binary (binaries.binary; `bin_dir` names another build's) with `opts` as
           flags and `args` after them, in an environment without the caller's FASTFORMER_*
           (plus `env`; `base_env=os.environ` keeps the caller's), behind `prefix` (taskset
           ...), killed if the test runner or the tool dies, stdout and stderr into `log_path`
           (None: to `output`, DEVNULL or the caller's own)
  ports    every listener given 127.0.0.1:0 reports the port it bound in the log:
           port/target/url (gRPC), metrics_port, http_port/base (server_ports.Listeners); a
           listener given a fixed port (a tool's free_port()) is taken as given
  wait     wait_for(predicate, what): polls until the predicate holds; fails the test (raises
           HarnessError in a tool) with the command and the log's tail when the server exits
           first or the time is up. Built on it: wait_grpc_health() (fastformer-client health
           SERVING) and wait_http_ready() (GET /v2/health/ready 200)
  log      log_text(), log_tail(), fail(what)
  stop     SIGTERM, SIGKILL after stop_grace seconds; then a sanitizer report in the log fails
           the test (sanitizers.py). stop_all() signals every server first, so they drain in
           parallel, and checks them all after. `with ServerProcess(...) as srv:` stops it
           (without the check) when the block ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Callable, Iterable, Mapping, Optional

from .binaries import binary, child_env, die_with_parent
from .outcome import fail
from .sanitizers import fail_on_sanitizer_reports
from .server_ports import ANY, Listeners, ServerPorts

SERVER = "fastformer-server"
# Every listener on a port the server binds itself (read from its log), so suites side by side
# cannot collide.
LOOPBACK = {"listen": ANY, "metrics-listen": ANY, "http-listen": ANY}
# The engine of a test server: the CPU backend on 2 threads, in float32. The parity checks'
# tolerance (1e-4) is float32's, and the server's default dtype, auto, is bfloat16 on a CPU with
# AVX512_BF16 or AMX: pinned, every machine gives the same answers. A test of auto itself, or of
# bfloat16, names its dtype in its flags (which override these).
TEST_ENGINE = {"backend": "cpu", "threads": 2, "dtype": "float32"}
# The listening flags by the name server_ports gives their log lines.
LISTENER_FLAGS = {"listen": "grpc", "metrics-listen": "metrics", "http-listen": "http"}


def server_opts(model: Mapping, flags: Mapping, engine: Mapping = TEST_ENGINE) -> dict:
    """A test server's options: `model` ({"model-dir": d} or {"model-repository": d}), every listener
    on port 0, `engine`, then a test's `flags` (max_batch_tokens=8 is --max-batch-tokens 8), which
    override any of these."""
    return {**model, **LOOPBACK, **engine, **{k.replace("_", "-"): v for k, v in flags.items()}}


def command_line(opts: Mapping) -> list:
    """--flag value per option: True is a bare flag (auth_health=True), False and None are left out,
    a list or tuple repeats the flag (--load-model a --load-model b)."""
    args = []
    for flag, value in opts.items():
        for one in (value if isinstance(value, (list, tuple)) else [value]):
            if one is True:
                args.append(f"--{flag}")
            elif one is not False and one is not None:
                args += [f"--{flag}", str(one)]
    return args


def listener_addresses(cmd: Iterable) -> dict:
    """{listener: address} of the listening flags in a command line (--listen A or --listen=A; the
    last one counts, as for the server's own parser)."""
    found = {}
    cmd = [str(c) for c in cmd]
    for i, arg in enumerate(cmd):
        for flag, listener in LISTENER_FLAGS.items():
            if arg == f"--{flag}" and i + 1 < len(cmd):
                found[listener] = cmd[i + 1]
            elif arg.startswith(f"--{flag}="):
                found[listener] = arg.split("=", 1)[1]
    return found


def scrape_metrics(port: int, timeout: float = 5.0) -> str:
    """The Prometheus text of the /metrics listener on 127.0.0.1:port."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout) as r:
        return r.read().decode("utf-8")


class ServerProcess(Listeners):
    """One fastformer-server subprocess. opts: {flag: value} (server_opts() makes a test server's);
    args: more arguments, as given; env: FASTFORMER_* and other variables for it, laid over
    `base_env` (default: the caller's environment without FASTFORMER_*, binaries.child_env());
    name: its tag in messages ("fastformer-server [name]"); bin_dir: where fastformer-server (and
    the fastformer-client of wait_grpc_health) are (default binaries.bin_dir()); prefix: a
    command it runs under (["taskset", "-c", "0"]); log_path: where its stdout and stderr go, or
    None: to `output` (subprocess.DEVNULL, or None for the caller's own), with no log to read."""

    def __init__(self, log_path, opts: Mapping = (), args: Iterable = (), env: Optional[Mapping] = None, *,
                 name: Optional[str] = None, start_timeout: float = 30.0, stop_grace: float = 15.0,
                 bin_dir: Optional[os.PathLike] = None, base_env: Optional[Mapping] = None, prefix: Iterable = (),
                 output=subprocess.DEVNULL):
        opts = dict(opts)
        self.name = name
        self.title = f"{SERVER} [{name}]" if name else SERVER
        self.env = {k: str(v) for k, v in (env or {}).items()}
        self.bin_dir = bin_dir
        self.cmd = [str(binary(SERVER, bin_dir))] + command_line(opts) + [str(a) for a in args]
        self.prefix = [str(p) for p in prefix]
        self.log_path = Path(log_path) if log_path is not None else None
        self.start_timeout = start_timeout
        self.stop_grace = stop_grace
        self.stopped = False
        self.sanitizer_reported = False
        full_env = dict(child_env() if base_env is None else base_env)
        full_env.update(self.env)
        if self.log_path is not None:
            with open(self.log_path, "wb") as log:  # the child has its own descriptor
                self.proc = subprocess.Popen(die_with_parent(self.prefix + self.cmd), stdin=subprocess.DEVNULL,
                                             stdout=log, stderr=subprocess.STDOUT, env=full_env)
        else:
            self.proc = subprocess.Popen(die_with_parent(self.prefix + self.cmd), stdin=subprocess.DEVNULL,
                                         stdout=output, stderr=output, env=full_env)
        self.ports = ServerPorts(self.log_text, self.proc, listener_addresses(self.cmd),
                                 timeout=start_timeout, name=self.title, command=self.command())

    def command(self) -> list:
        """What ran, for messages: the variables it was given, then the command."""
        return [f"{k}={v}" for k, v in sorted(self.env.items())] + self.prefix + self.cmd

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop(check=False)

    # --- process
    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def returncode(self) -> Optional[int]:
        """Its exit code once it has exited (after stop()), else None."""
        return self.proc.poll()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait_exit(self, timeout) -> Optional[int]:
        """Its exit code, or None when it is still running after `timeout` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    # --- log
    def log_text(self) -> str:
        """Its log so far ("" when it has none: log_path None)."""
        if self.log_path is None:
            return ""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, chars: int = 8000) -> str:
        text = self.log_text()
        return text if len(text) <= chars else "...\n" + text[-chars:]

    def fail(self, what: str):
        """Fails the test (raises HarnessError in a tool): "fastformer-server [name] <what>", the
        command and the log's tail."""
        log = f"log:\n{self.log_tail()}" if self.log_path is not None else "log: none kept"
        fail(f"{self.title} {what}\ncommand: {' '.join(self.command())}\n{log}")

    # --- waiting
    def wait_for(self, predicate: Callable, what: str, timeout: Optional[float] = None, interval: float = 0.05,
                 retry_on=(OSError,)):
        """Polls predicate() until it returns a true value (returned); an exception of `retry_on` is
        "not yet". Fails the test when the server exits first, or after `timeout` seconds
        (start_timeout by default)."""
        timeout = self.start_timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        last = None
        while True:
            if self.proc.poll() is not None:
                self.fail(f"exited with code {self.proc.returncode} while waiting for {what}")
            try:
                last = predicate()
            except retry_on as e:
                last = e
            else:
                if last:
                    return last
            if time.monotonic() >= deadline:
                self.fail(f"still waiting for {what} after {timeout:.0f} s (last: {last!r})")
            time.sleep(interval)

    def wait_grpc_health(self, service: Optional[str] = None, timeout: Optional[float] = None,
                         interval: float = 0.1, deadline_ms: Optional[int] = None, client=None):
        """Until `fastformer-client health --target <its gRPC address>` (with --service, and
        --deadline-ms, when given) exits 0: the service is SERVING. `client`: the fastformer-client
        to run (default: the one beside the server, in bin_dir). Returns self."""
        client = str(client or binary("fastformer-client", self.bin_dir))
        target = self.target
        extra = (["--service", service] if service is not None else []) + \
            (["--deadline-ms", str(deadline_ms)] if deadline_ms is not None else [])

        def serving():
            return subprocess.run([client, "health", "--target", target, *extra], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0

        self.wait_for(serving, f"SERVING from {os.path.basename(client)} health{' ' + service if service else ''}",
                      timeout, interval)
        return self

    def wait_http_ready(self, path: str = "/v2/health/ready", timeout: Optional[float] = None,
                        interval: float = 0.1):
        """Until GET <its HTTP base><path> answers 200 (KServe v2's readiness by default). Returns self."""
        url = self.base + path

        def ready():
            with urllib.request.urlopen(url, timeout=1) as r:
                return r.status == 200

        self.wait_for(ready, f"200 from GET {path}", timeout, interval)
        return self

    def scrape(self) -> str:
        """Its /metrics page."""
        return scrape_metrics(self.metrics_port)

    # --- stop
    def begin_stop(self):
        """SIGTERM (a suite's Server closes its clients first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self, check: bool = True) -> str:
        """SIGTERM, then SIGKILL after stop_grace seconds; with `check`, fails the test when the log
        holds a sanitizer report. Returns the log."""
        if not self.stopped:
            self.begin_stop()
            if self.wait_exit(self.stop_grace) is None:
                self.proc.kill()
                self.proc.wait()
            self.stopped = True
        if check:
            fail_on_sanitizer_reports([self])
        return self.log_text()


def stop_all(servers: Iterable[ServerProcess], check: bool = True):
    """Signals every server first, then waits for each (they drain in parallel); with `check`, then
    fails the test on a sanitizer report in any of their logs."""
    servers = list(servers)
    for srv in servers:
        srv.begin_stop()
    for srv in servers:
        srv.stop(check=False)
    if check:
        fail_on_sanitizer_reports(servers)

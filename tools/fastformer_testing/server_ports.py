"""Ports that cannot collide (issue 32, point 7): servers under test bind port 0 and say which
port they got; nothing picks a port for them in advance.

A port found by binding a socket and closing it again is free only for that instant: two
suites starting servers side by side can be handed the same one, and the second server then
fails to start (or, worse, a test talks to the other suite's server). So every listener of a
test server is given 127.0.0.1:0 (ANY) and its bound port is read from its log:

  fastformer-server (server/cmd/server.cc), FASTFORMER:
    grpc     "listening on 127.0.0.1:0 (port 43211), health NOT_SERVING until ..."
    metrics  "metrics on 127.0.0.1:0 (port 43212)"
    http     "HTTP on 127.0.0.1:0 (port 43213): /v1/embeddings, ..." (HTTPS with --tls-cert);
             "HTTP: off" when --http-listen is empty (asking for its port then fails at once)
  Prometheus (--web.listen-address=127.0.0.1:0), PROMETHEUS:
    web      msg="Listening on" address=127.0.0.1:43214

The API (`from fastformer_testing import server_ports`; ServerProcess, fastformer_testing/server.py,
starts a server with every listener on ANY and reads its ports through ServerPorts):

  wait_for_ports(log, listeners=("grpc", "metrics", "http"), proc=None, timeout=30.0, ...)
      -> {listener: port}: waits until the log holds every listener's line. `log` is the log
      file's path, a callable returning the text so far, or a readable stream (the server's
      stderr pipe; what was read is ServerPorts.text, and the caller keeps draining the pipe).
      Fails the test (outcome.fail, with the command and the log's tail) when the server exits
      first, when the listener is off, or when the line does not come within `timeout`.
  ServerPorts(log, proc=None, addresses=None, ...)
      the same, lazily and cached, for a server object's properties: ports["grpc"] waits for
      the gRPC line the first time only; ports.address("grpc") is "127.0.0.1:43211", the
      address a client dials. `addresses` {listener: the address the server was given}: a
      listener given a fixed port (a test binding a busy port on purpose) is not waited for.
  held_port() -> a context manager giving a port bound and held, not listening: connecting to
      it is refused, and no other process can take it while it is held (a "stopped server"
      address). With listen=True it also listens (a busy port for a start-up refusal test).
  port_of(address), client_address(address, port): "host:port" helpers.
  free_port() -> a port free at this instant (bound, then closed): for a tool whose server is
      given fixed ports (tools/bench_*.py); another process may take it before the server binds
      it, which is why no test server uses it.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, Mapping, Optional, Union

from .outcome import fail as _fail

ANY = "127.0.0.1:0"  # loopback, a port the kernel picks when the server binds

# The start-up lines of fastformer-server (server/cmd/server.cc: Server::listen, listen_http,
# open_metrics), in the text and the json log formats alike (the message is the same). A line
# is only taken whole: "(port N)" with its closing parenthesis.
FASTFORMER: Dict[str, re.Pattern] = {
    "grpc": re.compile(r"\blistening on \S+ \(port (\d+)\)"),
    "metrics": re.compile(r"\bmetrics on \S+ \(port (\d+)\)"),
    "http": re.compile(r"\bHTTPS? on \S+ \(port (\d+)\)"),
}
# A listener the server reports as switched off: asking for its port is an error at once.
FASTFORMER_OFF: Dict[str, re.Pattern] = {"http": re.compile(r"\bHTTP: off\b")}

# Prometheus 2.x (exporter-toolkit): the bound address, after "Start listening for connections"
# (which repeats the configured one, port 0).
PROMETHEUS: Dict[str, re.Pattern] = {"web": re.compile(r'msg="Listening on" address=\S*:(\d+)\b')}

Log = Union[str, os.PathLike, Callable[[], str], object]


def port_of(address) -> Optional[int]:
    """The port of host:port ([v6]:port too), or None for what is not one (a unix: address)."""
    m = re.fullmatch(r"(?:\[[^\]]*\]|[^:\[\]/]*):(\d+)", str(address).strip())
    return int(m.group(1)) if m else None


def client_address(address, port: int) -> str:
    """Where a client dials a listener given `address` that bound `port`: a wildcard host is
    reached on loopback."""
    host = str(address).strip().rsplit(":", 1)[0] if port_of(address) is not None else "127.0.0.1"
    if host in ("", "0.0.0.0", "*"):
        host = "127.0.0.1"
    elif host in ("[::]", "::"):
        host = "[::1]"
    return f"{host}:{port}"


class _LogReader:
    """The text a server has logged so far, from a file path, a callable or a stream."""

    def __init__(self, log: Log):
        self._path = self._fn = self._stream = None
        if isinstance(log, (str, os.PathLike)):
            self._path = Path(log)
        elif callable(log) and not hasattr(log, "fileno"):
            self._fn = log
        elif hasattr(log, "fileno"):
            self._stream = log
            self._buf = bytearray()
        else:
            raise TypeError(f"server log: a path, a callable or a readable stream, not {type(log).__name__}")

    def read(self, wait: float = 0.0) -> str:
        """All the text so far (waiting up to `wait` seconds for more on a stream)."""
        if self._path is not None:
            try:
                return self._path.read_text(encoding="utf-8", errors="replace")
            except FileNotFoundError:
                return ""
        if self._fn is not None:
            return self._fn()
        fd = self._stream.fileno()
        while True:
            ready, _, _ = select.select([fd], [], [], wait)
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:  # the other end closed: the server exited
                break
            self._buf += chunk
            wait = 0.0
        return self._buf.decode("utf-8", errors="replace")

    def sleeps_itself(self) -> bool:
        return self._stream is not None


class ServerPorts:
    """The ports one server process reports in its log, each read once, when first asked for.

    log: its log file's path, a callable returning the text so far, or its stdout/stderr pipe.
    proc: its subprocess.Popen (an exit before the line is reported at once, not after timeout).
    addresses: {listener: the address it was given}; one with a fixed port is not waited for.
    patterns / off: {listener: regex}, the port line (group 1: the port) and the "off" line.
    name, command: for the failure message.
    """

    def __init__(self, log: Log, proc=None, addresses: Optional[Mapping[str, object]] = None, *,
                 timeout: float = 30.0, patterns: Mapping[str, re.Pattern] = FASTFORMER,
                 off: Optional[Mapping[str, re.Pattern]] = None, name: str = "fastformer-server",
                 command: Optional[Iterable] = None, tail_chars: int = 6000):
        self._reader = _LogReader(log)
        self.proc = proc
        self.addresses = {k: str(v) for k, v in (addresses or {}).items()}
        self.timeout = timeout
        self.patterns = dict(patterns)
        self.off = dict(FASTFORMER_OFF if off is None and patterns is FASTFORMER else (off or {}))
        self.name = name
        self.command = [str(c) for c in command] if command is not None else None
        self.tail_chars = tail_chars
        self.text = ""
        self._ports: Dict[str, int] = {}
        for listener, address in self.addresses.items():
            fixed = port_of(address)
            if fixed:  # given a port (not 0): that is where it listens, or it fails to start
                self._ports[listener] = fixed

    def __getitem__(self, listener: str) -> int:
        return self.get(listener)

    def get(self, listener: str, timeout: Optional[float] = None) -> int:
        """The port `listener` bound (waits for its log line the first time)."""
        if listener not in self._ports:
            self.wait(listener, timeout=timeout)
        return self._ports[listener]

    def address(self, listener: str, timeout: Optional[float] = None) -> str:
        """host:port for a client of `listener` (a wildcard host becomes loopback)."""
        return client_address(self.addresses.get(listener, ANY), self.get(listener, timeout))

    def found(self) -> Dict[str, int]:
        """The ports known so far, without waiting."""
        return dict(self._ports)

    def wait(self, *listeners: str, timeout: Optional[float] = None) -> Dict[str, int]:
        """Until the log names the port of every one of `listeners` (all of `patterns` when none
        is named): {listener: port}. Fails the test when the process exits first, when one is
        off, or after `timeout` seconds."""
        wanted = list(listeners or self.patterns)
        unknown = [w for w in wanted if w not in self.patterns and w not in self._ports]
        if unknown:
            raise KeyError(f"no log pattern for listener(s) {unknown} (known: {sorted(self.patterns)})")
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            exited = self.proc is not None and self.proc.poll() is not None
            self.text = self._reader.read(wait=0.0 if exited else 0.01)  # after poll(): a dead one's last words
            missing = []
            for w in wanted:
                if w in self._ports:
                    continue
                m = self.patterns[w].search(self.text)
                if m:
                    self._ports[w] = int(m.group(1))
                elif w in self.off and self.off[w].search(self.text):
                    self._failure(f"its {w} listener is off (the log says {self.off[w].pattern!r}), "
                                  f"so it has no {w} port")
                else:
                    missing.append(w)
            if not missing:
                return {w: self._ports[w] for w in wanted}
            if exited:
                self._failure(f"exited with code {self.proc.returncode} before it reported its "
                              f"{', '.join(missing)} port")
            if time.monotonic() >= deadline:
                self._failure(f"reported no {', '.join(missing)} port within {timeout:.0f} s (no log line "
                              f"matching {' / '.join(self.patterns[w].pattern for w in missing)})")
            if not self._reader.sleeps_itself():
                time.sleep(0.01)

    def _failure(self, what: str):
        tail = self.text if len(self.text) <= self.tail_chars else "...\n" + self.text[-self.tail_chars:]
        command = f"\ncommand: {' '.join(self.command)}" if self.command else ""
        _fail(f"{self.name} {what}{command}\nlog:\n{tail}")


class Listeners:
    """The ports of a fastformer-server a fixture started, as its tests read them: a fixture's
    Server class derives from this and sets `self.ports` (a ServerPorts over the server's log).
    Each property waits for its listener's log line the first time it is read."""

    ports: "ServerPorts"

    @property
    def port(self) -> int:
        return self.ports["grpc"]

    @property
    def target(self) -> str:
        """host:port a gRPC client dials."""
        return self.ports.address("grpc")

    url = target

    @property
    def metrics_port(self) -> int:
        return self.ports["metrics"]

    @property
    def http_port(self) -> int:
        return self.ports["http"]

    @property
    def base(self) -> str:
        """http://host:port of the HTTP listener."""
        return f"http://{self.ports.address('http')}"


def wait_for_ports(log: Log, listeners: Iterable[str] = ("grpc", "metrics", "http"), proc=None,
                   timeout: float = 30.0, **kwargs) -> Dict[str, int]:
    """{listener: bound port} once `log` names all of `listeners` (see ServerPorts)."""
    return ServerPorts(log, proc, timeout=timeout, **kwargs).wait(*listeners)


@contextlib.contextmanager
def held_port(host: str = "127.0.0.1", listen: bool = False):
    """A port bound (and, with listen=True, listening) for as long as the block runs. Without
    listen, a connection to it is refused at once, like a stopped server's; either way nothing
    else can bind it meanwhile (no SO_REUSEADDR here, so no reuse can share it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        if listen:
            s.listen(16)
        yield s.getsockname()[1]
    finally:
        s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at this instant (bound, then released): what a tool hands its
    server as --listen host:port. Racy by nature (see above); a test server binds ANY instead."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]

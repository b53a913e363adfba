"""Transport security and bearer tokens of fastformer-server (docs/security.md).

TLS and mutual TLS with certificates made at test time by openssl (a CA, a server certificate
for 127.0.0.1/localhost, a client certificate from that CA and one from another CA); bearer
tokens from --auth-token-file (missing, wrong, right; health and reflection open unless
--auth-health; rotation by SIGHUP); the token never in the server's log; start-up errors for
bad flags and files; metrics bound to loopback only.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from fastformer_testing import child_env  # tools/, on sys.path by conftest

MODEL = "head"
TOKEN = "tok-3f1c9a7e5b2d4c6a8e0f1a2b3c4d5e6f"
WRONG_TOKEN = "tok-00000000wrong0000000000000000000"
NEW_TOKEN = "tok-rotated-9e8d7c6b5a4f3e2d1c0b"
ALL_TOKENS = (TOKEN, WRONG_TOKEN, NEW_TOKEN)
START_TIMEOUT_S = 30.0
RPC_S = 10.0


# ----------------------------------------------------------------------------- certificates


def _openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed:\n{p.stderr}")


def _make_ca(d: Path, name: str):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=fastformer test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)


def _make_leaf(d: Path, name: str, ca: str, extensions: str):
    (d / f"{name}.ext").write_text(extensions)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=fastformer test {name}", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """ca, server (SAN localhost + 127.0.0.1), client (from ca), other_client (from other_ca)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl not found: it makes the test certificates (apt-get install openssl)", pytrace=False)
    d = tmp_path_factory.mktemp("pki")
    _make_ca(d, "ca")
    _make_ca(d, "other_ca")
    _make_leaf(d, "server", "ca", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _make_leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _make_leaf(d, "other_client", "other_ca", "extendedKeyUsage=clientAuth\n")
    return d


def _read(path: Path) -> bytes:
    return path.read_bytes()


def tls_credentials(pki: Path, client: str | None = None, root: str = "ca"):
    if client is None:
        return grpc.ssl_channel_credentials(root_certificates=_read(pki / f"{root}.pem"))
    return grpc.ssl_channel_credentials(root_certificates=_read(pki / f"{root}.pem"),
                                        private_key=_read(pki / f"{client}.key"),
                                        certificate_chain=_read(pki / f"{client}.pem"))


# ----------------------------------------------------------------------------- calls


class Client:
    """Stubs on one channel (plaintext or TLS) to a server, with an optional bearer token."""

    def __init__(self, e2e, srv, credentials=None, token=None):
        self.e2e = e2e
        self.channel = (grpc.secure_channel(srv.target, credentials) if credentials is not None
                        else grpc.insecure_channel(srv.target))
        self.metadata = (("authorization", f"Bearer {token}"),) if token else None
        self.encoder = e2e.pb_grpc.EncoderStub(self.channel)
        self.health_stub = e2e.health_pb_grpc.HealthStub(self.channel)
        self.reflection_stub = e2e.refl_pb_grpc.ServerReflectionStub(self.channel)

    def health(self, service=""):
        """(code, details, status name or None)."""
        code, details, resp = self.e2e.rpc_code(self.health_stub.Check,
                                                self.e2e.health_pb.HealthCheckRequest(service=service),
                                                metadata=self.metadata, timeout=RPC_S)
        name = self.e2e.health_pb.HealthCheckResponse.ServingStatus.Name(resp.status) if resp else None
        return code, details, name

    def encode(self, token_override=...):
        metadata = self.metadata if token_override is ... else token_override
        req = self.e2e.make_request([[5, 6, 7, 8]])
        return self.e2e.rpc_code(self.encoder.Encode, req, metadata=metadata, timeout=RPC_S)

    def model_info(self):
        return self.e2e.rpc_code(self.encoder.GetModelInfo, self.e2e.pb.GetModelInfoRequest(),
                                 metadata=self.metadata, timeout=RPC_S)

    def reflection(self):
        """(code, details): lists the services over the reflection stream."""
        req = self.e2e.refl_pb.ServerReflectionRequest(list_services="")
        try:
            resps = list(self.reflection_stub.ServerReflectionInfo(iter([req]), metadata=self.metadata,
                                                                   timeout=RPC_S))
            assert resps and resps[0].HasField("list_services_response"), f"reflection answered {resps}"
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    def close(self):
        self.channel.close()


def start(servers, **flags):
    return servers.start(MODEL, wait=False, **flags)


def wait_serving(e2e, srv, client: Client, timeout=START_TIMEOUT_S):
    """Wait until health over `client` says SERVING (the conftest's own wait speaks plaintext).
    It asks for the Encoder service: gRPC's health service answers SERVING for "" from the moment
    it starts, an instant before the server sets NOT_SERVING (a window a slow sanitizer build
    makes visible)."""
    deadline = time.monotonic() + timeout
    # Wait for the port first: a channel that tried before the server listened backs off.
    while not _connects("127.0.0.1", srv.port):
        if not srv.alive() or time.monotonic() > deadline:
            pytest.fail(f"server not listening (exit {srv.proc.returncode})\n{srv.log_tail()}", pytrace=False)
        time.sleep(0.01)
    last = None
    while time.monotonic() < deadline:
        if not srv.alive():
            pytest.fail(f"server exited with {srv.proc.returncode}\n{srv.log_tail()}", pytrace=False)
        code, details, status = client.health("fastformer.v1.Encoder")
        last = (code, details, status)
        if status == "SERVING":
            return
        time.sleep(0.05)
    pytest.fail(f"not SERVING after {timeout} s (last health: {last})\n{srv.log_tail()}", pytrace=False)


def assert_no_token_in_log(srv):
    log = srv.log_text()
    for t in ALL_TOKENS:
        assert t not in log, f"a bearer token appears in the server log:\n{srv.log_tail()}"
        assert t[4:20] not in log, f"part of a bearer token appears in the server log:\n{srv.log_tail()}"


def write_tokens(path: Path, *tokens):
    path.write_text("# fastformer test tokens\n\n" + "".join(f"{t}\n" for t in tokens))
    path.chmod(0o600)
    return path


# ----------------------------------------------------------------------------- TLS


def test_tls_handshake_and_plaintext_refused(e2e, servers, pki):
    srv = start(servers, tls_cert=pki / "server.pem", tls_key=pki / "server.key")
    tls = Client(e2e, srv, tls_credentials(pki))
    wait_serving(e2e, srv, tls)
    code, details, resp = tls.encode()
    assert code == grpc.StatusCode.OK, f"Encode over TLS: {code} {details}"
    assert len(resp.encodings) == 1
    assert "TLS" in srv.log_text() and "plaintext (no TLS)" not in srv.log_text()

    plain = Client(e2e, srv)
    code, details, _ = plain.health()
    assert code == grpc.StatusCode.UNAVAILABLE, f"plaintext health on a TLS port: {code} {details}"
    code, details, _ = plain.encode()
    assert code == grpc.StatusCode.UNAVAILABLE, f"plaintext Encode on a TLS port: {code} {details}"

    # A client that trusts another CA refuses the server's certificate.
    untrusting = Client(e2e, srv, tls_credentials(pki, root="other_ca"))
    code, details, _ = untrusting.health()
    assert code == grpc.StatusCode.UNAVAILABLE, f"TLS with the wrong root: {code} {details}"
    for c in (tls, plain, untrusting):
        c.close()
    assert srv.alive()


def test_mutual_tls(e2e, servers, pki):
    srv = start(servers, tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "ca.pem")
    good = Client(e2e, srv, tls_credentials(pki, client="client"))
    wait_serving(e2e, srv, good)
    code, details, _ = good.encode()
    assert code == grpc.StatusCode.OK, f"Encode with the right client certificate: {code} {details}"
    assert "mutual TLS" in srv.log_text()

    for label, creds in (("no client certificate", tls_credentials(pki)),
                         ("a client certificate from another CA", tls_credentials(pki, client="other_client"))):
        c = Client(e2e, srv, creds)
        code, details, _ = c.health()
        assert code == grpc.StatusCode.UNAVAILABLE, f"health with {label}: {code} {details}"
        code, details, _ = c.encode()
        assert code == grpc.StatusCode.UNAVAILABLE, f"Encode with {label}: {code} {details}"
        c.close()
    code, details, _ = good.encode()
    assert code == grpc.StatusCode.OK, f"the right client after refused handshakes: {code} {details}"
    good.close()
    assert srv.alive()


# ----------------------------------------------------------------------------- tokens


def test_bearer_tokens(e2e, servers, tmp_path):
    token_file = write_tokens(tmp_path / "tokens", "tok-another-accepted-token", TOKEN)
    srv = start(servers, auth_token_file=token_file)
    anonymous = Client(e2e, srv)
    wait_serving(e2e, srv, anonymous)  # health needs no token by default
    before = srv.metrics()

    code, details, _ = anonymous.encode()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"Encode without a token: {code} {details}"
    assert "missing bearer token" in details
    code, details, _ = anonymous.model_info()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"GetModelInfo without a token: {code} {details}"

    wrong = Client(e2e, srv, token=WRONG_TOKEN)
    code, details, _ = wrong.encode()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"Encode with a wrong token: {code} {details}"
    assert "invalid bearer token" in details and WRONG_TOKEN not in details and TOKEN not in details
    code, details, _ = anonymous.encode(token_override=(("authorization", f"Basic {TOKEN}"),))
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"a token under another scheme: {code} {details}"

    right = Client(e2e, srv, token=TOKEN)
    code, details, resp = right.encode()
    assert code == grpc.StatusCode.OK, f"Encode with the right token: {code} {details}"
    assert len(resp.encodings) == 1
    code, details, _ = right.model_info()
    assert code == grpc.StatusCode.OK, f"GetModelInfo with the right token: {code} {details}"
    code, details, _ = anonymous.encode(token_override=(("authorization", f"bearer {TOKEN}"),))
    assert code == grpc.StatusCode.OK, f"the scheme is case-insensitive: {code} {details}"

    # Health and reflection stay open without a token.
    code, details, status = anonymous.health()
    assert (code, status) == (grpc.StatusCode.OK, "SERVING"), f"health without a token: {code} {details}"
    code, details = anonymous.reflection()
    assert code == grpc.StatusCode.OK, f"reflection without a token: {code} {details}"

    after = srv.metrics_when(lambda m: m.value("fastformer_auth_failures_total") - before.value(
        "fastformer_auth_failures_total") >= 4)
    delta = lambda reason: (after.value("fastformer_auth_failures_total", reason=reason)
                            - before.value("fastformer_auth_failures_total", reason=reason))
    assert delta("missing") == 3, "missing: Encode, GetModelInfo, Basic scheme"
    assert delta("invalid") == 1
    # Refused calls never reached the service.
    assert after.value("fastformer_requests_total", method="Encode") - before.value(
        "fastformer_requests_total", method="Encode") == 2
    for c in (anonymous, wrong, right):
        c.close()
    assert_no_token_in_log(srv)


def test_auth_health_protects_health_and_reflection(e2e, servers, tmp_path):
    token_file = write_tokens(tmp_path / "tokens", TOKEN)
    srv = start(servers, auth_token_file=token_file, auth_health=True)
    right = Client(e2e, srv, token=TOKEN)
    wait_serving(e2e, srv, right)
    anonymous = Client(e2e, srv)
    code, details, _ = anonymous.health()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"health without a token under --auth-health: {code} {details}"
    code, details = anonymous.reflection()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"reflection without a token: {code} {details}"
    code, details = right.reflection()
    assert code == grpc.StatusCode.OK, f"reflection with the token: {code} {details}"
    wrong = Client(e2e, srv, token=WRONG_TOKEN)
    code, details, _ = wrong.health()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"health with a wrong token: {code} {details}"
    for c in (right, anonymous, wrong):
        c.close()
    assert_no_token_in_log(srv)


def test_mutual_tls_and_token_together(e2e, servers, pki, tmp_path):
    token_file = write_tokens(tmp_path / "tokens", TOKEN)
    srv = start(servers, tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "ca.pem",
                auth_token_file=token_file)
    creds = tls_credentials(pki, client="client")
    right = Client(e2e, srv, creds, token=TOKEN)
    wait_serving(e2e, srv, right)
    code, details, _ = right.encode()
    assert code == grpc.StatusCode.OK, f"mTLS + token: {code} {details}"
    anonymous = Client(e2e, srv, tls_credentials(pki, client="client"))
    code, details, _ = anonymous.encode()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"mTLS without the token: {code} {details}"
    for c in (right, anonymous):
        c.close()
    assert_no_token_in_log(srv)


def test_sighup_rotates_tokens(e2e, servers, tmp_path):
    token_file = write_tokens(tmp_path / "tokens", TOKEN)
    srv = start(servers, auth_token_file=token_file)
    old = Client(e2e, srv, token=TOKEN)
    wait_serving(e2e, srv, old)
    assert old.encode()[0] == grpc.StatusCode.OK
    new = Client(e2e, srv, token=NEW_TOKEN)
    assert new.encode()[0] == grpc.StatusCode.UNAUTHENTICATED

    write_tokens(token_file, NEW_TOKEN)
    srv.signal(signal.SIGHUP)
    assert e2e.wait_until(lambda: new.encode()[0] == grpc.StatusCode.OK, timeout=10), \
        f"the new token is not accepted after SIGHUP\n{srv.log_tail()}"
    code, details, _ = old.encode()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"the old token after rotation: {code} {details}"
    assert "SIGHUP: 1 bearer tokens loaded" in srv.log_text()

    # A broken file on reload keeps the tokens in force and logs an error.
    token_file.write_text("# emptied by mistake\n")
    srv.signal(signal.SIGHUP)
    assert e2e.wait_until(lambda: "holds no token" in srv.log_text(), timeout=10), srv.log_tail()
    assert "keeping the 1 tokens loaded before" in srv.log_text()
    code, details, _ = new.encode()
    assert code == grpc.StatusCode.OK, f"the token in force after a failed reload: {code} {details}"
    token_file.unlink()
    srv.signal(signal.SIGHUP)
    assert e2e.wait_until(lambda: "cannot read the token file" in srv.log_text(), timeout=10), srv.log_tail()
    assert new.encode()[0] == grpc.StatusCode.OK
    assert srv.alive(), "SIGHUP must not stop the server"
    for c in (old, new):
        c.close()
    assert_no_token_in_log(srv)

    # SIGTERM still drains and exits 0 after the SIGHUPs.
    srv.signal(signal.SIGTERM)
    assert srv.wait_exit(15) == 0, srv.log_tail()


def test_sighup_without_token_file_is_harmless(e2e, servers):
    srv = servers.start(MODEL)
    srv.signal(signal.SIGHUP)
    assert e2e.wait_until(lambda: "SIGHUP: no --auth-token-file, nothing to reload" in srv.log_text(), timeout=10), \
        srv.log_tail()
    assert srv.alive(), f"SIGHUP stopped a server without --auth-token-file\n{srv.log_tail()}"
    assert srv.health_status() == "SERVING"


# ----------------------------------------------------------------------------- start-up errors


def _run_server(e2e, models, *args, timeout=60):
    binary = e2e.require_binary("fastformer-server")
    # Every listener on port 0: these start-ups are meant to fail, and one that did not would
    # still take no port another test may be using.
    cmd = [str(binary), "--model-dir", str(models.get(MODEL).dir), "--listen", "127.0.0.1:0",
           "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--backend", "cpu", "--threads", "1",
           *map(str, args)]
    p = subprocess.run(e2e.die_with_parent(cmd), capture_output=True, text=True, timeout=timeout, env=child_env(),
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("case", ["cert_without_key", "key_without_cert", "client_ca_without_cert",
                                  "auth_health_without_tokens"])
def test_flag_combinations_refused(e2e, models, pki, case):
    args = {
        "cert_without_key": ["--tls-cert", pki / "server.pem"],
        "key_without_cert": ["--tls-key", pki / "server.key"],
        "client_ca_without_cert": ["--tls-client-ca", pki / "ca.pem"],
        "auth_health_without_tokens": ["--auth-health"],
    }[case]
    needed = {"cert_without_key": "--tls-key", "key_without_cert": "--tls-cert",
              "client_ca_without_cert": "--tls-cert", "auth_health_without_tokens": "--auth-token-file"}[case]
    code, out = _run_server(e2e, models, *args)
    assert code not in (0, 1), f"exit {code}, expected CLI11's error code:\n{out}"
    assert needed in out, f"the message does not name {needed}:\n{out}"


def test_unreadable_files_fail_startup(e2e, models, pki, tmp_path):
    missing = tmp_path / "missing.pem"
    empty_tokens = tmp_path / "empty-tokens"
    empty_tokens.write_text("# nothing\n\n")
    cases = [
        (["--tls-cert", missing, "--tls-key", pki / "server.key"], "cannot read --tls-cert"),
        (["--tls-cert", pki / "server.pem", "--tls-key", missing], "cannot read --tls-key"),
        (["--tls-cert", pki / "server.key", "--tls-key", pki / "server.pem"], "--tls-cert"),  # swapped
        (["--tls-cert", pki / "server.pem", "--tls-key", pki / "server.key", "--tls-client-ca", missing],
         "cannot read --tls-client-ca"),
        (["--auth-token-file", missing], "--auth-token-file"),
        (["--auth-token-file", empty_tokens], "holds no token"),
    ]
    for args, want in cases:
        code, out = _run_server(e2e, models, *args)
        assert code == 1, f"{args}: exit {code}\n{out}"
        assert "start-up failed" in out and want in out, f"{args}: message lacks {want!r}:\n{out}"

    # A certificate whose key does not match: gRPC refuses to listen.
    code, out = _run_server(e2e, models, "--tls-cert", pki / "server.pem", "--tls-key", pki / "client.key")
    assert code == 1, f"mismatched key: exit {code}\n{out}"
    assert "cannot listen" in out, out


# ----------------------------------------------------------------------------- metrics on loopback


def _non_loopback_ipv4():
    """An address of this host other than loopback, or None."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
        ip = s.getsockname()[0]
    except OSError:
        return None
    finally:
        s.close()
    return None if ip.startswith("127.") or ip == "0.0.0.0" else ip


def _connects(host, port) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_metrics_on_loopback_only(e2e, servers):
    srv = servers.start(MODEL, wait=False, listen="0.0.0.0:0", metrics_listen="127.0.0.1:0")
    srv.wait_serving()  # srv.target: the bound gRPC port on 127.0.0.1
    grpc_port, metrics_port = srv.port, srv.metrics_port
    assert "fastformer_requests_total" in e2e.scrape(metrics_port), "metrics on 127.0.0.1"
    ip = _non_loopback_ipv4()
    if ip is None:
        pytest.skip("this host has no non-loopback IPv4 address to try the metrics port from")
    assert _connects(ip, grpc_port), f"the gRPC port on 0.0.0.0 is not reachable at {ip}"
    assert not _connects(ip, metrics_port), f"the loopback-only metrics port answers on {ip}"
    assert srv.alive()


# ----------------------------------------------------------------------------- the project's clients


def test_project_clients_over_mutual_tls_with_token(e2e, servers, pki, tmp_path):
    """fastformer-client (the C++ client library) and the Python package against a server with
    mutual TLS and a token; the Python client picks up a rotated token file by itself."""
    server_tokens = write_tokens(tmp_path / "server-tokens", TOKEN)
    client_token = tmp_path / "client-token"
    client_token.write_text(TOKEN + "\n")
    srv = start(servers, tls_cert=pki / "server.pem", tls_key=pki / "server.key", tls_client_ca=pki / "ca.pem",
                auth_token_file=server_tokens, auth_health=True)
    wait_serving(e2e, srv, Client(e2e, srv, tls_credentials(pki, client="client"), token=TOKEN))

    cli = e2e.require_binary("fastformer-client")
    env = child_env()
    tls_args = ["--target", srv.target, "--tls-ca", pki / "ca.pem", "--tls-cert", pki / "client.pem",
                "--tls-key", pki / "client.key"]

    def run_cli(*args):
        return subprocess.run([str(cli), *map(str, args)], capture_output=True, text=True, timeout=60, env=env)

    p = run_cli("health", *tls_args, "--token-file", client_token)
    assert p.returncode == 0, f"fastformer-client health: {p.returncode}\n{p.stdout}\n{p.stderr}"
    p = run_cli("encode", *tls_args, "--token-file", client_token, "--ids", "5,6,7,8")
    assert p.returncode == 0 and '"embedding"' in p.stdout, f"fastformer-client encode: {p.returncode}\n{p.stderr}"
    p = run_cli("encode", *tls_args, "--ids", "5,6,7,8")
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr, f"without a token: {p.returncode}\n{p.stderr}"
    p = run_cli("encode", *tls_args[:4], "--token-file", client_token, "--ids", "5,6,7,8")
    assert p.returncode == 1, f"without a client certificate: {p.returncode}\n{p.stderr}"

    py_client = str(e2e.REPO / "client" / "python")
    if py_client not in sys.path:
        sys.path.insert(0, py_client)
    from fastformer_client import Client as PyClient
    from fastformer_client.errors import Unauthenticated

    with PyClient(srv.target, root_certificates=pki / "ca.pem", certificate_chain=pki / "client.pem",
                  private_key=pki / "client.key", token_file=client_token, deadline_s=RPC_S) as py:
        assert py.health() == "SERVING"
        assert py.encode([[5, 6, 7, 8]]).shape[0] == 1
        # Rotation: the server's file, SIGHUP, then the client's file.
        write_tokens(server_tokens, NEW_TOKEN)
        srv.signal(signal.SIGHUP)
        assert e2e.wait_until(lambda: "SIGHUP: 1 bearer tokens loaded" in srv.log_text(), timeout=10)
        with pytest.raises(Unauthenticated):
            py.encode([[5, 6, 7, 8]])
        client_token.write_text(NEW_TOKEN + "\n")
        assert py.encode([[5, 6, 7, 8]]).shape[0] == 1
    assert_no_token_in_log(srv)

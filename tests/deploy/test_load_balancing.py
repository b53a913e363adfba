"""The gRPC service config of deploy/k8s/grpc-service-config.json (docs/deploy.md, "Spreading load
across replicas") does what the docs say, against two real servers: round_robin spreads Encode
calls over both, and its retry policy carries a client through one server's graceful shutdown
(health NOT_SERVING, new calls UNAVAILABLE) without a failed call."""

import json
import re
import sys
import threading
import time

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "client" / "python"))   # the fastformer_client package, from the tree


def _ok_encodes(srv) -> float:
    m = re.search(r'^fastformer_requests_total\{code="OK",method="Encode"\} (\S+)$', srv.scrape(), re.M)
    return float(m.group(1)) if m else 0.0


@pytest.fixture(scope="module")
def service_config():
    path = REPO / "deploy" / "k8s" / "grpc-service-config.json"
    cfg = json.loads(path.read_text())
    assert cfg["loadBalancingConfig"] == [{"round_robin": {}}], cfg
    doc = (REPO / "docs" / "deploy.md").read_text()
    assert "deploy/k8s/grpc-service-config.json" in doc, "docs/deploy.md should point at the service config file"
    return cfg


def _client(targets, cfg):
    from fastformer_client import Client
    # ipv4:a,b is the static-list form of what dns:///fastformer-headless... resolves to
    target = "ipv4:" + ",".join(targets)
    return Client(target, deadline_s=20, channel_options=[("grpc.service_config", json.dumps(cfg)),
                                                          ("grpc.enable_retries", 1)])


def test_round_robin_spreads_calls(start_server, service_config):
    a, b = start_server(), start_server()
    with _client([a.target, b.target], service_config) as client:
        for _ in range(20):
            client.encode([[5, 6, 7]])
    time.sleep(0.2)
    na, nb = _ok_encodes(a), _ok_encodes(b)
    assert na + nb == 20, (na, nb)
    assert na >= 5 and nb >= 5, f"round_robin should spread 20 calls over both servers, got {na} and {nb}"


@pytest.mark.parametrize("retry_cancelled", [True, False], ids=["shipped", "without-CANCELLED"])
def test_retry_policy_rides_through_a_drain(start_server, service_config, retry_cancelled):
    """shipped: the file as it is, no call may fail. without-CANCELLED: the same policy retrying only
    UNAVAILABLE and RESOURCE_EXHAUSTED; a call the server answers CANCELLED as its drain ends (a
    race in the server's drain, reported) makes it xfail, any other failure fails it."""
    cfg = json.loads(json.dumps(service_config))
    codes = cfg["methodConfig"][0]["retryPolicy"]["retryableStatusCodes"]
    assert {"UNAVAILABLE", "RESOURCE_EXHAUSTED"} <= set(codes), codes
    if not retry_cancelled:
        codes[:] = [c for c in codes if c != "CANCELLED"]
    a, b = start_server(), start_server()
    failures, done, stop = [], [0], threading.Event()
    with _client([a.target, b.target], cfg) as client:
        for _ in range(4):
            client.encode([[5, 6, 7]])

        def load():
            while not stop.is_set():
                try:
                    client.encode([[5, 6, 7, 8]])
                    done[0] += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    failures.append(e)

        t = threading.Thread(target=load)
        t.start()
        try:
            time.sleep(0.3)
            log_a = a.stop()      # SIGTERM: drains, refuses new calls with UNAVAILABLE, exits
            time.sleep(0.5)
        finally:
            stop.set()
            t.join(30)
    assert a.proc.returncode == 0, f"server a exited with {a.proc.returncode}:\n{log_a}"
    assert "draining" in log_a
    assert done[0] >= 10, f"only {done[0]} calls completed"
    assert _ok_encodes(b) > 0
    names = [getattr(getattr(e, "code", None), "name", type(e).__name__) for e in failures]
    other = [repr(e) for e, n in zip(failures, names) if n != "CANCELLED"]
    assert not other, f"{len(other)} failed calls during the drain (of {done[0] + len(failures)}): {other[:3]}"
    if failures and not retry_cancelled:
        pytest.xfail(f"{len(failures)} call(s) of {done[0] + len(failures)} answered CANCELLED as the drain ended "
                     f"(server drain race, reported)")
    assert not failures, f"{len(failures)} calls failed with the shipped service config: {[repr(e) for e in failures[:3]]}"

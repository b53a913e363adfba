"""/metrics: every metric exists from start-up with its type, `promtool check metrics` passes, the
counters add up after known traffic, and a real Prometheus (Debian's `prometheus`, started here
with its own config on loopback) scrapes the server and counts the requests sent."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import grpc
import pytest

# family -> type; each must have at least one series from start-up
FAMILIES = {
    "fastformer_requests_total": "counter",
    "fastformer_request_duration_seconds": "histogram",
    "fastformer_queue_duration_seconds": "histogram",
    "fastformer_batch_compute_duration_seconds": "histogram",
    "fastformer_batch_tokens": "histogram",
    "fastformer_batch_sequences": "histogram",
    "fastformer_sequences_total": "counter",
    "fastformer_tokens_total": "counter",
    "fastformer_sequences_dropped_total": "counter",
    "fastformer_queue_tokens": "gauge",
    "fastformer_queue_sequences": "gauge",
    "fastformer_inflight_requests": "gauge",
    "fastformer_model_info": "gauge",
    "process_resident_memory_bytes": "gauge",
    "process_cpu_seconds_total": "counter",
    "process_open_fds": "gauge",
}


def _tool(name):
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not shutil.which(path):
        pytest.fail(f"{name} not found: install Debian's prometheus package (deploy/install-deps.sh)", pytrace=False)
    return path


def promtool_check(text, label):
    p = subprocess.run([_tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    out = (p.stdout + p.stderr).strip()
    print(f"promtool check metrics ({label}): exit {p.returncode}{': ' + out if out else ''}")
    assert p.returncode == 0, f"promtool check metrics ({label}) failed (exit {p.returncode}):\n{out}\n" \
                              f"--- scrape ---\n{text}"


def _traffic(e2e, srv):
    """Known traffic: 5 good Encode, 1 bad Encode, 1 GetModelInfo, one EncodeStream of 2 messages."""
    good = [[[1, 2, 3]], [[4, 0, 5, 6], [7]], [[8] * 20], [[9] * 30], [[10, 11]]]
    for i, seqs in enumerate(good):
        srv.stub.Encode(e2e.make_request(seqs, "ids", request_id=f"g{i}"), timeout=e2e.RPC_TIMEOUT_S)
    code, _, _ = e2e.rpc_code(srv.stub.Encode, e2e.make_request([[-1]], "ids"), timeout=e2e.RPC_TIMEOUT_S)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    stream = [e2e.make_request([[3, 4, 5]], "ids", request_id="s0"), e2e.make_request([[6, 7]], "ids", request_id="s1")]
    assert len(list(srv.stub.EncodeStream(iter(stream), timeout=e2e.RPC_TIMEOUT_S))) == 2
    seqs = [s for req in good for s in req] + [s for q in stream for s in q.sequences]
    return dict(encode_ok=len(good), encode_bad=1, sequences=len(seqs),
                tokens=sum(len(s) if isinstance(s, list) else len(s.token_ids) for s in seqs))


def test_metrics_present_from_startup(e2e, servers):
    srv = servers.start("head")
    m = srv.metrics()
    problems = []
    for name, typ in FAMILIES.items():
        if m.types.get(name) != typ:
            problems.append(f"{name}: TYPE {m.types.get(name)!r}, expected {typ!r}")
        sample = name + "_count" if typ == "histogram" else name
        if not m.has(sample):
            problems.append(f"{name}: no series at start-up")
    for reason in ("deadline", "cancelled"):
        if not m.has("fastformer_sequences_dropped_total", reason=reason):
            problems.append(f'fastformer_sequences_dropped_total{{reason="{reason}"}} missing at start-up')
    assert not problems, "metrics at start-up:\n  " + "\n  ".join(problems) + f"\n--- scrape ---\n{m.text}"
    info = m.series("fastformer_model_info")
    assert len(info) == 1 and info[0][1] == 1.0, f"fastformer_model_info: {info}"
    labels = info[0][0]
    assert set(labels) >= {"model", "dtype", "backend", "device", "version"}, f"model_info labels {labels}"
    assert labels["dtype"] == "float32" and labels["backend"] == "cpu", f"model_info labels {labels}"
    assert labels["model"] and labels["version"], f"model_info labels {labels}"
    assert m.value("process_resident_memory_bytes") > 1e6, "process_resident_memory_bytes"
    assert m.value("process_open_fds") > 0, "process_open_fds"
    assert m.value("process_cpu_seconds_total") >= 0
    for g in ("fastformer_queue_tokens", "fastformer_queue_sequences", "fastformer_inflight_requests"):
        assert m.value(g) == 0, f"{g} = {m.value(g)} on an idle server"


def test_promtool_check_metrics(e2e, servers):
    srv = servers.start("head")
    promtool_check(srv.scrape(), "at start-up")
    _traffic(e2e, srv)
    promtool_check(srv.scrape(), "after traffic")


def test_counters_add_up(e2e, servers):
    srv = servers.start("head")
    before = srv.metrics()
    t = _traffic(e2e, srv)
    tokens_before = before.value("fastformer_tokens_total")
    after = srv.metrics_when(lambda m: m.value("fastformer_tokens_total") - tokens_before >= t["tokens"])
    delta = lambda name, **l: after.value(name, **l) - before.value(name, **l)  # noqa: E731
    assert delta("fastformer_requests_total", method="Encode", code="OK") == t["encode_ok"]
    assert delta("fastformer_requests_total", method="Encode", code="INVALID_ARGUMENT") == t["encode_bad"]
    assert delta("fastformer_requests_total", method="GetModelInfo", code="OK") == 1
    assert delta("fastformer_requests_total", method="EncodeStream") >= 1, "the EncodeStream call is not counted"
    encode_durations = delta("fastformer_request_duration_seconds_count", method="Encode")
    assert t["encode_ok"] <= encode_durations <= t["encode_ok"] + t["encode_bad"], \
        f"request_duration_seconds_count{{method=\"Encode\"}} rose by {encode_durations}"
    assert delta("fastformer_sequences_total") == t["sequences"]
    assert delta("fastformer_tokens_total") == t["tokens"]
    assert delta("fastformer_batch_sequences_sum") == t["sequences"]
    assert delta("fastformer_batch_tokens_sum") == t["tokens"]
    assert delta("fastformer_queue_duration_seconds_count") == t["sequences"]
    batches = delta("fastformer_batch_compute_duration_seconds_count")
    assert batches == delta("fastformer_batch_sequences_count") >= 1, "one compute duration per batch"
    assert delta("fastformer_sequences_dropped_total") == 0
    for g in ("fastformer_queue_tokens", "fastformer_queue_sequences", "fastformer_inflight_requests"):
        assert after.value(g) == 0, f"{g} = {after.value(g)} after the traffic"
    # cumulative buckets: the +Inf bucket equals _count
    for h in ("fastformer_batch_tokens", "fastformer_batch_sequences", "fastformer_queue_duration_seconds"):
        inf = after.value(h + "_bucket", le="+Inf")
        assert inf == after.value(h + "_count"), f"{h}: +Inf bucket {inf} != count {after.value(h + '_count')}"


def _http_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def test_real_prometheus_scrapes_server(e2e, servers, tmp_path):
    srv = servers.start("head")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                   "scrape_configs:\n  - job_name: fastformer\n    static_configs:\n"
                   f"      - targets: ['127.0.0.1:{srv.metrics_port}']\n")
    log = open(tmp_path / "prometheus.log", "wb")
    # Port 0: Prometheus binds a free one and logs it (msg="Listening on" address=127.0.0.1:N).
    cmd = [_tool("prometheus"), f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
           "--web.listen-address=127.0.0.1:0"]
    prom = subprocess.Popen(e2e.die_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    prom_log = lambda: (tmp_path / "prometheus.log").read_text(errors="replace")[-4000:]  # noqa: E731
    try:
        prom_port = e2e.server_ports.wait_for_ports(tmp_path / "prometheus.log", ["web"], prom, timeout=30,
                                                    patterns=e2e.server_ports.PROMETHEUS, name="prometheus",
                                                    command=cmd)["web"]
        base = f"http://127.0.0.1:{prom_port}"
        def ready():
            assert prom.poll() is None, f"prometheus exited with {prom.returncode}:\n{prom_log()}"
            try:
                with urllib.request.urlopen(base + "/-/ready", timeout=1) as r:
                    return r.status == 200
            except OSError:
                return False
        assert e2e.wait_until(ready, 30, 0.2), f"prometheus not ready after 30 s:\n{prom_log()}"
        k = 7
        for i in range(k):
            srv.stub.Encode(e2e.make_request([[1 + i, 2, 3]], "ids", request_id=f"p{i}"), timeout=e2e.RPC_TIMEOUT_S)
        query = 'sum(fastformer_requests_total{method="Encode"})'
        last = {}

        def counted():
            r = _http_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
            last["answer"] = r
            res = r.get("data", {}).get("result", [])
            return bool(res) and float(res[0]["value"][1]) == k
        ok = e2e.wait_until(counted, 30, 0.5)
        up = _http_json(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": 'up{job="fastformer"}'}))
        targets = _http_json(f"{base}/api/v1/targets")
        health = [(t.get("health"), t.get("lastError")) for t in targets["data"]["activeTargets"]]
        print(f"query {query}: {last.get('answer')}; targets {health}")
        assert ok, f"Prometheus did not count {k} Encode requests within 30 s: last answer {last.get('answer')}, " \
                   f"targets {health}, up {up.get('data')}"
        assert up["data"]["result"] and up["data"]["result"][0]["value"][1] == "1", f"up: {up}"
    finally:
        prom.send_signal(signal.SIGTERM)
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()

"""A real Prometheus (Debian's `prometheus`) runs deploy/prometheus/prometheus.yml and its rules
against a live server: the alert rules load and evaluate, and every dashboard query and the
Prometheus Adapter query return series."""

import json
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import deploy_sources

SCRAPES = 3   # rate() needs two samples; wait for three


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())


def _query(base, expr):
    return _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def _grafana_to_promql(expr):
    """What Grafana sends for the dashboard's variables: $__rate_interval a window, $instance All (.*)."""
    expr = re.sub(r"\$__rate_interval|\$__interval|\$__range", "1m", expr)
    return re.sub(r"\$\{?instance\}?", ".*", expr)


@pytest.fixture(scope="module")
def prometheus(deploy_files, live_server, tmp_path_factory):
    binary = shutil.which("prometheus")
    if not binary:
        pytest.fail("prometheus not found: install Debian's prometheus package (deploy/install-deps.sh)", pytrace=False)
    tmp = tmp_path_factory.mktemp("prometheus")
    cfg = deploy_sources.load_yaml_docs(deploy_files.prometheus)[0]
    # The shipped file with the compose hostnames swapped for the live server, absolute rule paths
    # and 1 s intervals; job names, paths and rules as they are.
    cfg["global"].update(scrape_interval="1s", evaluation_interval="1s")
    cfg["rule_files"] = [str(deploy_files.prometheus.parent / r) for r in cfg.get("rule_files", [])]
    jobs = [j for j in cfg["scrape_configs"] if j["job_name"] == "fastformer"]
    assert jobs, "prometheus.yml has no fastformer job"
    jobs[0]["static_configs"] = [{"targets": [f"127.0.0.1:{live_server.metrics_port}"]}]
    cfg["scrape_configs"] = jobs
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = _free_port()
    log_path = tmp / "prometheus.log"
    log = open(log_path, "wb")
    setpriv = shutil.which("setpriv")
    cmd = [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
           f"--web.listen-address=127.0.0.1:{port}"]
    proc = subprocess.Popen(([setpriv, "--pdeathsig", "SIGKILL", "--"] if setpriv else []) + cmd,
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}"
            try:
                res = _query(base, 'count_over_time(up{job="fastformer"}[1m])')["data"]["result"]
                if res and float(res[0]["value"][1]) >= SCRAPES:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"prometheus: fewer than {SCRAPES} scrapes in 30 s:\n" \
                                                f"{log_path.read_text()[-4000:]}"
            time.sleep(0.2)
        live_server.encode()   # some traffic between scrapes, so rates are not all zero
        time.sleep(1.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_target_up_and_rules_healthy(prometheus, deploy_files):
    up = _query(prometheus, 'up{job="fastformer"}')["data"]["result"]
    assert up and up[0]["value"][1] == "1", up
    want = sum(len(deploy_sources.rules_exprs(p)) for p in deploy_files.rules)
    deadline = time.monotonic() + 10
    while True:
        groups = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        evaluated = [r for r in rules if not r.get("lastEvaluation", "").startswith("0001")]
        if len(evaluated) == want or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert len(rules) == want, f"{len(rules)} rules loaded, the files have {want}"
    bad = [(r["name"], r.get("health"), r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad and len(evaluated) == want, f"rules not evaluated cleanly: {bad}, {len(evaluated)}/{want} evaluated"
    # Nothing is wrong with the live server, so no alert fires (FastformerDown would mean the job or target is off).
    firing = [r["name"] for r in rules if r.get("state") == "firing"]
    assert not firing, f"alerts firing against a healthy server: {firing}"


def test_dashboard_and_adapter_queries_return_series(prometheus, deploy_files):
    exprs = [(e.where, _grafana_to_promql(e.expr)) for e in deploy_sources.dashboard_exprs(deploy_files.dashboard)
             if e.expr.strip()]
    for r in deploy_sources.adapter_rules(deploy_files.adapter_rules):
        for s in r.series:
            # the adapter asks per pod; here the scrape has job/instance labels instead of namespace/pod
            q = (r.metrics_query.replace("<<.Series>>", s).replace("<<.LabelMatchers>>", 'job="fastformer"')
                 .replace("<<.GroupBy>>", "instance"))
            exprs.append((f"adapter metricsQuery for {s}", q))
            sq = re.sub(r'(namespace|pod)!=""', "", r.series_query).replace("{,", "{").replace(",}", "}")
            exprs.append((f"adapter seriesQuery (less namespace/pod) {sq}", sq))
    empty = []
    for where, expr in exprs:
        ans = _query(prometheus, expr)
        assert ans["status"] == "success", f"{where}: {expr}: {ans}"
        if not ans["data"]["result"]:
            empty.append(f"{where}: {expr}")
    assert not empty, "queries with no series against a live server:\n" + "\n".join(empty)
    print(f"{len(exprs)} queries, each returned series")

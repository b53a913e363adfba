"""A real Prometheus (Debian's `prometheus`) runs deploy/prometheus/prometheus.yml and its rules
against a live server (two models in its repository): the alert rules load and evaluate, every
dashboard query and the Prometheus Adapter query return series, the adapter gives one series per
pod, and each dashboard legend tells its series apart (a query that forgets to aggregate the
per-model series shows two series under one legend)."""

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import deploy_sources
from fastformer_testing import die_with_parent, server_ports  # tools/, on sys.path through conftest.py

SCRAPES = 3   # rate() needs two samples; wait for three


def _get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read().decode())


def _query(base, expr):
    return _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def _grafana_to_promql(expr):
    """What Grafana sends for the dashboard's variables: $__rate_interval a window, $instance and
    $model All (.*)."""
    expr = re.sub(r"\$__rate_interval|\$__interval|\$__range", "1m", expr)
    return re.sub(r"\$\{?(instance|model)\}?", ".*", expr)


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
    log_path = tmp / "prometheus.log"
    log = open(log_path, "wb")
    # Port 0: Prometheus binds a free one and logs it (msg="Listening on" address=127.0.0.1:N).
    cmd = [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
           "--web.listen-address=127.0.0.1:0"]
    proc = subprocess.Popen(die_with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        port = server_ports.wait_for_ports(log_path, ["web"], proc, timeout=30, patterns=server_ports.PROMETHEUS,
                                           name="prometheus", command=cmd)["web"]
        base = f"http://127.0.0.1:{port}"
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


def test_adapter_query_gives_one_series_per_pod(prometheus, deploy_files):
    """The adapter asks for one value per pod; the per-model series (model, version labels) must be
    summed into it, or the custom metrics API gets several values for one pod."""
    for r in deploy_sources.adapter_rules(deploy_files.adapter_rules):
        for s in r.series:
            q = (r.metrics_query.replace("<<.Series>>", s).replace("<<.LabelMatchers>>", 'job="fastformer"')
                 .replace("<<.GroupBy>>", "instance"))
            res = _query(prometheus, q)["data"]["result"]
            assert len(res) == 1, f"adapter metricsQuery for {s}: {len(res)} series for one pod: {res}"
            assert set(res[0]["metric"]) == {"instance"}, res[0]["metric"]


def test_dashboard_legends_tell_series_apart(prometheus, deploy_files):
    """Every time-series target's legend, filled in with each of its series' labels, is different:
    no two lines of a panel carry the same name (the live server has two models, so a query that
    keeps the model and version labels under a per-instance legend shows up here)."""
    dash = json.loads(deploy_files.dashboard.read_text())

    def panels(ps):
        for p in ps or []:
            yield p
            yield from panels(p.get("panels"))

    clashes, checked = [], 0
    for p in panels(dash.get("panels")):
        for t in p.get("targets") or []:
            if not t.get("expr") or t.get("format") == "table" or p.get("type") == "table":
                continue
            res = _query(prometheus, _grafana_to_promql(t["expr"]))["data"]["result"]
            legend = t.get("legendFormat") or ""
            names = [re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m, lb=r["metric"]: lb.get(m.group(1), ""), legend)
                     if legend else json.dumps(r["metric"], sort_keys=True) for r in res]
            checked += 1
            dup = sorted({n for n in names if names.count(n) > 1})
            if dup:
                clashes.append(f"panel {p.get('title')!r} target {t.get('refId')}: {len(res)} series, legend "
                               f"{legend!r} repeats {dup}: {[r['metric'] for r in res]}")
    assert checked >= 10, checked
    assert not clashes, "legends that do not tell series apart:\n" + "\n".join(clashes)

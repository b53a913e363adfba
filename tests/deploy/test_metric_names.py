"""Every metric the dashboard, the alert rules, the Prometheus Adapter rule and the HPA name is on a
live fastformer-server's /metrics, with the labels and label values the queries match on. The
names come from parsing the PromQL in the files (deploy_promql), never from a list kept here."""

import deploy_promql
import deploy_sources


def _all_exprs(f):
    exprs = deploy_sources.dashboard_exprs(f.dashboard)
    for path in f.rules:
        exprs += deploy_sources.rules_exprs(path)
    exprs += deploy_sources.adapter_exprs(f.adapter_rules)
    return exprs


def test_every_queried_metric_is_on_live_metrics(deploy_files, live_page):
    exprs = _all_exprs(deploy_files)
    defined = deploy_sources.recorded_names(deploy_files.rules)
    problems, used = [], set()
    for e in exprs:
        problems += deploy_promql.check_expr(e.where, e.expr, live_page, e.extra_labels, defined)
        used |= deploy_promql.parse(e.expr).metrics
    assert not problems, "names the live server does not expose:\n" + "\n".join(map(str, problems))
    # The parser found something in each source (an empty parse would pass vacuously).
    assert len([e for e in exprs if "dashboard" in e.where]) >= 10, exprs
    assert any(deploy_promql.parse(e.expr).metrics for e in exprs if "adapter" in e.where)
    print(f"{len(exprs)} expressions, {len(used)} metric names, all on /metrics: {sorted(used)}")


def test_dashboard_shows_what_the_issue_asks_for(deploy_files):
    """request rate by code, latency p50/p99, queue tokens, batch tokens and sequences, tokens/s,
    device memory, dropped sequences, and (issue 25) the model versions' states and per-model
    throughput: each shows up in at least one panel query."""
    exprs = deploy_sources.dashboard_exprs(deploy_files.dashboard)
    parsed = [deploy_promql.parse(e.expr) for e in exprs]
    metrics = set().union(*(p.metrics for p in parsed))
    text = "\n".join(e.expr for e in exprs)
    want = {
        "request rate by code": any("fastformer_requests_total" in p.metrics and "code" in p.grouping for p in parsed),
        "latency p50": "histogram_quantile(0.5," in text.replace(" ", "") or "histogram_quantile(0.50," in text,
        "latency p99": "histogram_quantile(0.99," in text,
        "queue tokens": "fastformer_queue_tokens" in metrics,
        "batch tokens": any(m.startswith("fastformer_batch_tokens") for m in metrics),
        "batch sequences": any(m.startswith("fastformer_batch_sequences") for m in metrics),
        "tokens/s": "fastformer_tokens_total" in metrics,
        "device memory": "fastformer_device_memory_used_bytes" in metrics,
        "dropped sequences": "fastformer_sequences_dropped_total" in metrics,
        "model version states": "fastformer_model_state" in metrics,
        "tokens/s by model version": any("fastformer_tokens_total" in p.metrics and {"model", "version"} <= p.grouping
                                         for p in parsed),
    }
    missing = [k for k, ok in want.items() if not ok]
    assert not missing, f"dashboard lacks: {missing}"


def test_hpa_metric_is_served_by_the_adapter_rule_and_exposed(deploy_files, live_page):
    rules = deploy_sources.adapter_rules(deploy_files.adapter_rules)
    names = deploy_sources.hpa_metric_names(deploy_files.k8s)
    assert names, "no HorizontalPodAutoscaler metric found in deploy/k8s"
    assert "fastformer_queue_tokens" in names, f"the issue asks for an HPA on fastformer_queue_tokens, got {names}"
    exposed = live_page.names()
    for name in names:
        serving = [r for r in rules if name in r.exposed_names()]
        assert serving, (f"HPA metric {name!r} is not a name the adapter rule serves "
                         f"(it serves {sorted(set().union(*(r.exposed_names() for r in rules)))})")
        for r in serving:
            src = [s for s in r.series if r.exposed_name(s) == name]
            assert all(s in exposed for s in src), f"adapter series {src} for {name} not all on /metrics"
        assert name in exposed, f"HPA metric {name} is not on /metrics"


# ----------------------------------------------------------------------------- the checker itself


def test_checker_reports_misspelt_metrics_labels_and_values(live_page):
    """The check above can fail: a bogus metric, label, grouping label or label value is reported."""
    cases = {
        "sum(rate(fastformer_request_totl[5m]))": "fastformer_request_totl",
        'histogram_quantile(0.99, sum by (le) (rate(fastformer_request_duration_seconds{method="Encode"}[5m])))':
            "fastformer_request_duration_seconds is not",   # the family name, not _bucket
        'sum(rate(fastformer_requests_total{methd="Encode"}[5m]))': "label 'methd'",
        'sum(rate(fastformer_requests_total{method="encode"}[5m]))': "method='encode'",
        'sum(rate(fastformer_requests_total{code!~"OK|RESOURCE_EXHAUSTD"}[5m]))': "RESOURCE_EXHAUSTD",
        "sum by (reasn) (rate(fastformer_sequences_dropped_total[5m]))": "'reasn'",
        'label_values(fastformer_modelinfo, instance)': "fastformer_modelinfo",
    }
    for expr, needle in cases.items():
        query, labels = deploy_promql.grafana_query(expr)
        problems = deploy_promql.check_expr("case", query, live_page, labels)
        assert any(needle in str(p) for p in problems), f"{expr!r}: expected a problem with {needle!r}, got {problems}"
    ok = ('histogram_quantile(0.99, sum by (le, instance) (rate(fastformer_request_duration_seconds_bucket'
          '{method="Encode", instance=~"$instance"}[$__rate_interval]))) > on(instance) group_left() up offset 5m')
    assert deploy_promql.check_expr("ok", ok, live_page) == []


def test_parser_keeps_only_metric_names():
    p = deploy_promql.parse(
        'histogram_quantile(0.99, sum without (pod) (rate(a_bucket{le!="+Inf", x=~"1|2"}[5m:30s] offset 1h)))'
        ' / ignoring(code) group_left(method) sum by (method, code) (b_total) and bool 1.5e3'
        ' or count_values("value", c) > Inf unless {__name__="d", job="j"} @ start()')
    assert p.metrics == {"a_bucket", "b_total", "c", "d"}, p.metrics
    assert p.grouping == {"pod", "code", "method"}, p.grouping
    sel = {s.metric: s.matchers for s in p.selectors}
    assert sel["a_bucket"] == [("le", "!=", "+Inf"), ("x", "=~", "1|2")]
    assert sel["d"] == [("job", "=", "j")]

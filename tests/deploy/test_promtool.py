"""promtool accepts the Prometheus config, the rules files, and every PromQL expression of the
dashboard and the Prometheus Adapter rule (as recording rules of a scratch file)."""

import subprocess

import yaml

import deploy_promql
import deploy_sources


def _promtool(promtool, *args):
    p = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
    out = (p.stdout + p.stderr).strip()
    print(f"promtool {' '.join(args)}: exit {p.returncode}\n{out}")
    return p.returncode, out


def test_check_config(promtool, deploy_files):
    rc, out = _promtool(promtool, "check", "config", str(deploy_files.prometheus))
    assert rc == 0, f"promtool check config failed:\n{out}"
    # The config's rule_files glob finds the rules files (promtool says how many it loaded).
    if deploy_files.rules:
        assert f"SUCCESS: {len(deploy_files.rules)} rule files found" in out, out


def test_check_rules(promtool, deploy_files):
    assert deploy_files.rules, "no rules files in deploy/prometheus/rules"
    rc, out = _promtool(promtool, "check", "rules", *map(str, deploy_files.rules))
    assert rc == 0, f"promtool check rules failed:\n{out}"


def test_dashboard_and_adapter_queries_are_valid_promql(promtool, deploy_files, tmp_path):
    exprs = deploy_sources.dashboard_exprs(deploy_files.dashboard) + deploy_sources.adapter_exprs(deploy_files.adapter_rules)
    exprs = [e for e in exprs if e.expr.strip()]
    rules = [{"record": f"check:expr_{i}", "expr": deploy_promql.promtool_safe(e.expr)} for i, e in enumerate(exprs)]
    path = tmp_path / "queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": rules}]}))
    rc, out = _promtool(promtool, "check", "rules", str(path))
    index = "\n".join(f"check:expr_{i} = {e.where}" for i, e in enumerate(exprs))
    assert rc == 0, f"invalid PromQL:\n{out}\n{index}"
    assert f"SUCCESS: {len(rules)} rules found" in out, out


def test_promql_check_catches_a_syntax_error(promtool, tmp_path):
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "x:y", "expr": deploy_promql.promtool_safe("sum by (le) (rate(a_bucket[$__rate_interval])")}]}]}))
    rc, out = _promtool(promtool, "check", "rules", str(path))
    assert rc != 0, out


def test_alert_rules_unit_tests(promtool, deploy_files):
    """`promtool test rules` on tests/deploy/prometheus_alerts_test.yml: each alert fires when it
    should (with its labels and annotations) and stays quiet for a healthy server. Every alert of
    the rules files has a test there."""
    tests = deploy_files.repo / "tests" / "deploy" / "prometheus_alerts_test.yml"
    spec = yaml.safe_load(tests.read_text())
    listed = {(deploy_files.repo / "tests" / "deploy" / f).resolve() for f in spec["rule_files"]}
    assert listed == {p.resolve() for p in deploy_files.rules}, f"the unit tests load {listed}"
    alerts = {r["alert"] for p in deploy_files.rules for doc in deploy_sources.load_yaml_docs(p)
              for g in doc["groups"] for r in g["rules"] if "alert" in r}
    fired = {t["alertname"] for case in spec["tests"] for t in case.get("alert_rule_test") or [] if t.get("exp_alerts")}
    assert alerts <= fired, f"alerts without a test that makes them fire: {sorted(alerts - fired)}"
    rc, out = _promtool(promtool, "test", "rules", str(tests))
    assert rc == 0, f"promtool test rules failed:\n{out}"

"""Where the deployment files name metrics: every PromQL expression of the Grafana dashboard, the
Prometheus rules, the Prometheus Adapter rule, and the HPA's metrics, read from the files."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, List, Optional, Set

import yaml

import deploy_promql


@dataclass
class Expr:
    where: str                 # file and position, for messages
    expr: str                  # PromQL (Grafana variables and adapter templates left in place)
    extra_labels: Set[str] = field(default_factory=set)   # labels the query reads besides its PromQL


def load_yaml_docs(path: Path) -> List[object]:
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _panels(panels) -> Iterator[dict]:
    for p in panels or []:
        yield p
        yield from _panels(p.get("panels"))


def dashboard_exprs(path: Path) -> List[Expr]:
    dash = json.loads(path.read_text())
    out = []
    for p in _panels(dash.get("panels")):
        for t in p.get("targets") or []:
            if "expr" in t:
                out.append(Expr(f"{path.name}: panel {p.get('title')!r} target {t.get('refId')}", t["expr"]))
    for v in (dash.get("templating") or {}).get("list") or []:
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        expr, labels = deploy_promql.grafana_query(q)
        out.append(Expr(f"{path.name}: variable ${v.get('name')}", expr, labels))
    return out


def rules_exprs(path: Path) -> List[Expr]:
    out = []
    for doc in load_yaml_docs(path):
        for g in doc.get("groups") or []:
            for r in g.get("rules") or []:
                name = r.get("alert") or r.get("record")
                out.append(Expr(f"{path.name}: group {g.get('name')} rule {name}", str(r["expr"])))
    return out


def recorded_names(paths) -> Set[str]:
    names = set()
    for path in paths:
        for doc in load_yaml_docs(path):
            for g in doc.get("groups") or []:
                names |= {r["record"] for r in g.get("rules") or [] if "record" in r}
    return names


@dataclass
class AdapterRule:
    series_query: str
    series: List[str]          # metric names the seriesQuery selects
    matches: str
    as_: str
    metrics_query: str

    def exposed_name(self, series: str) -> Optional[str]:
        """The custom-metric name the adapter serves for one series (its name.matches / name.as)."""
        m = re.search(self.matches, series)
        if not m:
            return None
        as_ = self.as_ or ("$1" if m.re.groups == 1 else "$0")
        return re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))) or "", as_)

    def exposed_names(self) -> Set[str]:
        return {n for n in (self.exposed_name(s) for s in self.series) if n}


def adapter_rules(path: Path) -> List[AdapterRule]:
    out = []
    for doc in load_yaml_docs(path):
        rules = doc.get("rules")
        if isinstance(rules, dict):          # the Helm chart's values layout: rules.custom
            rules = rules.get("custom") or []
        for r in rules or []:
            series = sorted(deploy_promql.parse(r["seriesQuery"]).metrics)
            name = r.get("name") or {}
            out.append(AdapterRule(r["seriesQuery"], series, name.get("matches", "^(.*)$"), name.get("as", ""),
                                   r.get("metricsQuery", "")))
    return out


def adapter_exprs(path: Path) -> List[Expr]:
    out = []
    for i, r in enumerate(adapter_rules(path)):
        out.append(Expr(f"{path.name}: rule {i} seriesQuery", r.series_query))
        for s in r.series:
            out.append(Expr(f"{path.name}: rule {i} metricsQuery for {s}", deploy_promql.adapter_expr(r.metrics_query, s)))
    return out


def hpa_metric_names(k8s_dir: Path) -> List[str]:
    """Names of the Pods / Object / External metrics of every HorizontalPodAutoscaler in k8s_dir."""
    names = []
    for path in sorted(k8s_dir.glob("*.y*ml")):
        for doc in load_yaml_docs(path):
            if not isinstance(doc, dict) or doc.get("kind") != "HorizontalPodAutoscaler":
                continue
            for m in doc.get("spec", {}).get("metrics") or []:
                kind = {"Pods": "pods", "Object": "object", "External": "external"}.get(m.get("type"))
                if kind:
                    names.append(m[kind]["metric"]["name"])
    return names

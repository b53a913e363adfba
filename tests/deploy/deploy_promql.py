"""The metric and label names a PromQL expression uses, and a check of them against a /metrics page.

Used by tests/deploy to prove that the Grafana dashboard, the alert rules, the HPA and the
Prometheus Adapter rule only name metrics (and labels, and label values) that a live
fastformer-server exposes. The names are parsed from the expressions, not kept by hand:

  names = promql_selectors('sum by (code) (rate(fastformer_requests_total{method="Encode"}[5m]))')
  -> [Selector(metric='fastformer_requests_total', matchers=[('method', '=', 'Encode')])], grouping {'code'}

The tokenizer drops strings, numbers, durations, Grafana variables ($__rate_interval, $instance),
range and subquery brackets, function and aggregation names, keywords (by, without, on, ignoring,
group_left, group_right, offset, bool, and, or, unless) and the label lists that follow the
grouping keywords. What is left outside a {...} is a metric name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

# ----------------------------------------------------------------------------- tokenizer

_TOKEN_RE = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<var>\$\{[^}]*\}|\$\$?[A-Za-z_][A-Za-z0-9_]*|\[\[[A-Za-z0-9_:]+\]\])
  | (?P<duration>(?:\d+(?:ms|[smhdwy]))+(?![A-Za-z0-9_]))
  | (?P<number>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|!=|==|>=|<=|[=<>+\-*/%^@,(){}\[\]])
""", re.VERBOSE)


@dataclass
class Token:
    kind: str
    text: str


def tokenize(expr: str) -> List[Token]:
    out, pos = [], 0
    while pos < len(expr):
        m = _TOKEN_RE.match(expr, pos)
        if not m:
            raise ValueError(f"cannot tokenize PromQL at {pos}: {expr[pos:pos + 30]!r} in {expr!r}")
        pos = m.end()
        if m.lastgroup not in ("ws", "comment"):
            out.append(Token(m.lastgroup, m.group()))
    return out


# ----------------------------------------------------------------------------- parser

AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"and", "or", "unless", "offset", "bool", "atan2"} | GROUPING | AGGREGATIONS
LITERALS = {"inf", "nan"}


def _unquote(s: str) -> str:
    if s[0] == "`":
        return s[1:-1]
    body = s[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


@dataclass
class Selector:
    metric: Optional[str]                                              # None for a bare {...}
    matchers: List[Tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


@dataclass
class Parsed:
    selectors: List[Selector]
    grouping: Set[str]          # labels named in by(...), without(...), on(...), ignoring(...), group_*(...)

    @property
    def metrics(self) -> Set[str]:
        return {s.metric for s in self.selectors if s.metric}


def parse(expr: str) -> Parsed:
    toks = tokenize(expr)
    selectors: List[Selector] = []
    grouping: Set[str] = set()
    i = 0

    def skip_brackets(i: int) -> int:   # toks[i] is "[": range or subquery, nothing named inside
        depth = 0
        while i < len(toks):
            if toks[i].text == "[":
                depth += 1
            elif toks[i].text == "]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
        raise ValueError(f"unbalanced [ in {expr!r}")

    def matchers(i: int, sel: Selector) -> int:  # toks[i] is "{"
        i += 1
        while i < len(toks) and toks[i].text != "}":
            if toks[i].text == ",":
                i += 1
                continue
            if i + 2 >= len(toks) or toks[i].kind != "ident" or toks[i + 1].kind != "op" \
                    or toks[i + 2].kind not in ("string", "var"):
                raise ValueError(f"bad label matcher near {' '.join(t.text for t in toks[i:i + 3])!r} in {expr!r}")
            label, op, value = toks[i].text, toks[i + 1].text, toks[i + 2].text
            value = _unquote(value) if toks[i + 2].kind == "string" else value
            if label == "__name__" and op == "=":
                sel.metric = value
            else:
                sel.matchers.append((label, op, value))
            i += 3
        if i >= len(toks):
            raise ValueError(f"unbalanced {{ in {expr!r}")
        return i + 1

    def next_text(i: int) -> str:
        return toks[i + 1].text if i + 1 < len(toks) else ""

    while i < len(toks):
        t = toks[i]
        if t.text == "[":
            i = skip_brackets(i)
        elif t.text == "{":                       # a selector without a metric name
            sel = Selector(None)
            i = matchers(i, sel)
            selectors.append(sel)
        elif t.kind == "ident":
            low = t.text.lower()
            if low in GROUPING and next_text(i) == "(":
                i += 2
                while i < len(toks) and toks[i].text != ")":
                    if toks[i].kind == "ident":
                        grouping.add(toks[i].text)
                    i += 1
                i += 1
            elif low in KEYWORDS or low in LITERALS:
                i += 1
            elif next_text(i) == "(":             # a function call
                i += 1
            else:
                sel = Selector(t.text)
                i += 1
                if i < len(toks) and toks[i].text == "{":
                    i = matchers(i, sel)
                selectors.append(sel)
        else:
            i += 1
    return Parsed(selectors, grouping)


# ----------------------------------------------------------------------------- templates around PromQL

_LABEL_VALUES_RE = re.compile(r"^\s*label_values\(\s*(?:(?P<expr>.*?)\s*,\s*)?(?P<label>[A-Za-z_][A-Za-z0-9_]*)\s*\)\s*$",
                              re.S)


def grafana_query(query: str) -> Tuple[str, Set[str]]:
    """A Grafana templating query -> (PromQL part, extra label names it reads).
    label_values(metric{...}, label) and label_values(label); query_result(expr); else plain PromQL."""
    m = _LABEL_VALUES_RE.match(query)
    if m:
        return (m.group("expr") or ""), {m.group("label")}
    m = re.match(r"^\s*query_result\((.*)\)\s*$", query, re.S)
    if m:
        return m.group(1), set()
    m = re.match(r"^\s*(?:metrics|label_names)\((.*)\)\s*$", query, re.S)
    if m:
        return m.group(1), set()
    return query, set()


def adapter_expr(template: str, series: str) -> str:
    """Prometheus Adapter's metricsQuery template with its Go-template fields filled in."""
    return (template.replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", 'namespace="fastformer",pod="p"')
            .replace("<<.GroupBy>>", "pod"))


def promtool_safe(expr: str) -> str:
    """Grafana variables replaced by values that keep the expression valid PromQL (for promtool)."""
    expr = re.sub(r"\$__(?:rate_interval|interval|range)\b|\$\{__(?:rate_interval|interval|range)\}", "5m", expr)
    return re.sub(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*", "x", expr)


# ----------------------------------------------------------------------------- the exposition side


_SAMPLE_RE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+(?:\s+-?\d+)?\s*$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')

# Series Prometheus makes itself for every target (they are never on /metrics), and the ALERTS
# series of alerting rules.
SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
             "scrape_series_added", "ALERTS", "ALERTS_FOR_STATE"}
# Labels a scrape adds (static configs, Kubernetes service discovery of a PodMonitor).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "container", "endpoint", "service", "node"}


class Exposition:
    """A Prometheus text page: sample names -> {label: set of values}, and the TYPE of each family."""

    def __init__(self, text: str):
        self.types: Dict[str, str] = {}
        self.labels: Dict[str, Dict[str, Set[str]]] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            m = _SAMPLE_RE.match(line)
            if not m:
                raise ValueError(f"unparsable metrics line: {line!r}")
            by_label = self.labels.setdefault(m.group(1), {})
            for k, v in _LABEL_RE.findall(m.group(2) or ""):
                by_label.setdefault(k, set()).add(v)

    def names(self) -> Set[str]:
        """Every name a query can select: the sample names, and for each histogram / summary family
        its _bucket, _sum and _count (also when they had no sample on this page)."""
        out = set(self.labels)
        for fam, typ in self.types.items():
            if typ == "histogram":
                out |= {fam + "_bucket", fam + "_sum", fam + "_count"}
            elif typ == "summary":
                out |= {fam, fam + "_sum", fam + "_count"}
            else:
                out.add(fam)
        return out

    def label_values(self, name: str) -> Dict[str, Set[str]]:
        got = dict(self.labels.get(name, {}))
        if name.endswith("_bucket"):
            got.setdefault("le", set())
        return got


@dataclass
class Problem:
    where: str
    what: str

    def __str__(self):
        return f"{self.where}: {self.what}"


def check_expr(where: str, expr: str, page: Exposition, extra_labels: Set[str] = frozenset(),
               defined: Set[str] = frozenset()) -> List[Problem]:
    """Every metric the expression names is on the page (or Prometheus-made / defined by a recording
    rule); every label it matches on or groups by exists on one of its metrics or is a target label;
    every plain label value it matches (=, and each word of an a|b|c regex) is a value the page has."""
    problems: List[Problem] = []
    parsed = parse(expr)
    exposed = page.names()
    known_labels = set(TARGET_LABELS) | set(extra_labels)
    for sel in parsed.selectors:
        if sel.metric is None:
            continue
        if sel.metric in SYNTHETIC or sel.metric in defined:
            known_labels |= {k for k, _, _ in sel.matchers}
            continue
        if sel.metric not in exposed:
            problems.append(Problem(where, f"metric {sel.metric} is not on /metrics"))
            continue
        values = page.label_values(sel.metric)
        known_labels |= set(values)
        for label, op, value in sel.matchers:
            if label in TARGET_LABELS or label in extra_labels:
                continue
            if label not in values:
                problems.append(Problem(where, f"{sel.metric} has no label {label!r} (it has {sorted(values)})"))
                continue
            if "$" in value or label == "le":
                continue
            if op in ("=", "!="):
                words = [value] if value else []
            elif re.fullmatch(r"[A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)*", value):
                words = value.split("|")
            else:
                words = []
            for w in words:
                if w not in values[label]:
                    problems.append(Problem(where, f"{sel.metric}{{{label}{op}{value!r}}}: no series has "
                                                   f"{label}={w!r} (values: {sorted(values[label])})"))
    for label in parsed.grouping:
        if label not in known_labels:
            problems.append(Problem(where, f"groups by label {label!r}, which none of its metrics has"))
    return problems

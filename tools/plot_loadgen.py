#!/usr/bin/env python3
"""Latency versus throughput, from the sweep CSV of fastformer-loadgen, as a PNG.

    fastformer-loadgen --sweep-concurrency 1:64:x2 --csv sweep.csv ...
    python3 tools/plot_loadgen.py --csv sweep.csv --out sweep.png [--title "CPU, 16 threads"]

The CSV has a header row with at least the columns
    step, requests_per_second, tokens_per_second, p50_ms, p90_ms, p99_ms, p999_ms, max_ms, errors
(step: the concurrency or the rate of that sweep step, a column fastformer-loadgen names
`concurrency` or `rate`; other columns are ignored). Each step is one
point: x = throughput (tokens/s by default, --x requests for requests/s), y = p50 and p99 latency in
ms (--percentiles to choose others). Points are joined in step order, so the curve turns back when a
step past saturation delivers less. Steps with errors are marked with a red ring. Several --csv
files (e.g. CPU and GPU) share one plot, labelled by --label or the file name.

Needs matplotlib (Debian: python3-matplotlib); renders with the Agg backend (no display).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path
from typing import Dict, List

REQUIRED = ["step", "requests_per_second", "tokens_per_second", "p50_ms", "p90_ms", "p99_ms", "p999_ms",
            "max_ms", "errors"]
PERCENTILES = {"p50": "p50_ms", "p90": "p90_ms", "p99": "p99_ms", "p999": "p999_ms", "max": "max_ms"}
X_AXES = {"tokens": ("tokens_per_second", "throughput (tokens/s)"),
          "requests": ("requests_per_second", "throughput (requests/s)")}


class CsvError(ValueError):
    pass


def _number(path, line, col, text) -> float:
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise CsvError(f"{path}:{line}: column {col}: not a number: {text!r}") from None
    if math.isnan(v):
        raise CsvError(f"{path}:{line}: column {col}: NaN")
    return v


def read_sweep(path) -> List[Dict[str, object]]:
    """The rows of a sweep CSV, numeric columns as floats (step kept as text too, for labels)."""
    path = Path(path)
    with open(path, newline="", encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip() and not ln.lstrip().startswith("#")]
    reader = csv.DictReader(lines)
    header = [h.strip() for h in (reader.fieldnames or [])]
    # fastformer-loadgen names the step column after the sweep: concurrency or rate.
    step_column = next((c for c in ("step", "concurrency", "rate") if c in header), "step")
    missing = [c for c in REQUIRED if c not in header and not (c == "step" and step_column in header)]
    if missing:
        raise CsvError(f"{path}: missing column(s) {', '.join(missing)} (header: {', '.join(header) or 'none'})")
    rows = []
    for i, raw in enumerate(reader, start=2):
        raw = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        raw["step"] = raw[step_column]
        row: Dict[str, object] = {"step_label": raw["step"]}
        for c in REQUIRED:
            row[c] = _number(path, i, c, raw[c])
        rows.append(row)
    if not rows:
        raise CsvError(f"{path}: no data rows")
    return rows


def _step_text(label: str) -> str:
    try:
        v = float(label)
        return f"{v:g}"
    except ValueError:
        return label


def plot(sweeps, out, title=None, x="tokens", percentiles=("p50", "p99"), logy=False, annotate=True):
    """sweeps: [(label, rows)]. Writes the PNG to `out`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xcol, xlabel = X_AXES[x]
    styles = {"p50": "-", "p90": "-.", "p99": "--", "p999": ":", "max": (0, (1, 3))}
    markers = {"p50": "o", "p90": "v", "p99": "s", "p999": "^", "max": "x"}
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    error_points = 0
    for k, (label, rows) in enumerate(sweeps):
        color = colors[k % len(colors)]
        xs = [r[xcol] for r in rows]
        for p in percentiles:
            ys = [r[PERCENTILES[p]] for r in rows]
            name = f"{label} {p}" if len(sweeps) > 1 else p
            ax.plot(xs, ys, linestyle=styles[p], marker=markers[p], color=color, markersize=4, label=name)
            bad = [(xv, yv) for xv, yv, r in zip(xs, ys, rows) if r["errors"] > 0]
            if bad:
                error_points += len(bad)
                ax.scatter([b[0] for b in bad], [b[1] for b in bad], s=90, facecolors="none", edgecolors="red",
                           linewidths=1.5, zorder=5)
        if annotate:
            top = PERCENTILES[percentiles[-1]]
            for r in rows:
                ax.annotate(_step_text(str(r["step_label"])), (r[xcol], r[top]), textcoords="offset points",
                            xytext=(3, 4), fontsize=7, color=color, alpha=0.8)
    if error_points:
        ax.scatter([], [], s=90, facecolors="none", edgecolors="red", linewidths=1.5, label="step with errors")
    from matplotlib.ticker import EngFormatter
    ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 300k, 1.2M
    ax.set_xlabel(xlabel)
    ax.set_ylabel("latency (ms)")
    if logy:
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)
    ax.set_xlim(left=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(title or "Latency versus throughput" + (" (labels: sweep step)" if annotate else ""))
    fig.tight_layout()
    out = Path(out)
    if out.parent and not out.parent.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--csv", action="append", required=True, metavar="FILE",
                    help="sweep CSV of fastformer-loadgen (repeat to compare sweeps)")
    ap.add_argument("--label", action="append", default=[], help="legend label of each --csv (default: file name)")
    ap.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    ap.add_argument("--title", default=None)
    ap.add_argument("--x", choices=sorted(X_AXES), default="tokens", help="throughput axis (default: tokens)")
    ap.add_argument("--percentiles", default="p50,p99",
                    help=f"comma-separated, of {','.join(PERCENTILES)} (default: p50,p99)")
    ap.add_argument("--logy", action="store_true", help="logarithmic latency axis")
    ap.add_argument("--no-annotate", action="store_true", help="do not label the points with their step")
    args = ap.parse_args(argv)

    percentiles = [p.strip() for p in args.percentiles.split(",") if p.strip()]
    unknown = [p for p in percentiles if p not in PERCENTILES]
    if unknown or not percentiles:
        ap.error(f"--percentiles: unknown {unknown} (choose from {', '.join(PERCENTILES)})")
    if args.label and len(args.label) != len(args.csv):
        ap.error("--label: give one per --csv")
    labels = args.label or [Path(c).stem for c in args.csv]
    try:
        sweeps = [(lab, read_sweep(c)) for lab, c in zip(labels, args.csv)]
    except (OSError, CsvError) as e:
        print(f"plot_loadgen: {e}", file=sys.stderr)
        return 1
    try:
        plot(sweeps, args.out, title=args.title, x=args.x, percentiles=percentiles, logy=args.logy,
             annotate=not args.no_annotate)
    except ImportError as e:
        print(f"plot_loadgen: matplotlib is needed ({e}); Debian: apt-get install python3-matplotlib",
              file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

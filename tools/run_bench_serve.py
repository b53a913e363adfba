#!/usr/bin/env python3
"""`make bench-serve`: the server's throughput and latency curve, recorded in docs/benchmarks.md.

    run_bench_serve.py [--build-dir build] [--models-dir models] [--preset official]
                       [--threads 2] [--sweep 1:32:x2] [--duration 10] [--warmup 2] [--rounds 1]
                       [--docs docs/benchmarks.md] [--no-write] [--json OUT]

Starts fastformer-server on the preset (made with tools/make_demo_model.py if missing),
runs a fastformer-loadgen concurrency sweep (8 sequences of uniform:16:256 tokens a
request), runs fastformer-bench on the same workload and thread count, plots the sweep
(tools/plot_loadgen.py) to docs/images/loadgen-cpu.png, and rewrites the section between
the `bench-serve` markers of docs/benchmarks.md with the table, the commands and the machine.

The rounds, their order and the medians are the bench runner's (fastformer_testing/bench.py):
two scenarios, "sweep" (a fresh server, the sweep, the server stopped, so fastformer-bench never
shares the CPU with it) and "fastformer-bench", alternated --rounds times. With one round the
sweep's CSV is the table; with more, each round's CSV is kept (bench-serve-sweep-<round>.csv) and
bench-serve-sweep.csv holds each step's medians (errors: the sum over the rounds). The machine
line is the runner's machine description; --json OUT writes the runner's record (tool, date,
command, commit, machine, every run, the medians) with the sweep's rows and the ratio.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fastformer_testing import ServerProcess, free_port
from fastformer_testing.bench import Runner, Scenario

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench-serve:begin -->", "<!-- bench-serve:end -->"


def run(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kw)


# The sweep CSV's columns after the step (fastformer-loadgen's csv_header) and how each is written.
CSV_FORMATS = {"requests_per_second": "{:.3f}", "tokens_per_second": "{:.1f}", "p50_ms": "{:.3f}",
               "p90_ms": "{:.3f}", "p99_ms": "{:.3f}", "p999_ms": "{:.3f}", "max_ms": "{:.3f}", "errors": "{:.0f}"}


def read_sweep(path) -> tuple:
    """A sweep CSV's header and its figures: {step: {column: float, or None for an empty cell}}."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = [r for r in reader if r]
    figures = {}
    for row in rows:
        cells = dict(zip(header, row))
        figures[row[0]] = {k: float(v) if v.strip() else None for k, v in cells.items() if k != header[0]}
    return header, figures


def write_median_sweep(path, header, steps, medians_by_step, runs):
    """The sweep CSV of the medians: each step's median figure (an empty cell where a round had
    none), errors summed over the rounds."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        for step in steps:
            med = medians_by_step.get(step, {})
            row = [step]
            for col in header[1:]:
                if col == "errors":
                    v = sum(r["steps"][step]["errors"] or 0 for r in runs if step in r["steps"])
                else:
                    v = med.get(col)
                row.append("" if v is None else CSV_FORMATS.get(col, "{}").format(v))
            w.writerow(row)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--preset", default="official")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sweep", default="1:32:x2")
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--lengths", default="uniform:16:256")
    ap.add_argument("--sequences-per-request", type=int, default=8)
    ap.add_argument("--docs", default=str(REPO / "docs/benchmarks.md"))
    ap.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of the sweep and of fastformer-bench, alternated; figures are medians")
    ap.add_argument("--json", default=None, metavar="OUT", help="write the bench runner's record to OUT")
    args = ap.parse_args()

    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    bin_dir = REPO / args.build_dir / "bin"
    model = Path(args.models_dir) / args.preset
    if not (model / "model.safetensors").exists():
        run([sys.executable, REPO / "tools/make_demo_model.py", "--preset", args.preset, "--seed", "1", "--out", model])
    csv_path = REPO / args.build_dir / "bench-serve-sweep.csv"
    shown = {}  # the round, the sweep CSV's header and steps, the commands of the last round (for the docs)

    def sweep() -> dict:
        """A fresh server, the concurrency sweep, the server stopped: {"steps": {step: figures}}."""
        shown["round"] = shown.get("round", 0) + 1
        out_csv = csv_path if args.rounds == 1 else csv_path.with_name(f"bench-serve-sweep-{shown['round']}.csv")
        grpc_port, metrics_port = free_port(), free_port()
        server = ServerProcess(None, args=["--model-dir", str(model),
                                           "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen",
                                           f"127.0.0.1:{metrics_port}", "--http-listen", "127.0.0.1:0",
                                           "--dtype", "float32",  # as fastformer-bench below
                                           "--threads", str(args.threads), "--log-level", "warn"],
                               bin_dir=bin_dir, base_env=os.environ, output=None,  # its warnings on our stderr
                               start_timeout=60, stop_grace=60)
        try:
            server.wait_grpc_health()
            sweep_cmd = [bin_dir / "fastformer-loadgen", "--target", server.target, "--sweep-concurrency", args.sweep,
                         "--duration", args.duration, "--warmup", args.warmup, "--lengths", args.lengths,
                         "--sequences-per-request", args.sequences_per_request, "--json", "--csv", out_csv]
            run(sweep_cmd, capture_output=True)  # the sweep writes out_csv, read below
        finally:
            server.stop(check=False)
        shown["sweep"] = sweep_cmd
        header, figures = read_sweep(out_csv)
        shown["header"], shown["steps"] = header, list(figures)
        return {"steps": figures}

    def engine() -> dict:
        bench_cmd = [bin_dir / "fastformer-bench", "--backend", "cpu", "--model-dir", model, "--threads", args.threads,
                     "--batch-tokens", 16384, "--lengths", args.lengths, "--seconds", args.duration, "--seed", 1,
                     "--json"]
        shown["bench"] = bench_cmd
        return json.loads(run(bench_cmd, capture_output=True).stdout.strip().splitlines()[-1])

    measured = Runner(rounds=args.rounds, tool="run_bench_serve").run(
        [Scenario("sweep", sweep, params={"sweep": args.sweep, "lengths": args.lengths,
                                           "sequences_per_request": args.sequences_per_request,
                                           "threads": args.threads, "duration": args.duration}),
         Scenario("fastformer-bench", engine, params={"lengths": args.lengths, "threads": args.threads,
                                                      "batch_tokens": 16384, "seconds": args.duration})])
    sweep_cmd, bench_cmd = shown["sweep"], shown["bench"]
    sweep_median = measured.median("sweep").get("steps", {})
    if args.rounds > 1:  # the median of each step, for the plot and the table
        write_median_sweep(csv_path, shown["header"], shown["steps"], sweep_median, measured.runs["sweep"])
    bench = measured.median("fastformer-bench")
    image = REPO / "docs/images/loadgen-cpu.png"
    image.parent.mkdir(parents=True, exist_ok=True)
    run([sys.executable, REPO / "tools/plot_loadgen.py", "--csv", csv_path, "--out", image,
         "--title", f"fastformer-server, CPU backend, {args.threads} threads, preset {args.preset}"])

    rows = list(csv.DictReader(open(csv_path)))
    best = max(rows, key=lambda r: float(r["tokens_per_second"]))
    rounds = f", medians of {args.rounds} rounds" if args.rounds > 1 else ""
    machine = measured.header["machine"]["description"]
    lines = [BEGIN, "", f"Run of {time.strftime('%Y-%m-%d')} on {machine} (`make bench-serve`{rounds}):", "",
             "```sh",
             f"fastformer-server --model-dir {model} --threads {args.threads} &",
             " ".join(str(c) for c in sweep_cmd).replace(str(REPO) + "/", ""),
             " ".join(str(c) for c in bench_cmd).replace(str(REPO) + "/", ""),
             "```", "",
             "| concurrency | requests/s | tokens/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {float(r['requests_per_second']):.1f} | {float(r['tokens_per_second']):,.0f} | "
                     f"{r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['p999_ms']} | {r['max_ms']} | {r['errors']} |")
    ratio = float(best["tokens_per_second"]) / bench["tokens_per_second"]
    lines += ["", f"Best through gRPC: {float(best['tokens_per_second']):,.0f} tokens/s at concurrency "
              f"{best['concurrency']}; `fastformer-bench` on the same workload: {bench['tokens_per_second']:,.0f} "
              f"tokens/s: **{ratio:.0%}**.", "",
              "![latency against throughput, CPU backend](images/loadgen-cpu.png)", "", END]
    section = "\n".join(lines)
    if args.json:
        measured.write(args.json, rows=rows, best_tokens_per_second=float(best["tokens_per_second"]),
                       best_concurrency=best[shown["header"][0]], engine_tokens_per_second=bench["tokens_per_second"],
                       ratio=ratio, csv=str(csv_path), image=str(image))
    if args.no_write:
        print(section)
        return 0
    docs = Path(args.docs)
    text = docs.read_text()
    if BEGIN in text and END in text:
        text = text[:text.index(BEGIN)] + section + text[text.index(END) + len(END):]
    else:
        text = text.rstrip() + "\n\n## Latency against throughput (`make bench-serve`)\n\n" + section + "\n"
    docs.write_text(text)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())

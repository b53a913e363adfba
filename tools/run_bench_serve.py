#!/usr/bin/env python3
"""`make bench-serve`: the server's throughput and latency curve, recorded in docs/benchmarks.md.

    run_bench_serve.py [--build-dir build] [--models-dir models] [--preset official]
                       [--threads 2] [--sweep 1:32:x2] [--duration 10] [--warmup 2]
                       [--docs docs/benchmarks.md] [--no-write]

Starts fastformer-server on the preset (made with tools/make_demo_model.py if missing),
runs a fastformer-loadgen concurrency sweep (8 sequences of uniform:16:256 tokens a
request), runs fastformer-bench on the same workload and thread count, plots the sweep
(tools/plot_loadgen.py) to docs/images/loadgen-cpu.png, and rewrites the section between
the `bench-serve` markers of docs/benchmarks.md with the table, the commands and the machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from fastformer_testing import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- bench-serve:begin -->", "<!-- bench-serve:end -->"


def run(cmd, **kw):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, text=True, **kw)


def machine() -> str:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "CPU")
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


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
    args = ap.parse_args()

    bin_dir = REPO / args.build_dir / "bin"
    model = Path(args.models_dir) / args.preset
    if not (model / "model.safetensors").exists():
        run([sys.executable, REPO / "tools/make_demo_model.py", "--preset", args.preset, "--seed", "1", "--out", model])
    grpc_port, metrics_port = free_port(), free_port()
    server = ServerProcess(None, args=["--model-dir", str(model),
                                       "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                                       "--http-listen", "127.0.0.1:0", "--dtype", "float32",  # as fastformer-bench below
                                       "--threads", str(args.threads), "--log-level", "warn"],
                           bin_dir=bin_dir, base_env=os.environ, output=None,  # its warnings on our stderr
                           start_timeout=60, stop_grace=60)
    target = server.target
    try:
        server.wait_grpc_health()
        csv_path = REPO / args.build_dir / "bench-serve-sweep.csv"
        sweep_cmd = [bin_dir / "fastformer-loadgen", "--target", target, "--sweep-concurrency", args.sweep,
                     "--duration", args.duration, "--warmup", args.warmup, "--lengths", args.lengths,
                     "--sequences-per-request", args.sequences_per_request, "--json", "--csv", csv_path]
        run(sweep_cmd, capture_output=True)  # the sweep writes csv_path, read below
    finally:
        server.stop(check=False)
    bench_cmd = [bin_dir / "fastformer-bench", "--backend", "cpu", "--model-dir", model, "--threads", args.threads,
                 "--batch-tokens", 16384, "--lengths", args.lengths, "--seconds", args.duration, "--seed", 1, "--json"]
    bench = json.loads(run(bench_cmd, capture_output=True).stdout.strip().splitlines()[-1])
    image = REPO / "docs/images/loadgen-cpu.png"
    image.parent.mkdir(parents=True, exist_ok=True)
    run([sys.executable, REPO / "tools/plot_loadgen.py", "--csv", csv_path, "--out", image,
         "--title", f"fastformer-server, CPU backend, {args.threads} threads, preset {args.preset}"])

    rows = list(csv.DictReader(open(csv_path)))
    best = max(rows, key=lambda r: float(r["tokens_per_second"]))
    lines = [BEGIN, "", f"Run of {time.strftime('%Y-%m-%d')} on {machine()} (`make bench-serve`):", "",
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

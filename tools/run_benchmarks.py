#!/usr/bin/env python3
"""Run the engine benchmarks recorded in docs/benchmarks.md and print them as Markdown.

    run_benchmarks.py [--build-dir build] [--models-dir models] [--threads 2]
                      [--seconds 20] [--long]

CPU engine (fastformer-bench) against the PyTorch reference (bench_pytorch.py) on the
`official` preset, same sequences, same thread count; with --long also one 65,536-token
sequence of `base-long` and its peak memory against the bound
weights + (8 x hidden + intermediate) x 4 bytes x tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def run_json(cmd):
    print("+ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def ensure_model(models_dir: Path, preset: str) -> Path:
    out = models_dir / preset
    if not (out / "model.safetensors").exists():
        subprocess.run([PYTHON, REPO / "tools/make_demo_model.py", "--preset", preset, "--seed", "1",
                        "--out", out], check=True)
    return out


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--long", action="store_true", help="also the 65,536-token base-long memory run")
    args = ap.parse_args()

    bench = REPO / args.build_dir / "bin" / "fastformer-bench"
    models = Path(args.models_dir)
    official = ensure_model(models, "official")
    print(f"Machine: {machine()}\n")
    print("| workload | engine tokens/s | PyTorch tokens/s | speed-up | engine p50 / p99 ms | PyTorch p50 / p99 ms | engine peak RSS MiB | PyTorch peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for lengths in ("uniform:16:256", "fixed:256"):
        common = ["--model-dir", official, "--threads", args.threads, "--batch-tokens", args.batch_tokens,
                  "--lengths", lengths, "--seconds", args.seconds, "--seed", 1, "--json"]
        ours = run_json([bench, "--backend", "cpu", *common])
        torch_ = run_json([PYTHON, REPO / "tools/bench_pytorch.py", *common])
        print(f"| `{lengths}` | {ours['tokens_per_second']:,.0f} | {torch_['tokens_per_second']:,.0f} | "
              f"{ours['tokens_per_second'] / torch_['tokens_per_second']:.2f}x | "
              f"{ours['batch_latency_p50_ms']:.0f} / {ours['batch_latency_p99_ms']:.0f} | "
              f"{torch_['batch_latency_p50_ms']:.0f} / {torch_['batch_latency_p99_ms']:.0f} | "
              f"{ours['peak_rss_bytes'] / 2**20:.0f} | {torch_['peak_rss_bytes'] / 2**20:.0f} |", flush=True)
    if args.long:
        base = ensure_model(models, "base-long")
        cfg = json.load(open(base / "config.json"))
        tokens = 65536
        r = run_json([bench, "--backend", "cpu", "--model-dir", base, "--threads", args.threads,
                      "--batch-tokens", tokens, "--lengths", f"fixed:{tokens}", "--seconds", 0,
                      "--pool-batches", 1, "--warmup-batches", 0, "--seed", 1, "--json"])
        weights = (base / "model.safetensors").stat().st_size
        bound = weights + (8 * cfg["hidden_size"] + cfg["intermediate_size"]) * 4 * tokens
        print(f"\nbase-long, one {tokens:,}-token sequence: {r['tokens_per_second']:,.0f} tokens/s, "
              f"{r['seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**20:,.0f} MiB; "
              f"bound weights + (8D + I) x 4 B x T = {bound / 2**20:,.0f} MiB "
              f"({'within' if r['peak_rss_bytes'] < bound else 'OVER'} the bound)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

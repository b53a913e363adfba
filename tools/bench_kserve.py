#!/usr/bin/env python3
"""Triton's perf_analyzer through the Open Inference Protocol beside fastformer-loadgen through
fastformer.v1.Encoder, on one server, the same lengths and the same concurrency, for
docs/benchmarks/serving.md ("Open Inference Protocol: perf_analyzer beside fastformer-loadgen").

    .venv-triton/bin/python tools/bench_kserve.py [--build-dir build] [--model-dir models/official]
        [--concurrency 1,2,4] [--seconds 5] [--lengths 16:256] [--count 256] [--threads 2] [--stability 25]

Starts fastformer-server (CPU backend) on loopback ports, draws `--count` lengths uniformly
from `--lengths` with random real token ids, and runs at each concurrency, one sequence per
request: perf_analyzer -i grpc (unary ModelInfer, --input-data with these sequences) and
fastformer-loadgen (unary Encode, --lengths file: with these lengths). perf_analyzer asks for
every output the model lists (it has no option to name them), so the v2 answers carry the
embedding, token_embeddings and logits; loadgen is asked for the same
(--return-token-embeddings, --return-logits), so both APIs send the same answers. Prints a Markdown table
(requests/s, p50 and p99 latency) and, with --json, the figures with the command line, the commit
and the machine (fastformer_testing/bench.py's provenance()). perf_analyzer comes from
`make kserve-venv` (mk/kserve.mk): run this with .venv-triton's Python.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from fastformer_testing import HarnessError, ServerProcess, free_port
from fastformer_testing.bench import provenance

REPO = Path(__file__).resolve().parents[1]


def perf_analyzer(target, model, data_file, concurrency, seconds, stability, work: Path):
    import nvidia.cuda_runtime  # libcudart.so.12, which perf_analyzer links (no GPU is used)

    lib = str(Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib")
    csv = work / f"pa-{concurrency}.csv"
    cmd = [str(Path(sys.executable).parent / "perf_analyzer"), "-m", model, "-u", target, "-i", "grpc",
           "--input-data", str(data_file), "--concurrency-range", f"{concurrency}:{concurrency}",
           "--measurement-interval", str(int(seconds * 1000)), "--stability-percentage", str(stability),
           "--max-trials", "8", "-f", str(csv)]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LD_LIBRARY_PATH": lib})
    if out.returncode != 0:
        sys.exit(f"perf_analyzer failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", out.stdout).group(1))
    p50 = int(re.search(r"p50 latency: (\d+) usec", out.stdout).group(1)) / 1000
    p99 = int(re.search(r"p99 latency: (\d+) usec", out.stdout).group(1)) / 1000
    return {"requests_per_s": throughput, "p50_ms": p50, "p99_ms": p99}


def loadgen(loadgen_bin, target, lengths_file, concurrency, seconds, logits):
    # Every output, as perf_analyzer asks for them: the same answers go back through both APIs.
    cmd = [str(loadgen_bin), "--target", target, "--concurrency", str(concurrency), "--duration", str(seconds),
           "--warmup", "2", "--lengths", f"file:{lengths_file}", "--sequences-per-request", "1",
           "--return-token-embeddings", "--json"] + (["--return-logits"] if logits else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fastformer-loadgen failed ({out.returncode}):\n{out.stderr[-2000:]}")
    step = json.loads(out.stdout.strip().splitlines()[-1])
    return {"requests_per_s": step["requests_per_second"], "p50_ms": step["latency_ms"]["p50"],
            "p99_ms": step["latency_ms"]["p99"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--model-dir", default="models/official")
    ap.add_argument("--concurrency", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=5)
    ap.add_argument("--lengths", default="16:256")
    ap.add_argument("--count", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32",
                    help="the server's --dtype (float32, as the figures of docs/benchmarks.md; its default is auto)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--stability", type=int, default=25,
                    help="perf_analyzer's --stability-percentage: its last 3 windows within this %% of each other")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    bin_dir = REPO / args.build_dir / "bin"
    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    lo, hi = (int(x) for x in args.lengths.split(":"))
    rng = random.Random(args.seed)
    lengths = [rng.randint(lo, hi) for _ in range(args.count)]
    work = Path(tempfile.mkdtemp(prefix="bench-kserve-"))
    (work / "lengths.txt").write_text("\n".join(map(str, lengths)) + "\n")
    pad = int(config.get("pad_token_id", 0))
    data = [{"input_ids": {"content": [rng.randrange(pad + 1, config["vocab_size"]) for _ in range(n)],
                           "shape": [n]}} for n in lengths]
    (work / "input.json").write_text(json.dumps({"data": data}))

    port, metrics_port = free_port(), free_port()
    target = f"127.0.0.1:{port}"
    server = ServerProcess(None, args=["--model-dir", args.model_dir, "--listen", target,
                                       "--metrics-listen", f"127.0.0.1:{metrics_port}", "--http-listen", "127.0.0.1:0",
                                       "--backend", "cpu", "--threads", str(args.threads), "--dtype", args.dtype],
                           bin_dir=bin_dir, base_env=os.environ, start_timeout=60, stop_grace=30)
    rows = []
    try:
        try:
            server.wait_grpc_health(service="fastformer.v1.Encoder", interval=0.2)
        except HarnessError as e:
            sys.exit(f"bench_kserve: {e}")
        for c in (int(x) for x in args.concurrency.split(",")):
            v2 = perf_analyzer(target, config["model_name"], work / "input.json", c, args.seconds, args.stability, work)
            enc = loadgen(bin_dir / "fastformer-loadgen", target, work / "lengths.txt", c, args.seconds,
                          int(config.get("num_labels", 0)) > 0)
            rows.append({"concurrency": c, "perf_analyzer": v2, "loadgen": enc})
            print(f"concurrency {c}: perf_analyzer {v2}, loadgen {enc}", file=sys.stderr)
    finally:
        server.stop(check=False)
    if args.json:
        print(json.dumps({"lengths": args.lengths, "count": args.count, "rows": rows, **provenance()}))
        return 0
    print("| concurrency | perf_analyzer (ModelInfer) req/s | p50 / p99 ms | fastformer-loadgen (Encode) req/s "
          "| p50 / p99 ms | v2 ÷ Encode |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        v2, enc = r["perf_analyzer"], r["loadgen"]
        print(f"| {r['concurrency']} | {v2['requests_per_s']:.1f} | {v2['p50_ms']:.2f} / {v2['p99_ms']:.2f} | "
              f"{enc['requests_per_s']:.1f} | {enc['p50_ms']:.2f} / {enc['p99_ms']:.2f} | "
              f"{v2['requests_per_s'] / enc['requests_per_s']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

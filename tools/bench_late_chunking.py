#!/usr/bin/env python3
"""Late chunking beside its alternative (issue 35), for docs/benchmarks.md: documents of 4,096,
16,384 and 65,536 tokens cut into 256-token chunks, on one fastformer-server, three ways:

  plain  the document encoded once, one pooled embedding (the cost floor of one pass);
  late   the document encoded once with the server's 256-token windows (Sequence.chunking):
         an embedding per chunk from the whole document's pass;
  naive  each chunk sent alone (one request of n/256 sequences, which the server batches):
         an embedding per chunk that knows only its chunk.

Reported per size and way: the median seconds of `--rounds` calls after a warm-up, tokens/s
(the document's tokens over that time), late / plain, and the server's peak RSS (a fresh server
per size and way: /proc/<pid>/status VmHWM after its calls).

    /usr/bin/python3 tools/bench_late_chunking.py --model-dir DIR [--build-dir build]
        [--sizes 4096,16384,65536] [--chunk 256] [--rounds 5] [--threads 2] [--dtype float32] [--json]

DIR is a model with at least the largest size's positions, e.g.
    /usr/bin/python3 tools/make_demo_model.py --preset official --max-positions 65536 --out DIR
Run it on a quiet machine. The warm-up call and the timed rounds of each way are the bench
runner's (fastformer_testing/bench.py); the JSON adds the command line and the commit.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "client" / "python"))
from fastformer_testing import ServerProcess, free_port  # noqa: E402
from fastformer_testing.bench import Runner, Scenario, command, commit  # noqa: E402
from machine_info import describe  # noqa: E402


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_way(args, way: str, n: int, ids) -> dict:
    import fastformer_client as ffc

    port = free_port()
    server = ServerProcess(
        None, args=["--model-dir", args.model_dir,
                    "--listen", f"127.0.0.1:{port}", "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
                    "--backend", "cpu", "--threads", str(args.threads), "--dtype", args.dtype,
                    "--max-batch-tokens", str(max(n, 8192)), "--max-request-tokens", str(n),
                    "--max-queue-tokens", str(4 * n), "--max-request-spans", "4096"],
        bin_dir=Path(args.build_dir) / "bin", base_env=os.environ, start_timeout=60, stop_grace=60)
    try:
        server.wait_grpc_health()
        with ffc.Client(f"127.0.0.1:{port}", deadline_s=600.0) as client:
            if way == "plain":
                call = lambda: client.encode([ids])  # noqa: E731
            elif way == "late":
                call = lambda: client.encode([{"token_ids": ids, "window_tokens": args.chunk}])  # noqa: E731
            else:
                chunks = [ids[i:i + args.chunk] for i in range(0, n, args.chunk)]
                call = lambda: client.encode(chunks)  # noqa: E731

            def timed():
                t0 = time.perf_counter()
                call()
                return {"seconds": time.perf_counter() - t0}

            # One warm-up call, then --rounds timed calls: their median.
            measured = Runner(rounds=args.rounds, warmup=1, tool="bench_late_chunking").run(
                [Scenario(f"{n} {way}", timed, warm_up=call)])
        times = measured.values(f"{n} {way}", "seconds")
        seconds = measured.median(f"{n} {way}")["seconds"]
        return {"way": way, "tokens": n, "seconds": seconds, "tokens_per_s": n / seconds,
                "peak_rss_mib": peak_rss_mib(server.pid), "times": times}
    finally:
        server.stop(check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--sizes", default="4096,16384,65536")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import numpy as np
    rng = np.random.default_rng(args.seed)
    rows = []
    for n in [int(s) for s in args.sizes.split(",")]:
        ids = [int(x) for x in rng.integers(1, 30000, n)]
        for way in ("plain", "late", "naive"):
            r = run_way(args, way, n, ids)
            rows.append(r)
            print(f"{n:>6} tokens {way:>5}: {r['seconds'] * 1000:8.1f} ms, {r['tokens_per_s']:>10,.0f} tokens/s, "
                  f"peak RSS {r['peak_rss_mib']:7.1f} MiB", file=sys.stderr)
    result = {"machine": describe(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "dtype": args.dtype, "threads": args.threads, "chunk": args.chunk, "rows": rows,
              "command": command(), "commit": commit()}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['machine']}, {result['date']}; {args.dtype}, {args.threads} threads, {args.chunk}-token chunks\n")
    print("| document | plain ms | late ms (late / plain) | naive ms | tokens/s plain / late / naive | peak RSS MiB plain / late / naive |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in sorted({r["tokens"] for r in rows}):
        by = {r["way"]: r for r in rows if r["tokens"] == n}
        p, la, na = by["plain"], by["late"], by["naive"]
        print(f"| {n:,} | {p['seconds'] * 1000:.1f} | {la['seconds'] * 1000:.1f} ({la['seconds'] / p['seconds']:.3f}x) | "
              f"{na['seconds'] * 1000:.1f} | {p['tokens_per_s']:,.0f} / {la['tokens_per_s']:,.0f} / {na['tokens_per_s']:,.0f} | "
              f"{p['peak_rss_mib']:.0f} / {la['peak_rss_mib']:.0f} / {na['peak_rss_mib']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

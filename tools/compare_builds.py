#!/usr/bin/env python3
"""Two builds side by side: engine and server throughput of an old and a new tree, in one run.

    compare_builds.py --old OLD/build/bin --new build/bin [--model-dir models/official]
                      [--rounds 3] [--seconds 8] [--threads 2] [--concurrency 8]

For a change that must leave speed alone (a refactor): the two builds' fastformer-bench (tokens/s
on the same seeded workload) and fastformer-server under fastformer-loadgen (closed loop, 8
sequences of uniform:16:256 tokens a request), alternating old and new each round so that drift
of the machine hits both alike. Prints one table: each round's figures, the median of each, and
new / old. Each side uses its own fastformer-client, fastformer-loadgen and fastformer-bench.
The rounds, their order and the medians are the bench runner's (fastformer_testing/bench.py);
--json OUT writes its record: every run, the medians, the machine, the date and this command.
"""

from __future__ import annotations

import argparse
import json
import platform
import os
import subprocess
import sys
import time
from pathlib import Path

from fastformer_testing import HarnessError, ServerProcess, free_port
from fastformer_testing.bench import Runner, Scenario

REPO = Path(__file__).resolve().parents[1]


def bench(bin_dir: Path, args) -> float:
    out = subprocess.run([str(bin_dir / "fastformer-bench"), "--backend", "cpu", "--model-dir", args.model_dir,
                          "--threads", str(args.threads), "--seconds", str(args.seconds), "--seed", "1", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return float(json.loads(out.strip().splitlines()[-1])["tokens_per_second"])


def serve(bin_dir: Path, args) -> float:
    port = free_port()
    target = f"127.0.0.1:{port}"
    # FASTFORMER_HTTP_LISTEN, not the flag: an older build ignores the variable but not a flag.
    server = ServerProcess(None, args=["--model-dir", args.model_dir,
                                       "--listen", target, "--metrics-listen", f"127.0.0.1:{free_port()}",
                                       "--dtype", "float32",  # as fastformer-bench: the same dtype in every build
                                       "--threads", str(args.threads), "--log-level", "warn"],
                           env={"FASTFORMER_HTTP_LISTEN": "127.0.0.1:0"}, bin_dir=bin_dir, base_env=os.environ,
                           output=None, start_timeout=60, stop_grace=60)  # its warnings on our stderr
    try:
        try:
            server.wait_grpc_health()
        except HarnessError as e:
            raise SystemExit(f"{bin_dir}: the server did not become SERVING: {e}") from None
        out = subprocess.run([str(bin_dir / "fastformer-loadgen"), "--target", target,
                              "--concurrency", str(args.concurrency), "--duration", str(args.seconds),
                              "--warmup", "2", "--sequences-per-request", "8", "--json"],
                             check=True, capture_output=True, text=True).stdout
        return float(json.loads(out.strip().splitlines()[-1])["tokens_per_second"])
    finally:
        server.stop(check=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the old build's bin directory")
    ap.add_argument("--new", type=Path, default=REPO / "build/bin", help="the new build's bin directory")
    ap.add_argument("--model-dir", default=str(REPO / "models/official"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json", type=Path, default=None, help="write the runner's record here")
    args = ap.parse_args()

    # Each round: the engine old, new, then the server old, new (the sides alternate).
    scenarios = [Scenario(f"{what} {side}", lambda m=measure, b=bin_dir: {"tokens_per_s": m(b, args)},
                          params={"what": what, "side": side, "bin_dir": str(bin_dir)})
                 for what, measure in (("fastformer-bench", bench), ("server + loadgen", serve))
                 for side, bin_dir in (("old", args.old), ("new", args.new))]

    def progress(r, s, f):
        print(f"round {r + 1}: {s.name}: {f['tokens_per_s']:,.0f} tokens/s", file=sys.stderr, flush=True)

    result = Runner(rounds=args.rounds, tool="compare_builds", on_run=progress, json_path=args.json).run(scenarios)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.machine())
    print(f"{time.strftime('%Y-%m-%d')}, {cpu}, {args.threads} threads, model {args.model_dir}, "
          f"{args.rounds} rounds of {args.seconds:g} s, old {args.old}, new {args.new}")
    print("| tokens/s | old (each round) | new (each round) | old median | new median | new / old |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for what in ("fastformer-bench", "server + loadgen"):
        old, new = result.values(f"{what} old", "tokens_per_s"), result.values(f"{what} new", "tokens_per_s")
        mo, mn = result.median(f"{what} old")["tokens_per_s"], result.median(f"{what} new")["tokens_per_s"]
        print(f"| {what} | {', '.join(f'{v:,.0f}' for v in old)} | {', '.join(f'{v:,.0f}' for v in new)} | "
              f"{mo:,.0f} | {mn:,.0f} | {mn / mo:.3f} |")
    if args.json:
        result.write(args.json, model_dir=args.model_dir, threads=args.threads, seconds=args.seconds,
                     concurrency=args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())

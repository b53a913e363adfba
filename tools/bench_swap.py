#!/usr/bin/env python3
"""A model version hot swap under load, for docs/benchmarks.md (issue 25: the model repository).

    /usr/bin/python3 tools/bench_swap.py [--build-dir build] [--preset official] [--swaps 10]
                                         [--seconds 10] [--load 0.8] [--json OUT]

Makes a repository <tmp>/repo/embed/1 of the demo model (tools/make_demo_model.py --preset P,
seed 1) and starts one fastformer-server on it (--model-control-mode explicit, --threads = all
cores). Then, one after the other:

  saturation  fastformer-loadgen closed loop, 16 clients, one 128-token sequence a request;
  quiet       fastformer-loadgen open loop at --load (0.8) of that rate, no swap: its p99;
  swaps       the same open loop while --swaps times a new version directory N+1 (a copy of
              version 1's files, or seed 2's, alternating) is written and POST
              /v2/repository/models/embed/load swaps it in (latest 1: the old one leaves and
              is freed after its requests); its p99, each load's time to READY (the RPC
              returns after the swap), and the server's peak resident memory, sampled every
              5 ms from /proc, against its resident memory before the swaps.

Every request must succeed (loadgen's error count is printed). Prints a Markdown table; --json
writes the raw figures, with the command line, the commit and the machine
(fastformer_testing/bench.py's provenance(); one run of each phase, so no rounds).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

from bench_http import cpu_model  # noqa: E402
from fastformer_testing import ServerProcess, free_port  # noqa: E402
from fastformer_testing.bench import provenance  # noqa: E402


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def loadgen(bin_dir: Path, port: int, seconds: float, *, concurrency=16, rate=None):
    cmd = [str(bin_dir / "fastformer-loadgen"), "--target", f"127.0.0.1:{port}", "--duration", str(seconds),
           "--warmup", "1", "--lengths", "fixed:128", "--pool-requests", "64", "--json"]
    cmd += ["--rate", f"{rate:.1f}", "--concurrency", "64"] if rate else ["--concurrency", str(concurrency)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc) -> dict:
    out, err = proc.communicate(timeout=600)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"fastformer-loadgen printed no JSON (rc {proc.returncode}): {err[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--preset", default="official")
    ap.add_argument("--swaps", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    help="the server's --dtype (float32, as the figures of docs/benchmarks.md; its default is auto)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bin_dir = Path(args.build_dir) / "bin"
    work = Path(tempfile.mkdtemp(prefix="bench-swap-"))
    model_dir = work / "repo" / "embed"
    sources = {}
    for seed in (1, 2):
        sources[seed] = work / f"seed{seed}"
        subprocess.run(["/usr/bin/python3", str(REPO / "tools/make_demo_model.py"), "--preset", args.preset,
                        "--seed", str(seed), "--out", str(sources[seed])], check=True, capture_output=True)
    shutil.copytree(sources[1], model_dir / "1")
    grpc_port, http_port = free_port(), free_port()
    server = ServerProcess(work / "server.log",
                           args=["--model-repository", str(work / "repo"),
                                 "--model-control-mode", "explicit", "--load-model", "embed",
                                 "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                                 "--http-listen", f"127.0.0.1:{http_port}", "--threads", str(args.threads),
                                 "--dtype", args.dtype],
                           bin_dir=bin_dir, base_env=os.environ, start_timeout=60, stop_grace=60)
    figures = {}
    try:
        server.wait_http_ready("/v2/health/ready")
        sat = result(loadgen(bin_dir, grpc_port, args.seconds))
        rate = args.load * sat["requests_per_second"]
        quiet = result(loadgen(bin_dir, grpc_port, args.seconds, rate=rate))
        rss_before = rss_bytes(server.pid)
        peak = [rss_before]
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                peak[0] = max(peak[0], rss_bytes(server.pid))
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        swap_seconds = max(args.seconds, 1.5 * args.swaps)
        busy = loadgen(bin_dir, grpc_port, swap_seconds, rate=rate)
        time.sleep(1.5)  # past loadgen's warm-up
        loads = []
        gap = (swap_seconds - 2.5) / args.swaps
        for k in range(args.swaps):
            version = k + 2
            shutil.copytree(sources[2 if k % 2 == 0 else 1], model_dir / str(version))
            start = time.monotonic()
            req = urllib.request.Request(f"http://127.0.0.1:{http_port}/v2/repository/models/embed/load",
                                         data=b"", method="POST")
            with urllib.request.urlopen(req, timeout=300) as r:
                assert r.status == 200, r.read()
            loads.append(time.monotonic() - start)
            time.sleep(max(0.0, gap - loads[-1]))
        swapping = result(busy)
        sampling.set()
        sampler.join()
        figures = {
            "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(), "preset": args.preset,
            "saturation_rps": sat["requests_per_second"], "rate": rate,
            "quiet": {"p50_ms": quiet["latency_ms"]["p50"], "p99_ms": quiet["latency_ms"]["p99"],
                      "requests": quiet["requests"], "errors": quiet["errors"]},
            "swaps": {"p50_ms": swapping["latency_ms"]["p50"], "p99_ms": swapping["latency_ms"]["p99"],
                      "requests": swapping["requests"], "errors": swapping["errors"]},
            "load_s": loads, "rss_before_mib": rss_before / 2**20, "rss_peak_mib": peak[0] / 2**20,
            "weights_mib": (model_dir / "1" / "model.safetensors").stat().st_size / 2**20,
        }
    finally:
        server.stop(check=False)
    ready_lines = [line for line in (work / "server.log").read_text(errors="replace").splitlines()
                   if "READY in" in line]
    f = figures
    print(f"# {f['date']}, {f['cpu']}, {f['cores']} cores, {f['preset']} model ({f['weights_mib']:.1f} MiB of "
          f"weights), 16 clients saturate at {f['saturation_rps']:.1f} req/s; open loop at {f['rate']:.1f} req/s "
          f"({100 * args.load:.0f}%), fixed:128\n")
    print("| phase | requests | errors | p50 ms | p99 ms |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("quiet", "swaps"):
        p = f[name]
        print(f"| {name} | {p['requests']} | {sum(p['errors'].values())} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} |")
    print(f"\n{args.swaps} swaps: time to READY (load RPC) median {statistics.median(f['load_s']):.3f} s, "
          f"max {max(f['load_s']):.3f} s; resident memory {f['rss_before_mib']:.0f} MiB before, "
          f"peak {f['rss_peak_mib']:.0f} MiB during the swaps")
    print("server log:", *ready_lines[-2:], sep="\n  ")
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, **provenance()}, indent=2))
    return 0 if sum(f["quiet"]["errors"].values()) + sum(f["swaps"]["errors"].values()) == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""HTTP beside gRPC on one server, for docs/benchmarks.md (issue: HTTP).

    /usr/bin/python3 tools/bench_http.py [--build-dir build] [--seconds 10] [--rounds 2] [--json OUT]

Makes the `official` demo model (tools/make_demo_model.py --preset official --seed 1), starts one
fastformer-server (gRPC, HTTP, --threads = all cores) and measures, alternating the protocols in
each round so that drift hits them alike:

  saturation  16 clients, closed loop, one 128-token sequence a request, the same token ids
              (common/workload.h, seed 1): fastformer-loadgen over gRPC Encode, and
              fastformer-http-load over OpenAI JSON floats, OpenAI base64, TEI /embed, KServe v2
              REST binary and KServe v2 REST JSON;
  low load    one client, one 64-token sequence a request: server overhead = end-to-end latency
              less the server's compute time (gRPC: tools/bench_serve.py with the response's
              compute_time_us; HTTP: fastformer-http-load with x-fastformer-compute-us).

Prints a Markdown table and, with --json, writes every raw result, with the machine, the date
and the command line. The rounds and the medians are the bench runner's
(fastformer_testing/bench.py): each round runs every protocol once, in the order above.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fastformer_testing import ServerProcess, free_port
from fastformer_testing.bench import Runner, Scenario

REPO = Path(__file__).resolve().parents[1]
HTTP_MODES = ["openai-float", "openai-base64", "tei", "kserve-binary", "kserve-json"]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def run_json(cmd) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"{cmd[0]} printed no JSON (rc {out.returncode}): {out.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--dtype", default="float32",
                    help="the server's --dtype (float32, as the figures of docs/benchmarks.md; its default is auto)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    bin_dir = Path(args.build_dir) / "bin"
    python = "/usr/bin/python3"
    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    model = work / "official"
    subprocess.run([python, str(REPO / "tools/make_demo_model.py"), "--preset", "official", "--seed", "1",
                    "--out", str(model)], check=True, capture_output=True)
    config = json.loads((model / "config.json").read_text())
    grpc_port, http_port = free_port(), free_port()
    server = ServerProcess(None, args=["--model-dir", str(model),
                                       "--listen", f"127.0.0.1:{grpc_port}", "--metrics-listen", f"127.0.0.1:{free_port()}",
                                       "--http-listen", f"127.0.0.1:{http_port}", "--threads", str(args.threads),
                                       "--dtype", args.dtype, "--log-level", "warn"],
                           bin_dir=bin_dir, base_env=os.environ, start_timeout=60, stop_grace=60)
    runs = {}
    try:
        server.wait_grpc_health()
        common = ["--vocab-size", str(config["vocab_size"]), "--pad-token-id", str(config["pad_token_id"])]

        def grpc_run(concurrency, lengths):
            r = run_json([str(bin_dir / "fastformer-loadgen"), "--target", f"127.0.0.1:{grpc_port}", "--concurrency",
                          str(concurrency), "--duration", str(args.seconds), "--warmup", str(args.warmup),
                          "--lengths", lengths, "--pool-requests", "64", "--json", "--pad-token-id",
                          str(config["pad_token_id"])])
            return {"requests_per_s": r["requests_per_second"], "p50_ms": r["latency_ms"]["p50"],
                    "p99_ms": r["latency_ms"]["p99"], "errors": r["errors"], "requests": r["requests"]}

        def http_run(mode, concurrency, lengths):
            return run_json([str(bin_dir / "fastformer-http-load"), "--target", f"127.0.0.1:{http_port}", "--mode",
                             mode, "--model", config["model_name"], "--concurrency", str(concurrency),
                             "--duration-s", str(args.seconds), "--warmup-s", str(args.warmup), "--lengths", lengths,
                             "--pool-requests", "64", *common])

        def grpc_low_load():
            g = run_json([python, str(REPO / "tools/bench_serve.py"), "--target", f"127.0.0.1:{grpc_port}",
                          "--concurrency", "1", "--sequences-per-request", "1", "--lengths", "fixed:64",
                          "--seconds", str(args.seconds), "--json"])
            return {"overhead_p50_ms": g["overhead_ms"]["p50"], "overhead_p99_ms": g["overhead_ms"]["p99"],
                    "p50_ms": g["latency_ms"]["p50"], "p99_ms": g["latency_ms"]["p99"], "requests": g.get("requests")}

        # Every round runs each protocol once, in this order: the rounds alternate them.
        saturation = [Scenario("grpc-encode", lambda: grpc_run(args.concurrency, "fixed:128"))] + [
            Scenario(mode, lambda m=mode: http_run(m, args.concurrency, "fixed:128")) for mode in HTTP_MODES]
        low_load = [Scenario("grpc-encode", grpc_low_load)] + [
            Scenario(mode, lambda m=mode: http_run(m, 1, "fixed:64"))
            for mode in ("openai-float", "openai-base64", "kserve-binary")]
        runs = {"saturation": Runner(rounds=args.rounds, tool="bench_http").run(saturation),
                "low_load": Runner(rounds=args.rounds, tool="bench_http").run(low_load)}
    finally:
        server.stop(check=False)

    results = {phase: r.runs for phase, r in runs.items()}  # {phase: {protocol: [each round's figures]}}

    def med(phase, name, key):
        return runs[phase].median(name)[key]

    base = med("saturation", "grpc-encode", "requests_per_s")
    print(f"# {time.strftime('%Y-%m-%d')}, {cpu_model()}, {os.cpu_count()} cores, official model, "
          f"{args.concurrency} clients, fixed:128, {args.seconds:g} s x {args.rounds} rounds (medians)\n")
    print("| protocol | requests/s | vs gRPC Encode | p50 / p99 ms | errors |")
    print("| --- | --- | --- | --- | --- |")
    for name, rows in results["saturation"].items():
        rps = med("saturation", name, "requests_per_s")
        errors = sum(sum(r.get("errors", {}).values()) for r in rows)
        print(f"| {name} | {rps:.1f} | {100 * rps / base:.0f}% | {med('saturation', name, 'p50_ms'):.1f} / "
              f"{med('saturation', name, 'p99_ms'):.1f} | {errors} |")
    print("\n| protocol (1 client, fixed:64) | overhead p50 ms | overhead p99 ms | end-to-end p50 / p99 ms |")
    print("| --- | --- | --- | --- |")
    for name in results["low_load"]:
        print(f"| {name} | {med('low_load', name, 'overhead_p50_ms'):.2f} | "
              f"{med('low_load', name, 'overhead_p99_ms'):.2f} | "
              f"{med('low_load', name, 'p50_ms'):.2f} / {med('low_load', name, 'p99_ms'):.2f} |")
    if args.json:  # the raw results as before, and the record's header: tool, date, command, commit, machine
        Path(args.json).write_text(json.dumps({**results, **runs["saturation"].header}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A batch job beside live queries (issue 50, OpenAI's Batch API), for docs/benchmarks.md.

One fastformer-server (CPU) with --jobs-dir; token-id inputs, so no tokenizer is involved.

  batch        a batch (POST /v1/files, POST /v1/batches) of --lines lines, each a
               /v1/embeddings body of --line-texts sequences of --line-tokens token ids; measured by
               the lines it writes a second (fastformer_job_lines_total), cancelled after the phase;
  interactive  POST /v1/embeddings of one --query-tokens sequence, Poisson arrivals at
               --query-share of the interactive saturation rate (measured first with
               fastformer-loadgen over gRPC, closed-loop single queries from --saturate-clients
               clients), sent by this script over HTTP (a few threads, one connection each); its
               latency is the client's.

  client loop  the peer a user would otherwise write: the same sequences sent by fastformer-loadgen
               (--loop-clients closed-loop clients, --line-texts x --line-tokens a request, bulk
               class, gRPC), as fast as they are answered.

Phases, each --seconds long after --warmup: the batch alone; interactive alone; both; the client
loop alone. Reported:
the interactive p50 / p99, the batch's lines and tokens a second, the server's mean batch compute
time (/metrics), and the acceptance: the interactive p99 under the batch within issue 36's bound
(2x the solo p99 plus two full batches, the batch alone's mean), and the batch keeping at least
85% of the throughput it has alone.

    /usr/bin/python3 tools/bench_jobs.py --model-dir DIR [--build-dir build] [--seconds 15]
        [--rounds 1] [--threads 2] [--dtype float32] [--json]

Rounds and medians are the bench runner's (fastformer_testing/bench.py), as in bench_priority.py;
--json prints the runner's record with args, saturation_queries_per_s, query_rate, phases (the
medians) and acceptance. DIR: e.g. /usr/bin/python3 tools/make_demo_model.py --preset official
--seed 1 --out DIR. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import bench_priority  # noqa: E402
from bench_priority import finish, median_of, query_flags  # noqa: E402
from fastformer_testing import ServerProcess, free_port  # noqa: E402
from fastformer_testing.bench import Runner, Scenario  # noqa: E402


class Server(bench_priority.Server):
    """bench_priority's server (batch_totals, loadgen), with the HTTP listener and --jobs-dir."""

    def __init__(self, args, jobs_dir):
        self.args = args
        port, metrics_port, self.http = free_port(), free_port(), free_port()
        ServerProcess.__init__(
            self, None, args=["--model-dir", args.model_dir,
                              "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                              "--http-listen", f"127.0.0.1:{self.http}", "--jobs-dir", jobs_dir,
                              "--backend", "cpu", "--threads", str(args.threads), "--dtype", args.dtype,
                              "--max-batch-tokens", str(args.batch_tokens), "--max-queue-tokens", str(1 << 22)],
            bin_dir=Path(args.build_dir) / "bin", start_timeout=60, stop_grace=60)

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.http, timeout=120)
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:300]!r}")
        return json.loads(data)

    def lines_written(self) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("fastformer_job_lines_total{"))


def upload(srv, args, model) -> str:
    """The batch's input file: --lines lines of --line-texts x --line-tokens token ids."""
    rng = random.Random(1)
    rows = []
    for i in range(args.lines):
        ids = [[rng.randrange(5, 1000) for _ in range(args.line_tokens)] for _ in range(args.line_texts)]
        rows.append(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"model": model, "input": ids}}))
    data = ("\n".join(rows) + "\n").encode()
    boundary = "benchjobsboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n"
            f"Content-Type: application/jsonl\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    f = srv.request("POST", "/v1/files", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"})
    return f["id"]


class Queries:
    """POST /v1/embeddings of one sequence, Poisson arrivals at `rate` a second, for `seconds`
    after `warmup`; the latencies of the measured window."""

    def __init__(self, srv, model, args, rate, seconds):
        self.srv, self.args, self.rate, self.seconds = srv, args, rate, seconds
        self.body = json.dumps({"model": model, "input": [random.Random(2).randrange(5, 1000)
                                                           for _ in range(args.query_tokens)]}).encode()
        self.latencies, self.errors = [], 0
        self.local = threading.local()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def one(self, measured):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.srv.http, timeout=60)
        start = time.perf_counter()
        try:
            conn.request("POST", "/v1/embeddings", self.body, {"Content-Type": "application/json"})
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except (OSError, http.client.HTTPException):
            self.local.conn, ok = None, False
        if measured:
            if ok:
                self.latencies.append((time.perf_counter() - start) * 1000)
            else:
                self.errors += 1

    def run(self):
        rng = random.Random(3)
        start = time.monotonic()
        measure_from, end = start + self.args.warmup, start + self.args.warmup + self.seconds
        with ThreadPoolExecutor(max_workers=4) as pool:
            at = start
            while True:
                at += rng.expovariate(self.rate)
                if at >= end:
                    break
                time.sleep(max(0.0, at - time.monotonic()))
                pool.submit(self.one, at >= measure_from)

    def result(self):
        self.thread.join()
        lat = sorted(self.latencies)
        pick = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]) if lat else (lambda q: None)
        return {"queries": len(lat), "query_errors": self.errors, "query_p50_ms": pick(0.5),
                "query_p99_ms": pick(0.99)}


def phase(srv, args, file_id, model, *, batch, query_rate=0.0, loop=False):
    seconds = args.seconds
    if loop:
        step = srv.loadgen("--concurrency", args.loop_clients, "--sequences-per-request", args.line_texts,
                           "--lengths", f"fixed:{args.line_tokens}", "--priority", "bulk", "--seed", 100,
                           warmup=args.warmup, seconds=seconds)
        time.sleep(args.warmup)
        before = srv.batch_totals()
        time.sleep(seconds)
        after = srv.batch_totals()
        tokens_per_s = finish(step)["tokens_per_second"]
        batches = after[1] - before[1]
        return {"batch_lines_per_s": tokens_per_s / (args.line_texts * args.line_tokens),
                "batch_tokens_per_s": tokens_per_s,
                "batch_compute_ms": (after[0] - before[0]) / batches * 1000 if batches else None,
                "batch_tokens": (after[2] - before[2]) / batches if batches else None,
                "queries": 0, "query_errors": 0, "query_p50_ms": None, "query_p99_ms": None}
    b = srv.request("POST", "/v1/batches", json.dumps({"input_file_id": file_id, "endpoint": "/v1/embeddings",
                                                      "completion_window": "24h"}).encode(),
                    {"Content-Type": "application/json"}) if batch else None
    queries = Queries(srv, model, args, query_rate, seconds) if query_rate else None
    time.sleep(args.warmup)
    before, lines0 = srv.batch_totals(), srv.lines_written()
    time.sleep(seconds)
    after, lines1 = srv.batch_totals(), srv.lines_written()
    if b:
        srv.request("POST", f"/v1/batches/{b['id']}/cancel", b"")
        while srv.request("GET", f"/v1/batches/{b['id']}")["status"] != "cancelled":
            time.sleep(0.05)
    q = queries.result() if queries else {"queries": 0, "query_errors": 0, "query_p50_ms": None, "query_p99_ms": None}
    batches = after[1] - before[1]
    lines_per_s = (lines1 - lines0) / seconds if batch else None
    if batch and lines1 - lines0 >= args.lines - 1:
        raise RuntimeError(f"the batch ran out of lines in the phase: raise --lines (now {args.lines})")
    return {
        "batch_lines_per_s": lines_per_s,
        "batch_tokens_per_s": lines_per_s * args.line_texts * args.line_tokens if batch else None,
        "batch_compute_ms": (after[0] - before[0]) / batches * 1000 if batches else None,
        "batch_tokens": (after[2] - before[2]) / batches if batches else None,
        **q,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--lines", type=int, default=3000)
    ap.add_argument("--line-texts", type=int, default=8)
    ap.add_argument("--line-tokens", type=int, default=128)
    ap.add_argument("--query-tokens", type=int, default=16)
    ap.add_argument("--query-share", type=float, default=0.05)
    ap.add_argument("--saturate-clients", type=int, default=8)
    ap.add_argument("--loop-clients", type=int, default=3, help="the client loop's concurrent requests")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    def progress(rnd, scenario, r):
        lines = f"{r['batch_lines_per_s']:7.1f}" if r["batch_lines_per_s"] else "      -"
        p99 = f"{r['query_p99_ms']:7.1f}" if r["queries"] else "      -"
        print(f"{scenario.name:>18}: batch {lines} lines/s; queries {r['queries']:>5} p99 {p99} ms "
              f"(round {rnd + 1}/{args.rounds})", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="bench_jobs_") as jobs, Server(args, jobs) as srv:
        model = srv.request("GET", "/v1/models")["data"][0]["id"]
        file_id = upload(srv, args, model)
        sat = finish(srv.loadgen(*query_flags(args, "interactive", clients=args.saturate_clients),
                                 warmup=args.warmup, seconds=max(5.0, args.seconds / 2)))
        rate = args.query_share * sat["requests_per_second"]
        print(f"interactive saturation {sat['requests_per_second']:.0f} queries/s; queries at {rate:.1f}/s",
              file=sys.stderr)
        runs = {"batch alone": dict(batch=True), "interactive alone": dict(batch=False, query_rate=rate),
                "batch and queries": dict(batch=True, query_rate=rate),
                "client loop alone": dict(batch=False, loop=True)}
        measured = Runner(rounds=args.rounds, tool="bench_jobs", on_run=progress).run(
            [Scenario(name, lambda kw=kw: phase(srv, args, file_id, model, **kw), params=kw)
             for name, kw in runs.items()])
    ph = {name: median_of(measured.runs[name]) for name in runs}
    full_ms = ph["batch alone"]["batch_compute_ms"]
    mix = ph["batch and queries"]
    acceptance = {
        "interactive_p99_bound_ms": 2 * ph["interactive alone"]["query_p99_ms"] + 2 * full_ms,
        "interactive_p99_ms": mix["query_p99_ms"],
        "batch_share": mix["batch_lines_per_s"] / ph["batch alone"]["batch_lines_per_s"],
        "batch_vs_client_loop": ph["batch alone"]["batch_tokens_per_s"] / ph["client loop alone"]["batch_tokens_per_s"],
    }
    result = measured.record(args=vars(args), saturation_queries_per_s=sat["requests_per_second"],
                             query_rate=rate, phases=ph, acceptance=acceptance)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['machine']['description']}, {result['date']}; {args.dtype}, {args.threads} threads, batches of "
          f"{args.batch_tokens} tokens; batch lines of {args.line_texts} x {args.line_tokens} token ids; queries of "
          f"{args.query_tokens} tokens over HTTP at {rate:.1f}/s ({args.query_share:.0%} of "
          f"{sat['requests_per_second']:.0f}/s)\n")
    print("| phase | interactive p50 ms | interactive p99 ms | batch lines/s | batch tokens/s | batch compute ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in ph.items():
        lines = f"{r['batch_lines_per_s']:.1f} | {r['batch_tokens_per_s']:,.0f}" if r["batch_lines_per_s"] else " | "
        p50 = f"{r['query_p50_ms']:.1f}" if r["queries"] else ""
        p99 = f"{r['query_p99_ms']:.1f}" if r["queries"] else ""
        compute = f"{r['batch_compute_ms']:.1f}" if r["batch_compute_ms"] else ""
        print(f"| {name} | {p50} | {p99} | {lines} | {compute} |")
    acc = acceptance
    print(f"\nInteractive p99 {acc['interactive_p99_ms']:.1f} ms against 2 x {ph['interactive alone']['query_p99_ms']:.1f}"
          f" + 2 x {full_ms:.1f} = {acc['interactive_p99_bound_ms']:.1f} ms; the batch {acc['batch_share']:.1%} of "
          f"the batch alone; the batch alone {acc['batch_vs_client_loop']:.1%} of the client loop's tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Queries under a bulk load (issue 36's priority classes), for docs/benchmarks.md.

One fastformer-server (CPU); token-id inputs, so no tokenizer is involved:

  bulk         --bulk-clients closed-loop clients, each sending requests of --bulk-texts
               sequences of --bulk-tokens tokens as fast as they are answered (a re-index that
               saturates the server), priority "bulk";
  interactive  one open-loop client sending single --query-tokens sequences at --query-share of
               the interactive saturation rate (measured first: closed-loop single queries from
               --saturate-clients clients), Poisson arrivals, priority "interactive".

Phases, each --seconds long: bulk alone; interactive alone; the mix with priority classes; the
same mix with every request in one class (the FIFO queue of before). Reported: the interactive
p50 / p99 latency, the bulk throughput (tokens/s), and the mean compute time of a full batch
(the server's compute_time_us of bulk requests). Then the promotion bound: a server with
--promote-ms, interactive clients saturating it, and bulk requests sent among them: each bulk
request's latency against the bound plus two batches.

    /usr/bin/python3 tools/bench_priority.py --model-dir DIR [--build-dir build] [--seconds 20]
        [--threads 2] [--dtype float32] [--server-cpus 0] [--json]

DIR: e.g. /usr/bin/python3 tools/make_demo_model.py --preset official --seed 1 --out DIR. Run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "client" / "python"))
from machine_info import describe  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


class Server:
    def __init__(self, args, *extra):
        self.port, self.metrics_port = free_port(), free_port()
        pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
        self.proc = subprocess.Popen(
            pin + [str(Path(args.build_dir) / "bin" / "fastformer-server"), "--model-dir", args.model_dir,
             "--listen", f"127.0.0.1:{self.port}", "--metrics-listen", f"127.0.0.1:{self.metrics_port}",
             "--http-listen", "",
             "--backend", "cpu", "--threads", str(args.threads), "--dtype", args.dtype,
             "--max-batch-tokens", str(args.batch_tokens), "--max-queue-tokens", str(1 << 22), *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        import fastformer_client as ffc
        with ffc.Client(f"127.0.0.1:{self.port}", deadline_s=60) as c:
            c.wait_for_serving(60)
        return self

    def batch_totals(self):
        """(seconds, batches, tokens) the engine spent on batches so far (/metrics sums)."""
        import urllib.request
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).read().decode()
        got = {}
        for line in text.splitlines():
            for name in ("fastformer_batch_compute_duration_seconds_sum", "fastformer_batch_compute_duration_seconds_count",
                         "fastformer_batch_tokens_sum"):
                if line.startswith(name + "{") or line.startswith(name + " "):
                    got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return (got.get("fastformer_batch_compute_duration_seconds_sum", 0.0),
                got.get("fastformer_batch_compute_duration_seconds_count", 0.0),
                got.get("fastformer_batch_tokens_sum", 0.0))

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def ids(rng, n, vocab):
    return [rng.randrange(1, vocab) for _ in range(n)]


def bulk_loop(target, args, vocab, stop, out, priority, seed):
    import fastformer_client as ffc
    rng = random.Random(seed)
    with ffc.Client(target, deadline_s=120) as c:
        while not stop.is_set():
            seqs = [ids(rng, args.bulk_tokens, vocab) for _ in range(args.bulk_texts)]
            t0 = time.perf_counter()
            res = c.encode(seqs, priority=priority, return_result=True)
            out.append((time.perf_counter() - t0, args.bulk_texts * args.bulk_tokens, res.compute_time_us))


def query_loop(target, args, vocab, stop, rate, out, priority, seed, closed=False):
    """closed: one query after another. Else open loop: Poisson arrivals at `rate`, each query
    sent at its time on a pool of threads however long the earlier ones take."""
    import concurrent.futures as cf

    import fastformer_client as ffc
    rng = random.Random(seed)
    with ffc.Client(target, deadline_s=120) as c:
        def one(seq):
            t0 = time.perf_counter()
            c.encode([seq], priority=priority)
            out.append(time.perf_counter() - t0)

        if closed:
            while not stop.is_set():
                one(ids(rng, args.query_tokens, vocab))
            return
        with cf.ThreadPoolExecutor(64) as pool:
            next_at = time.perf_counter()
            while not stop.is_set():
                next_at += rng.expovariate(rate)
                delay = next_at - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
                pool.submit(one, ids(rng, args.query_tokens, vocab))


def phase(srv, args, vocab, *, bulk, query_rate, bulk_priority="bulk", query_priority="interactive",
          query_clients=1, closed=False, seconds=None):
    target = f"127.0.0.1:{srv.port}"
    stop = threading.Event()
    bulk_out, query_out, threads = [], [], []
    if bulk:
        for i in range(args.bulk_clients):
            threads.append(threading.Thread(target=bulk_loop, args=(target, args, vocab, stop, bulk_out,
                                                                     bulk_priority, 100 + i)))
    if query_rate or closed:
        for i in range(query_clients):
            threads.append(threading.Thread(target=query_loop, args=(
                target, args, vocab, stop, query_rate, query_out, query_priority, 200 + i, closed)))
    for t in threads:
        t.start()
    time.sleep(args.warmup)
    bulk_out.clear()
    query_out.clear()
    before = srv.batch_totals()
    t0 = time.perf_counter()
    time.sleep(seconds or args.seconds)
    elapsed = time.perf_counter() - t0
    bulk_done, query_done = list(bulk_out), list(query_out)
    after = srv.batch_totals()
    batches = after[1] - before[1]
    stop.set()
    for t in threads:
        t.join()
    return {
        "bulk_tokens_per_s": sum(n for _, n, _ in bulk_done) / elapsed if bulk else None,
        "bulk_requests": len(bulk_done),
        # the engine's mean time a batch, and its mean tokens, over the phase (from /metrics)
        "batch_compute_ms": (after[0] - before[0]) / batches * 1000 if batches else None,
        "batch_tokens": (after[2] - before[2]) / batches if batches else None,
        "queries": len(query_done),
        "query_rate": len(query_done) / elapsed,
        "query_p50_ms": percentile(query_done, 50) * 1000,
        "query_p99_ms": percentile(query_done, 99) * 1000,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--bulk-clients", type=int, default=3)
    ap.add_argument("--bulk-texts", type=int, default=64)
    ap.add_argument("--bulk-tokens", type=int, default=128)
    ap.add_argument("--query-tokens", type=int, default=16)
    ap.add_argument("--query-share", type=float, default=0.05)
    ap.add_argument("--saturate-clients", type=int, default=8)
    ap.add_argument("--promote-ms", type=int, default=500)
    ap.add_argument("--server-cpus", default="",
                    help="run the server on these CPUs (taskset -c), e.g. 0; run this script under "
                         "taskset -c on the others, so the load generator does not take the server's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    vocab = json.loads((Path(args.model_dir) / "config.json").read_text())["vocab_size"]

    result = {"machine": describe(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "args": vars(args)}
    with Server(args, "--bulk-promote-after-ms", "60000") as srv:
        sat = phase(srv, args, vocab, bulk=False, query_rate=0, closed=True,
                    query_clients=args.saturate_clients, seconds=max(5, args.seconds / 2))
        rate = args.query_share * sat["query_rate"]
        result["saturation_queries_per_s"] = sat["query_rate"]
        result["query_rate"] = rate
        print(f"interactive saturation {sat['query_rate']:.0f} queries/s; the interactive client sends "
              f"{rate:.1f}/s", file=sys.stderr)
        runs = {
            "bulk alone": dict(bulk=True, query_rate=0),
            "interactive alone": dict(bulk=False, query_rate=rate),
            "mix, priority classes": dict(bulk=True, query_rate=rate),
            "mix, one class (FIFO)": dict(bulk=True, query_rate=rate, bulk_priority="interactive"),
        }
        result["phases"] = {}
        for name, kw in runs.items():
            r = phase(srv, args, vocab, **kw)
            result["phases"][name] = r
            print(f"{name:>24}: bulk {r['bulk_tokens_per_s'] or 0:>10,.0f} tokens/s, batch "
                  f"{r['batch_compute_ms'] or 0:6.1f} ms of {r['batch_tokens'] or 0:,.0f} tokens; queries {r['queries']:>5} p50 {r['query_p50_ms']:7.1f} ms "
                  f"p99 {r['query_p99_ms']:7.1f} ms", file=sys.stderr)

    # The promotion bound: interactive clients saturate the server; bulk requests among them.
    with Server(args, "--bulk-promote-after-ms", str(args.promote_ms)) as srv:
        target = f"127.0.0.1:{srv.port}"
        stop = threading.Event()
        flood = [threading.Thread(target=bulk_loop, args=(target, args, vocab, stop, [], "interactive", 300 + i))
                 for i in range(args.bulk_clients)]
        for t in flood:
            t.start()
        time.sleep(args.warmup)
        import fastformer_client as ffc
        rng = random.Random(7)
        latencies, queued = [], []
        before = srv.batch_totals()
        with ffc.Client(target, deadline_s=120) as c:
            for _ in range(10):
                t0 = time.perf_counter()
                res = c.encode([ids(rng, args.query_tokens, vocab)], priority="bulk", return_result=True)
                latencies.append(time.perf_counter() - t0)
                queued.append(res.queue_time_us / 1000)  # the server's: admission to first compute
                time.sleep(0.2)
        after = srv.batch_totals()
        stop.set()
        for t in flood:
            t.join()
        batch_ms = (after[0] - before[0]) / max(1.0, after[1] - before[1]) * 1000
        result["promotion"] = {"bound_ms": args.promote_ms, "bulk_latency_ms": [x * 1000 for x in latencies],
                               "bulk_queue_ms": queued, "batch_compute_ms": batch_ms}
        print(f"promotion: bound {args.promote_ms} ms, bulk latencies under an interactive flood "
              f"{min(latencies) * 1000:.0f}-{max(latencies) * 1000:.0f} ms, queued in the server "
              f"{min(queued):.0f}-{max(queued):.0f} ms (bound + 2 batches of "
              f"{batch_ms:.1f} ms: {args.promote_ms + 2 * batch_ms:.0f} ms)", file=sys.stderr)
    if args.json:
        print(json.dumps(result))
        return 0
    ph = result["phases"]
    print(f"{result['machine']}, {result['date']}; {args.dtype}, {args.threads} threads, batches of "
          f"{args.batch_tokens} tokens; bulk: {args.bulk_clients} clients x {args.bulk_texts} x "
          f"{args.bulk_tokens} tokens; queries of {args.query_tokens} tokens at {rate:.1f}/s "
          f"({args.query_share:.0%} of {result['saturation_queries_per_s']:.0f}/s)\n")
    print("| phase | interactive p50 ms | interactive p99 ms | bulk tokens/s | batch compute ms (mean tokens) |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in ph.items():
        bulk = f"{r['bulk_tokens_per_s']:,.0f}" if r["bulk_tokens_per_s"] else ""
        batch = f"{r['batch_compute_ms']:.1f} ({r['batch_tokens']:,.0f})" if r["batch_compute_ms"] else ""
        p50 = f"{r['query_p50_ms']:.1f}" if r["queries"] else ""
        p99 = f"{r['query_p99_ms']:.1f}" if r["queries"] else ""
        print(f"| {name} | {p50} | {p99} | {bulk} | {batch} |")
    pr = result["promotion"]
    print(f"\nPromotion: bound {pr['bound_ms']} ms; bulk requests under an interactive flood answered in "
          f"{min(pr['bulk_latency_ms']):.0f}-{max(pr['bulk_latency_ms']):.0f} ms, of which queued in the server "
          f"{min(pr['bulk_queue_ms']):.0f}-{max(pr['bulk_queue_ms']):.0f} ms (batches of "
          f"{pr['batch_compute_ms']:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Queries under a bulk load (issue 36's priority classes), for docs/benchmarks.md.

One fastformer-server (CPU); token-id inputs, so no tokenizer is involved. The load comes from
fastformer-loadgen processes (C++: on a small machine a Python load generator takes the CPU the
server's engine threads need, and its GIL adds to every query's latency):

  bulk         fastformer-loadgen --concurrency --bulk-clients: closed-loop requests of
               --bulk-texts sequences of --bulk-tokens tokens as fast as they are answered (a
               re-index that saturates the server), priority "bulk";
  interactive  fastformer-loadgen --rate: single --query-tokens sequences, Poisson arrivals, at
               --query-share of the interactive saturation rate (measured first: closed-loop
               single queries from --saturate-clients clients), priority "interactive".

Phases, each --seconds long after --warmup: bulk alone; interactive alone; the mix with priority
classes; the same mix with every request in one class (the FIFO queue of before). Reported: the
interactive p50 / p99 latency, the bulk throughput (tokens/s), the server's mean batch compute
time and tokens over the phase (/metrics), and the acceptance bound: 2x the solo p99 plus two
full batches (bulk alone's mean). Then the promotion bound: a server with --promote-ms,
interactive clients saturating it, and one bulk request a second among them: their latency and
server queue time against the bound plus two batches.

    /usr/bin/python3 tools/bench_priority.py --model-dir DIR [--build-dir build] [--seconds 20]
        [--rounds 1] [--threads 2] [--dtype float32] [--mixed-batch-tokens N] [--server-cpus 0] [--json]

The rounds and the medians are the bench runner's (fastformer_testing/bench.py): the saturation,
the four phases (each round runs every phase once, in the order above, so a drift of the machine
hits them alike) and the promotion probe each run --rounds times; the table, the acceptance and
the JSON give every figure's median (a figure missing from a round, e.g. no queries: none). --json
prints the runner's record: tool, date, command, commit, machine (machine["description"] is the
line of before), rounds, scenarios (each phase's runs and medians), order; and, as before, args,
saturation_queries_per_s, query_rate, phases (the medians), acceptance and promotion.

DIR: e.g. /usr/bin/python3 tools/make_demo_model.py --preset official --seed 1 --out DIR. Run it
on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "client" / "python"))
from fastformer_testing import ServerProcess, free_port  # noqa: E402
from fastformer_testing.bench import Runner, Scenario, medians  # noqa: E402


class Server(ServerProcess):
    """The harness's server process (tools/fastformer_testing), pinned to --server-cpus, ready
    once gRPC health says SERVING, stopped when the `with` block ends."""

    def __init__(self, args, *extra):
        self.args = args
        port, metrics_port = free_port(), free_port()
        pin = ["taskset", "-c", args.server_cpus] if args.server_cpus else []
        mixed = ["--mixed-batch-tokens", str(args.mixed_batch_tokens)] if args.mixed_batch_tokens is not None else []
        super().__init__(
            None, args=["--model-dir", args.model_dir,
                        "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                        "--http-listen", "", "--backend", "cpu", "--threads", str(args.threads),
                        "--dtype", args.dtype, "--max-batch-tokens", str(args.batch_tokens),
                        "--max-request-tokens", str(max(args.batch_tokens, args.bulk_texts * args.bulk_tokens)),
                        "--max-queue-tokens", str(1 << 22), *mixed, *extra],
            bin_dir=Path(args.build_dir) / "bin", base_env=os.environ, prefix=pin, start_timeout=60, stop_grace=60)

    def __enter__(self):
        try:
            self.wait_grpc_health()
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def batch_totals(self):
        """(seconds, batches, tokens) the engine spent on batches so far (/metrics sums)."""
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

    def loadgen(self, *flags, warmup, seconds):
        """Starts one fastformer-loadgen step (its JSON line on stdout)."""
        return subprocess.Popen(
            [str(Path(self.args.build_dir) / "bin" / "fastformer-loadgen"), "--target", f"127.0.0.1:{self.port}",
             "--warmup", str(warmup), "--duration", str(seconds), "--deadline-ms", "120000", "--json",
             *[str(f) for f in flags]],
            stdout=subprocess.PIPE, text=True)


def finish(proc):
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"fastformer-loadgen exited with {proc.returncode}")
    step = json.loads(out.strip().splitlines()[-1])
    if step["errors"]:
        raise RuntimeError(f"fastformer-loadgen: errors {step['errors']}")
    return step


def bulk_flags(args, priority):
    return ["--concurrency", args.bulk_clients, "--sequences-per-request", args.bulk_texts,
            "--lengths", f"fixed:{args.bulk_tokens}", "--priority", priority, "--seed", 100]


def query_flags(args, priority, *, rate=None, clients=None):
    load = ["--rate", f"{rate:.3f}"] if rate else ["--concurrency", clients]
    return [*load, "--lengths", f"fixed:{args.query_tokens}", "--priority", priority, "--seed", 200]


def median_of(runs: list) -> dict:
    """Each figure of the runs (one a round) as its median, the keys of the first run kept: a
    figure that is not a number in every round (None: no bulk, no queries) is None."""
    med = medians(runs)
    return {k: med.get(k) for k in runs[0]}


def measure(name, run_once, args, tool="bench_priority", on_run=None):
    """`run_once` --rounds times (the runner: no warm-up call, each load generator has its own):
    the Result."""
    return Runner(rounds=args.rounds, tool=tool, on_run=on_run).run([Scenario(name, run_once)])


def phase(srv, args, *, bulk, query_rate=0, bulk_priority="bulk", saturate_clients=0, seconds=None):
    seconds = seconds or args.seconds
    procs = {}
    if bulk:
        procs["bulk"] = srv.loadgen(*bulk_flags(args, bulk_priority), warmup=args.warmup, seconds=seconds)
    if query_rate or saturate_clients:
        procs["query"] = srv.loadgen(*query_flags(args, "interactive", rate=query_rate, clients=saturate_clients),
                                     warmup=args.warmup, seconds=seconds)
    time.sleep(args.warmup)  # the load generators' warm-up: then their measured window
    before = srv.batch_totals()
    time.sleep(seconds)
    after = srv.batch_totals()
    steps = {name: finish(p) for name, p in procs.items()}
    batches = after[1] - before[1]
    q = steps.get("query")
    return {
        "bulk_tokens_per_s": steps["bulk"]["tokens_per_second"] if bulk else None,
        "bulk_requests": steps["bulk"]["succeeded"] if bulk else 0,
        # the engine's mean time a batch, and its mean tokens, over the phase (from /metrics)
        "batch_compute_ms": (after[0] - before[0]) / batches * 1000 if batches else None,
        "batch_tokens": (after[2] - before[2]) / batches if batches else None,
        "queries": q["succeeded"] if q else 0,
        "query_rate": q["requests_per_second"] if q else 0,
        "query_p50_ms": q["latency_ms"]["p50"] if q else None,
        "query_p99_ms": q["latency_ms"]["p99"] if q else None,
        "query_server_queue_p99_ms": q["server_queue_ms"]["p99"] if q else None,
        "query_server_compute_p99_ms": q["server_compute_ms"]["p99"] if q else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of each measurement (the phases alternate within a round); figures are medians")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--mixed-batch-tokens", type=int, default=None,
                    help="the server's --mixed-batch-tokens (default: the server's, half a batch)")
    ap.add_argument("--bulk-clients", type=int, default=3)
    ap.add_argument("--bulk-texts", type=int, default=64)
    ap.add_argument("--bulk-tokens", type=int, default=128)
    ap.add_argument("--query-tokens", type=int, default=16)
    ap.add_argument("--query-share", type=float, default=0.05)
    ap.add_argument("--saturate-clients", type=int, default=8)
    ap.add_argument("--promote-ms", type=int, default=500)
    ap.add_argument("--promote-probes", type=int, default=10, help="bulk requests sent, one a second")
    ap.add_argument("--server-cpus", default="",
                    help="run the server on these CPUs (taskset -c), e.g. 0; run this script under "
                         "taskset -c on the others, so the load generator does not take the server's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    if args.rounds < 1:
        ap.error("--rounds must be at least 1")

    def progress(rnd, scenario, r):
        p50 = f"{r['query_p50_ms']:7.1f}" if r["queries"] else "      -"
        p99 = f"{r['query_p99_ms']:7.1f}" if r["queries"] else "      -"
        print(f"{scenario.name:>24}: bulk {r['bulk_tokens_per_s'] or 0:>10,.0f} tokens/s, batch "
              f"{r['batch_compute_ms'] or 0:6.1f} ms of {r['batch_tokens'] or 0:,.0f} tokens; queries "
              f"{r['queries']:>5} p50 {p50} ms p99 {p99} ms (round {rnd + 1}/{args.rounds})", file=sys.stderr)

    with Server(args, "--bulk-promote-after-ms", "60000") as srv:
        sat_runs = measure("saturation", lambda: phase(srv, args, bulk=False, saturate_clients=args.saturate_clients,
                                                       seconds=max(5, args.seconds / 2)), args)
        sat = median_of(sat_runs.runs["saturation"])
        rate = args.query_share * sat["query_rate"]
        print(f"interactive saturation {sat['query_rate']:.0f} queries/s; the interactive client sends "
              f"{rate:.1f}/s", file=sys.stderr)
        runs = {
            "bulk alone": dict(bulk=True),
            "interactive alone": dict(bulk=False, query_rate=rate),
            "mix, priority classes": dict(bulk=True, query_rate=rate),
            "mix, one class (FIFO)": dict(bulk=True, query_rate=rate, bulk_priority="interactive"),
        }
        measured = Runner(rounds=args.rounds, tool="bench_priority", on_run=progress).run(
            [Scenario(name, lambda kw=kw: phase(srv, args, **kw), params=kw) for name, kw in runs.items()])
    ph = {name: median_of(measured.runs[name]) for name in runs}
    full_ms = ph["bulk alone"]["batch_compute_ms"]
    bound = 2 * ph["interactive alone"]["query_p99_ms"] + 2 * full_ms
    mix = ph["mix, priority classes"]
    acceptance = {
        "interactive_p99_bound_ms": bound,
        "interactive_p99_ms": mix["query_p99_ms"],
        "bulk_share": mix["bulk_tokens_per_s"] / ph["bulk alone"]["bulk_tokens_per_s"],
    }

    # The promotion bound: interactive clients saturate the server; bulk requests among them.
    with Server(args, "--bulk-promote-after-ms", str(args.promote_ms)) as srv:
        def promotion():
            seconds = float(args.promote_probes)
            flood = srv.loadgen(*bulk_flags(args, "interactive"), warmup=args.warmup, seconds=seconds + 1)
            time.sleep(args.warmup)
            before = srv.batch_totals()
            probes = srv.loadgen("--rate", "1", "--arrivals", "constant", "--lengths", f"fixed:{args.query_tokens}",
                                 "--priority", "bulk", "--seed", 7, warmup=0, seconds=seconds)
            probe = finish(probes)
            after = srv.batch_totals()
            finish(flood)
            batch_ms = (after[0] - before[0]) / max(1.0, after[1] - before[1]) * 1000
            return {"bound_ms": args.promote_ms, "probes": probe["succeeded"],
                    "bulk_latency_ms": probe["latency_ms"], "bulk_queue_ms": probe["server_queue_ms"],
                    "batch_compute_ms": batch_ms}

        promo_runs = measure("promotion", promotion, args)
    pr = {**median_of(promo_runs.runs["promotion"]), "bound_ms": args.promote_ms}  # a setting, not a median
    print(f"promotion: bound {args.promote_ms} ms, {pr['probes']:g} bulk requests under an interactive "
          f"flood answered in {pr['bulk_latency_ms']['min']:.0f}-{pr['bulk_latency_ms']['max']:.0f} ms, queued in "
          f"the server {pr['bulk_queue_ms']['min']:.0f}-{pr['bulk_queue_ms']['max']:.0f} ms (bound + "
          f"2 batches of {pr['batch_compute_ms']:.1f} ms: {args.promote_ms + 2 * pr['batch_compute_ms']:.0f} ms)",
          file=sys.stderr)
    # The runner's record (tool, date, command, commit, machine; rounds, each phase's runs and
    # medians) with this tool's figures as before: the medians.
    result = measured.record(
        args=vars(args), saturation_queries_per_s=sat["query_rate"], query_rate=rate, phases=ph,
        acceptance=acceptance, promotion=pr,
        saturation={"runs": sat_runs.runs["saturation"], "median": sat_runs.median("saturation")},
        promotion_runs=promo_runs.runs["promotion"])
    if args.json:
        print(json.dumps(result))
        return 0
    mixed = args.mixed_batch_tokens if args.mixed_batch_tokens is not None else "the default (half)"
    rounds = f", medians of {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"{result['machine']['description']}, {result['date']}{rounds}; {args.dtype}, {args.threads} threads, batches of "
          f"{args.batch_tokens} tokens, --mixed-batch-tokens {mixed}; bulk: {args.bulk_clients} clients x "
          f"{args.bulk_texts} x {args.bulk_tokens} tokens; queries of {args.query_tokens} tokens at {rate:.1f}/s "
          f"({args.query_share:.0%} of {result['saturation_queries_per_s']:.0f}/s)\n")
    print("| phase | interactive p50 ms | interactive p99 ms | bulk tokens/s | batch compute ms (mean tokens) |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in ph.items():
        bulk = f"{r['bulk_tokens_per_s']:,.0f}" if r["bulk_tokens_per_s"] else ""
        batch = f"{r['batch_compute_ms']:.1f} ({r['batch_tokens']:,.0f})" if r["batch_compute_ms"] else ""
        p50 = f"{r['query_p50_ms']:.1f}" if r["queries"] else ""
        p99 = f"{r['query_p99_ms']:.1f}" if r["queries"] else ""
        print(f"| {name} | {p50} | {p99} | {bulk} | {batch} |")
    acc = acceptance
    print(f"\nInteractive p99 {acc['interactive_p99_ms']:.1f} ms against 2 x {ph['interactive alone']['query_p99_ms']:.1f}"
          f" + 2 x {full_ms:.1f} = {acc['interactive_p99_bound_ms']:.1f} ms; bulk {acc['bulk_share']:.1%} of bulk alone")
    print(f"Promotion: bound {pr['bound_ms']} ms; {pr['probes']:g} bulk requests under an interactive flood answered "
          f"in {pr['bulk_latency_ms']['min']:.0f}-{pr['bulk_latency_ms']['max']:.0f} ms, of which queued in the "
          f"server {pr['bulk_queue_ms']['min']:.0f}-{pr['bulk_queue_ms']['max']:.0f} ms (batches of "
          f"{pr['batch_compute_ms']:.1f} ms: bound + 2 batches {pr['bound_ms'] + 2 * pr['batch_compute_ms']:.0f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Closed-loop load through the gRPC server, for docs/benchmarks.md.

    bench_serve.py --target HOST:PORT [--lengths uniform:16:256] [--sequences-per-request 8]
                   [--concurrency 8] [--seconds 20] [--warmup 2] [--seed 1] [--stream] [--json]

Sequences come from the same generator as fastformer-bench (tools/workload.py), grouped
`--sequences-per-request` to a request. `--concurrency` client threads each keep one
request in flight (unary Encode, or one EncodeStream per thread with --stream).
Reports throughput, end-to-end latency, and the server's overhead per request:
end-to-end latency minus the response's compute_time_us.

The dedicated load generator (fastformer-loadgen) arrives with the clients issue; this
script is the measurement behind the server's figures until then.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from workload import percentile_nearest_rank, sequence_stream  # noqa: E402


def load_stubs():
    """Generates the Python stubs from proto/ into a temporary directory (never committed)."""
    out = tempfile.mkdtemp(prefix="fastformer-stubs-")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO / 'proto'}", f"--python_out={out}",
                    f"--grpc_python_out={out}", str(REPO / "proto/fastformer/v1/encoder.proto")], check=True)
    sys.path.insert(0, out)
    from fastformer.v1 import encoder_pb2, encoder_pb2_grpc  # noqa: E402
    return encoder_pb2, encoder_pb2_grpc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="127.0.0.1:50051")
    ap.add_argument("--lengths", default="uniform:16:256")
    ap.add_argument("--sequences-per-request", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pool-requests", type=int, default=256)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    pb, pbg = load_stubs()
    channel = grpc.insecure_channel(args.target, options=[("grpc.max_receive_message_length", -1)])
    stub = pbg.EncoderStub(channel)
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=30)
    stream = sequence_stream(args.seed, args.lengths, info.vocab_size, 0)
    pool = []
    for i in range(args.pool_requests):
        seqs = [next(stream) for _ in range(args.sequences_per_request)]
        pool.append((pb.EncodeRequest(request_id=str(i), sequences=[pb.Sequence(token_ids=s) for s in seqs]),
                     sum(len(s) for s in seqs)))

    lock = threading.Lock()
    records = []  # (end_time, latency_s, overhead_s, tokens, sequences) of successful requests
    errors = {}
    start_at = time.perf_counter() + 0.2
    measure_from = start_at + args.warmup
    stop_at = measure_from + args.seconds

    def record(t0, t1, resp, tokens, code=None):
        with lock:
            if code is not None:
                errors[code] = errors.get(code, 0) + 1
            elif t1 >= measure_from and t1 <= stop_at:
                records.append((t1, t1 - t0, (t1 - t0) - resp.compute_time_us / 1e6, tokens,
                                len(resp.encodings)))

    def unary_worker(k):
        for i in itertools.count(k, args.concurrency):
            if time.perf_counter() >= stop_at:
                return
            req, tokens = pool[i % len(pool)]
            t0 = time.perf_counter()
            try:
                resp = stub.Encode(req, timeout=60)
                record(t0, time.perf_counter(), resp, tokens)
            except grpc.RpcError as e:
                record(t0, time.perf_counter(), None, tokens, e.code().name)

    def stream_worker(k):
        sent = {}
        ready = threading.Semaphore(1)

        def requests():
            for i in itertools.count(k, args.concurrency):
                ready.acquire()
                if time.perf_counter() >= stop_at:
                    return
                req, tokens = pool[i % len(pool)]
                sent[req.request_id] = (time.perf_counter(), tokens)
                yield req

        for resp in stub.EncodeStream(requests()):
            t0, tokens = sent.pop(resp.request_id)
            if resp.error.code:
                record(t0, time.perf_counter(), None, tokens, str(resp.error.code))
            else:
                record(t0, time.perf_counter(), resp, tokens)
            ready.release()

    while time.perf_counter() < start_at:
        time.sleep(0.01)
    threads = [threading.Thread(target=stream_worker if args.stream else unary_worker, args=(k,), daemon=True)
               for k in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    lat = [r[1] * 1e3 for r in records]
    over = [r[2] * 1e3 for r in records]
    seconds = args.seconds
    result = {
        "target": args.target, "mode": "stream" if args.stream else "unary", "lengths": args.lengths,
        "sequences_per_request": args.sequences_per_request, "concurrency": args.concurrency,
        "requests": len(records), "requests_per_second": len(records) / seconds,
        "sequences_per_second": sum(r[4] for r in records) / seconds,
        "tokens_per_second": sum(r[3] for r in records) / seconds,
        "latency_ms": {p: percentile_nearest_rank(lat, q) for p, q in
                       (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))} if lat else {},
        "overhead_ms": {p: percentile_nearest_rank(over, q) for p, q in
                        (("p50", 50), ("p99", 99))} if over else {},
        "errors": errors,
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(f"{result['mode']} c={args.concurrency}: {result['tokens_per_second']:,.0f} tokens/s, "
              f"{result['requests_per_second']:.1f} req/s, latency p50 {result['latency_ms'].get('p50', 0):.1f} ms "
              f"p99 {result['latency_ms'].get('p99', 0):.1f} ms, overhead p50 {result['overhead_ms'].get('p50', 0):.2f} ms "
              f"p99 {result['overhead_ms'].get('p99', 0):.2f} ms, errors {errors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

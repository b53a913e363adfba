#!/usr/bin/env python3
"""The synthetic benchmark workload shared by tools/bench_pytorch.py and the C++
`fastformer-bench`. Both MUST implement exactly this, so they run the same sequences.

PRNG: splitmix64, state a uint64 initialised to `seed`; all arithmetic mod 2^64:

    next():  state += 0x9E3779B97F4A7C15
             z = state
             z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
             z = (z ^ (z >> 27)) * 0x94D049BB133111EB
             return z ^ (z >> 31)

    (seed 0: the first value is 0xE220A8397B1DCDAF.)

Lengths spec: "fixed:L" (L >= 1) or "uniform:MIN:MAX" (1 <= MIN <= MAX).

Sequences are generated one after another from ONE stream:
    length = L                               for fixed (no draw)
    length = MIN + next() % (MAX - MIN + 1)  for uniform (one draw)
    then `length` token ids, each:  r  = next() % (vocab_size - 1)
                                    id = r if r < pad_token_id else r + 1
    (ids are in [0, vocab_size) and never pad_token_id; vocab_size >= 2.)
vocab_size and pad_token_id are the model's (config.json).

Batches: sequences are packed greedily in generation order. A batch takes the
next sequence while its total tokens stay <= batch_tokens; a batch always holds
at least one sequence (a sequence longer than batch_tokens is a batch alone).
The sequence that would overflow batch k closes it and becomes the first
sequence of batch k+1 (it is not regenerated). The pool is the first
`pool_batches` batches (default 8); generation stops at the sequence that would
overflow the last pool batch (that sequence is discarded).

Run: `warmup_batches` (default 2) untimed batches first, cycling over the pool
(pool[0], pool[1], ...); then timed batches continue cycling from where warm-up
stopped, until at least `seconds` have elapsed AND at least len(pool) timed
batches ran (one full pass). Each timed batch is timed on its own (wall clock).
Tokens counted are real (unpadded) tokens.

Result fields: tokens_per_second = tokens / seconds, sequences_per_second =
sequences / seconds, batches, tokens, sequences (all over the timed batches),
seconds (wall time from the first timed batch's start to the last one's end),
batch_latency_p50_ms,
batch_latency_p99_ms (nearest rank over the timed batches: the ceil(p/100 * n)-th
smallest), peak_rss_bytes (getrusage(RUSAGE_SELF).ru_maxrss * 1024), backend,
threads, dtype, lengths, batch_tokens, seed (and pool_batches, warmup_batches).

CLI (to compare with fastformer-bench's pool):
    workload.py --lengths SPEC --seed N --vocab-size V [--pad-token-id P]
                --batch-tokens N [--pool-batches 8]
prints one JSON object: per pool batch the sequence lengths, token count and
the sum of its token ids, plus the first 8 ids of the first sequence.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from typing import Callable, List, Sequence, Tuple

MASK64 = (1 << 64) - 1


class SplitMix64:
    def __init__(self, seed: int):
        self.state = seed & MASK64

    def next(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)


def parse_lengths(spec: str) -> Tuple[int, int]:
    """'fixed:L' -> (L, L); 'uniform:MIN:MAX' -> (MIN, MAX). Raises ValueError."""
    parts = spec.split(":")
    try:
        if parts[0] == "fixed" and len(parts) == 2:
            lo = hi = int(parts[1])
        elif parts[0] == "uniform" and len(parts) == 3:
            lo, hi = int(parts[1]), int(parts[2])
        else:
            raise ValueError
    except ValueError:
        raise ValueError(f"bad lengths spec {spec!r}: expected fixed:L or uniform:MIN:MAX") from None
    if lo < 1 or hi < lo:
        raise ValueError(f"bad lengths spec {spec!r}: need 1 <= MIN <= MAX")
    return lo, hi


def sequence_stream(seed: int, lengths: str, vocab_size: int, pad_token_id: int = 0):
    """Yields token-id lists forever, per the spec above."""
    lo, hi = parse_lengths(lengths)
    fixed = lengths.startswith("fixed:")
    if vocab_size < 2:
        raise ValueError("vocab_size must be >= 2")
    rng = SplitMix64(seed)
    span = hi - lo + 1
    nv = vocab_size - 1
    while True:
        n = lo if fixed else lo + rng.next() % span
        ids = []
        for _ in range(n):
            r = rng.next() % nv
            ids.append(r if r < pad_token_id else r + 1)
        yield ids


def make_pool(seed: int, lengths: str, vocab_size: int, pad_token_id: int,
              batch_tokens: int, pool_batches: int = 8) -> List[List[List[int]]]:
    """The first `pool_batches` greedily packed batches (lists of sequences)."""
    if batch_tokens < 1 or pool_batches < 1:
        raise ValueError("batch_tokens and pool_batches must be >= 1")
    pool: List[List[List[int]]] = []
    cur: List[List[int]] = []
    cur_tokens = 0
    for seq in sequence_stream(seed, lengths, vocab_size, pad_token_id):
        if cur and cur_tokens + len(seq) > batch_tokens:
            pool.append(cur)
            if len(pool) == pool_batches:
                break
            cur, cur_tokens = [], 0
        cur.append(seq)
        cur_tokens += len(seq)
    return pool


def percentile_nearest_rank(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(1, math.ceil(p / 100.0 * len(s)))
    return s[min(k, len(s)) - 1]


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run_timed(run_batch: Callable[[int], None], pool_size: int, seconds: float,
              warmup_batches: int = 2):
    """Run batches per the spec; run_batch(i) runs pool batch i.

    Returns (list of timed pool indices, per-batch latencies in seconds, wall seconds)."""
    k = 0
    for _ in range(warmup_batches):
        run_batch(k % pool_size)
        k += 1
    indices, lat = [], []
    t0 = time.perf_counter()
    while True:
        i = k % pool_size
        b0 = time.perf_counter()
        run_batch(i)
        b1 = time.perf_counter()
        indices.append(i)
        lat.append(b1 - b0)
        k += 1
        if b1 - t0 >= seconds and len(indices) >= pool_size:
            break
    return indices, lat, time.perf_counter() - t0


def summarize(pool, indices, latencies, wall_seconds, **extra) -> dict:
    tokens = sum(sum(len(s) for s in pool[i]) for i in indices)
    sequences = sum(len(pool[i]) for i in indices)
    out = {
        "tokens_per_second": tokens / wall_seconds,
        "sequences_per_second": sequences / wall_seconds,
        "batches": len(indices),
        "tokens": tokens,
        "sequences": sequences,
        "seconds": wall_seconds,
        "batch_latency_p50_ms": percentile_nearest_rank(latencies, 50) * 1e3,
        "batch_latency_p99_ms": percentile_nearest_rank(latencies, 99) * 1e3,
        "peak_rss_bytes": peak_rss_bytes(),
    }
    out.update(extra)
    return out


def describe_pool(pool) -> dict:
    return {
        "batches": [{"lengths": [len(s) for s in b], "tokens": sum(len(s) for s in b),
                     "id_sum": sum(sum(s) for s in b)} for b in pool],
        "first_ids": pool[0][0][:8] if pool else [],
    }


def add_bench_arguments(ap) -> None:
    """The options every benchmark of the workload shares, with fastformer-bench's names and
    defaults (tools/bench_pytorch.py, tools/bench_onnxruntime.py)."""
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--lengths", default="uniform:16:256")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pool-batches", type=int, default=8)
    ap.add_argument("--warmup-batches", type=int, default=2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="print the benchmark pool summary (see module doc)")
    ap.add_argument("--lengths", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocab-size", type=int, required=True)
    ap.add_argument("--pad-token-id", type=int, default=0)
    ap.add_argument("--batch-tokens", type=int, required=True)
    ap.add_argument("--pool-batches", type=int, default=8)
    a = ap.parse_args(argv)
    try:
        pool = make_pool(a.seed, a.lengths, a.vocab_size, a.pad_token_id, a.batch_tokens, a.pool_batches)
    except ValueError as e:
        print(f"workload: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(describe_pool(pool)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

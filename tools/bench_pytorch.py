#!/usr/bin/env python3
"""PyTorch baseline for `fastformer-bench`: the same workload (tools/workload.py),
run through the reference model's official forward path with padded batches.

    bench_pytorch.py --model-dir DIR --threads N --batch-tokens N --lengths SPEC
                     --seconds S --seed N [--pool-batches 8] [--warmup-batches 2]
                     [--dtype float32|bfloat16] [--json]

The model is loaded from DIR with the reference code (float32, or bfloat16 with
--dtype bfloat16), eval() and torch.inference_mode(); torch.set_num_threads(N),
torch.set_num_interop_threads(1). Each pool batch is padded on the right to its
longest sequence with pad_token_id (PyTorch's calling convention: the padded
tensors are built before timing) and run as Model.forward(input_ids): mask from
the ids, word embedding, FastformerEncoder, pooled vector, head if present.
Tokens counted are real tokens; padded_tokens counts the padded ones too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_model_dir  # noqa: E402
from workload import make_pool, parse_lengths, run_timed, summarize  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def padded_batches(pool, pad_token_id):
    out = []
    for batch in pool:
        L = max(len(s) for s in batch)
        t = torch.full((len(batch), L), pad_token_id, dtype=torch.long)
        for i, s in enumerate(batch):
            t[i, :len(s)] = torch.tensor(s, dtype=torch.long)
        out.append(t)
    return out


def run_benchmark(model_dir, threads=1, batch_tokens=8192, lengths="uniform:16:256", seconds=10.0,
                  seed=1, pool_batches=8, warmup_batches=2, dtype="float32") -> dict:
    parse_lengths(lengths)
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set in this process (e.g. called twice from tests)
        pass
    model, cfg = load_model_dir(model_dir, dtype=DTYPES[dtype])
    model.eval()
    if model.word_embedding is None:
        raise ValueError(f"{model_dir}: the model has no word embedding; the benchmark sends token ids")
    pool = make_pool(seed, lengths, model.vocab_size, cfg.pad_token_id, batch_tokens, pool_batches)
    tensors = padded_batches(pool, cfg.pad_token_id)
    if max(t.shape[1] for t in tensors) > cfg.max_position_embeddings:
        raise ValueError(f"sequences longer than max_position_embeddings {cfg.max_position_embeddings}")
    with torch.inference_mode():
        def run_batch(i):
            model(tensors[i])
        indices, lat, wall = run_timed(run_batch, len(pool), seconds, warmup_batches)
    padded = sum(tensors[i].numel() for i in indices)
    return summarize(pool, indices, lat, wall, padded_tokens=padded, backend="pytorch",
                     threads=threads, dtype=dtype, lengths=lengths, batch_tokens=batch_tokens,
                     seed=seed, pool_batches=pool_batches, warmup_batches=warmup_batches,
                     torch_version=torch.__version__)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--lengths", default="uniform:16:256")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pool-batches", type=int, default=8)
    ap.add_argument("--warmup-batches", type=int, default=2)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        r = run_benchmark(a.model_dir, a.threads, a.batch_tokens, a.lengths, a.seconds, a.seed,
                          a.pool_batches, a.warmup_batches, a.dtype)
    except (ValueError, OSError) as e:
        print(f"bench_pytorch: error: {e}", file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps(r))
    else:
        print(f"pytorch {a.dtype} threads={a.threads} lengths={a.lengths} batch_tokens={a.batch_tokens}: "
              f"{r['tokens_per_second']:.0f} tokens/s, {r['sequences_per_second']:.1f} seq/s, "
              f"{r['batches']} batches in {r['seconds']:.2f} s, p50 {r['batch_latency_p50_ms']:.1f} ms, "
              f"p99 {r['batch_latency_p99_ms']:.1f} ms, padding {r['padded_tokens'] / r['tokens']:.2f}x, "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch baseline for `fastformer-bench`: the same workload (tools/workload.py),
run through the reference model's official forward path with padded batches.

    bench_pytorch.py --model-dir DIR --threads N --batch-tokens N --lengths SPEC
                     --seconds S --seed N [--pool-batches 8] [--warmup-batches 2]
                     [--dtype float32|float16|bfloat16] [--device cpu|cuda] [--compile]
                     [--json]

The model is loaded from DIR with the reference code (float32, or bfloat16 /
float16 with --dtype; float16 only on cuda), eval() and torch.inference_mode();
torch.set_num_threads(N), torch.set_num_interop_threads(1). Each pool batch is
padded on the right to its longest sequence with pad_token_id (PyTorch's calling
convention: the padded tensors are built, and moved to the device, before timing)
and run as Model.forward(input_ids): mask from the ids, word embedding,
FastformerEncoder, pooled vector, head if present. Tokens counted are real
tokens; padded_tokens counts the padded ones too.

--device cuda runs the model on the GPU; each batch ends with
torch.cuda.synchronize(), so its wall-clock latency covers its kernels (the
result adds device_name and peak_gpu_memory_bytes). --compile wraps the model in
torch.compile(dynamic=True) and runs one untimed pass over the pool before the
usual warm-up, so compilation stays out of the timing (compile_seconds is that
pass). If torch.compile is missing or fails, the JSON says so (compile_error, and
tokens_per_second null) and the exit status is still 0: a failed compile is a
result, not a crash. Every run adds device and compile to the fields.

--json opens with the bench runner's header (tools/fastformer_testing/bench.py, standard library
only): tool, date, command, commit, machine; the fields above follow it, unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import load_model_dir  # noqa: E402
from workload import add_bench_arguments, make_pool, parse_lengths, run_timed, summarize  # noqa: E402
from fastformer_testing.bench import header  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DEVICES = ("cpu", "cuda")


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
                  seed=1, pool_batches=8, warmup_batches=2, dtype="float32", device="cpu",
                  compile=False) -> dict:
    parse_lengths(lengths)
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch.cuda.is_available() is False (no GPU or no driver)")
    if device == "cpu" and dtype == "float16":
        raise ValueError("float16 needs --device cuda (PyTorch's CPU kernels lack half matmuls)")
    torch.set_num_threads(threads)
    if torch.get_num_interop_threads() != 1:  # a second call would abort (torch 1.13)
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
    extra = {}
    cuda = device == "cuda"
    if cuda:
        dev = torch.device("cuda")
        model = model.to(dev)
        tensors = [t.to(dev) for t in tensors]
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        extra["device_name"] = torch.cuda.get_device_name()
    forward = model
    with torch.inference_mode():
        if compile:
            if not hasattr(torch, "compile"):
                raise CompileFailed(f"torch {torch.__version__} has no torch.compile")
            try:
                forward = torch.compile(model, dynamic=True)
                t0 = time.perf_counter()
                for t in tensors:  # every shape once, so nothing compiles while timed
                    forward(t)
                if cuda:
                    torch.cuda.synchronize()
                extra["compile_seconds"] = time.perf_counter() - t0
            except Exception as e:  # noqa: BLE001 - any compiler failure is a result
                raise CompileFailed(f"{type(e).__name__}: {e}", traceback.format_exc()) from e

        def run_batch(i):
            forward(tensors[i])
            if cuda:
                torch.cuda.synchronize()
        try:
            indices, lat, wall = run_timed(run_batch, len(pool), seconds, warmup_batches)
        except Exception as e:  # noqa: BLE001
            if not compile:
                raise
            raise CompileFailed(f"{type(e).__name__}: {e}", traceback.format_exc()) from e
    padded = sum(tensors[i].numel() for i in indices)
    if cuda:
        extra["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated()
    return summarize(pool, indices, lat, wall, padded_tokens=padded, backend="pytorch",
                     threads=threads, dtype=dtype, lengths=lengths, batch_tokens=batch_tokens,
                     seed=seed, pool_batches=pool_batches, warmup_batches=warmup_batches,
                     torch_version=torch.__version__, device=device, compile=compile, **extra)


class CompileFailed(Exception):
    """torch.compile is missing or failed; reported in the JSON, not raised out of main."""

    def __init__(self, message, trace=""):
        super().__init__(message)
        self.trace = trace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--device", choices=DEVICES, default="cpu")
    ap.add_argument("--compile", action="store_true",
                    help="try torch.compile; a failure is reported in the JSON (compile_error)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        r = run_benchmark(a.model_dir, a.threads, a.batch_tokens, a.lengths, a.seconds, a.seed,
                          a.pool_batches, a.warmup_batches, a.dtype, a.device, a.compile)
    except (ValueError, OSError) as e:
        print(f"bench_pytorch: error: {e}", file=sys.stderr)
        return 2
    except CompileFailed as e:
        print(f"bench_pytorch: torch.compile failed: {e}", file=sys.stderr)
        if e.trace:
            print(e.trace, file=sys.stderr)
        r = {"tokens_per_second": None, "backend": "pytorch", "device": a.device, "compile": True,
             "compile_error": str(e)[:2000], "threads": a.threads, "dtype": a.dtype,
             "lengths": a.lengths, "batch_tokens": a.batch_tokens, "seed": a.seed,
             "pool_batches": a.pool_batches, "warmup_batches": a.warmup_batches,
             "torch_version": torch.__version__}
        print(json.dumps({**header("bench_pytorch"), **r}) if a.json
              else f"pytorch --compile: failed: {r['compile_error']}")
        return 0
    if a.json:  # the runner's header (tool, date, command, commit, machine), then the result
        print(json.dumps({**header("bench_pytorch"), **r}))
    else:
        print(f"pytorch {a.dtype} {a.device}{' compiled' if a.compile else ''} threads={a.threads} "
              f"lengths={a.lengths} batch_tokens={a.batch_tokens}: "
              f"{r['tokens_per_second']:.0f} tokens/s, {r['sequences_per_second']:.1f} seq/s, "
              f"{r['batches']} batches in {r['seconds']:.2f} s, p50 {r['batch_latency_p50_ms']:.1f} ms, "
              f"p99 {r['batch_latency_p99_ms']:.1f} ms, padding {r['padded_tokens'] / r['tokens']:.2f}x, "
              f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

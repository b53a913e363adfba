#!/usr/bin/env python3
"""Softmax-attention baseline for the CUDA engine: a BERT-size encoder of the same
width and depth as a Fastformer preset, built from torch.nn modules around
torch.nn.functional.scaled_dot_product_attention (SDPA: flash / memory-efficient
attention on the GPU), with random weights.

    bench_sdpa.py [--model-dir DIR | --hidden D --heads H --layers N --intermediate I]
                  --tokens-per-sequence N --batch-tokens N [--dtype bfloat16]
                  [--device cuda|cpu] [--seconds S] [--warmup-batches 2] [--min-batches 3]
                  [--norm post|pre] [--vocab V] [--seed N] [--threads N] [--json]

Shapes: --model-dir reads hidden_size, num_attention_heads, num_hidden_layers,
intermediate_size, hidden_act and vocab_size from DIR/config.json (explicit flags
override it; with neither, BERT-base: 768, 12, 12, 3072). Each batch holds
max(1, batch_tokens // tokens_per_sequence) sequences of exactly
tokens_per_sequence tokens (no padding, no mask), random token ids drawn once.

The model: word + position embedding (the position table has tokens_per_sequence
rows) and LayerNorm; per layer a fused QKV projection, SDPA over H heads, output
projection, LayerNorm, and a GELU FFN (D -> I -> D), post-LN (BERT) or pre-LN
(--norm pre, with a final LayerNorm); a first-token pooled vector at the end.
Weights are torch.nn's default init, seeded, in --dtype, eval() and inference_mode.

Timing, as tools/bench_pytorch.py and fastformer-bench: warm-up batches first, then
batches until at least --seconds have passed and at least --min-batches ran. On CUDA
each batch is timed with CUDA events (and synchronised), on the CPU with a wall clock.
Result fields: tokens_per_second, sequences_per_second, batches, tokens, sequences,
seconds, batch_latency_p50_ms, batch_latency_p99_ms (nearest rank), peak_rss_bytes,
backend ("pytorch-sdpa"), device, dtype, tokens_per_sequence, batch_tokens, hidden,
heads, layers, intermediate, norm, attention ("sdpa", or "math" on a PyTorch without
SDPA), flops_per_batch (matmul FLOPs, attention included), tflops, torch_version,
and on CUDA device_name and peak_gpu_memory_bytes. --json opens with the bench runner's header
(tools/fastformer_testing/bench.py, standard library only): tool, date, command, commit, machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from workload import peak_rss_bytes, percentile_nearest_rank  # noqa: E402
from fastformer_testing.bench import header  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
BERT_BASE = {"hidden": 768, "heads": 12, "layers": 12, "intermediate": 3072, "vocab": 30522}
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def attention(q, k, v):
    """softmax(q k^T / sqrt(d)) v over [B, H, n, d]; SDPA where PyTorch has it."""
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v)
    scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), v)


class EncoderLayer(nn.Module):
    def __init__(self, hidden, heads, intermediate, norm="post", act="gelu", eps=1e-12):
        super().__init__()
        self.heads, self.norm = heads, norm
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.ln1 = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, intermediate)
        self.ffn_out = nn.Linear(intermediate, hidden)
        self.ln2 = nn.LayerNorm(hidden, eps=eps)
        self.approximate = "tanh" if act in ("gelu_new", "gelu_pytorch_tanh") else "none"

    def self_attention(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        a = attention(q, k, v)  # [B, H, n, d/H]
        return self.out(a.transpose(1, 2).reshape(b, n, d))

    def ffn(self, x):
        if self.approximate == "none":
            return self.ffn_out(F.gelu(self.ffn_in(x)))
        return self.ffn_out(F.gelu(self.ffn_in(x), approximate=self.approximate))

    def forward(self, x):
        if self.norm == "pre":
            x = x + self.self_attention(self.ln1(x))
            return x + self.ffn(self.ln2(x))
        x = self.ln1(x + self.self_attention(x))
        return self.ln2(x + self.ffn(x))


class SdpaEncoder(nn.Module):
    def __init__(self, hidden, heads, layers, intermediate, vocab, positions, norm="post", act="gelu"):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(positions, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList([EncoderLayer(hidden, heads, intermediate, norm, act)
                                     for _ in range(layers)])
        self.final_ln = nn.LayerNorm(hidden, eps=1e-12) if norm == "pre" else None

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.ln(self.word(ids) + self.position(pos)[None])
        for layer in self.layers:
            x = layer(x)
        if self.final_ln is not None:
            x = self.final_ln(x)
        return x[:, 0]


def matmul_flops(batch, n, hidden, layers, intermediate):
    """Multiply-add FLOPs (x2) of one batch: projections, FFN, and QK^T plus PV."""
    tokens = batch * n
    dense = 2 * tokens * (3 * hidden * hidden + hidden * hidden + 2 * hidden * intermediate)
    attn = 2 * 2 * batch * n * n * hidden
    return layers * (dense + attn)


def resolve_shape(a):
    shape = dict(BERT_BASE)
    act = "gelu"
    if a.model_dir:
        with open(os.path.join(a.model_dir, "config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        shape.update(hidden=cfg["hidden_size"], heads=cfg["num_attention_heads"],
                     layers=cfg["num_hidden_layers"], intermediate=cfg["intermediate_size"],
                     vocab=cfg.get("vocab_size", shape["vocab"]))
        act = cfg.get("hidden_act", act)
    for k in shape:
        v = getattr(a, k)
        if v is not None:
            shape[k] = v
    for k, v in shape.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"--{k} must be a positive integer, got {v!r}")
    return shape, act


def run_benchmark(shape, act="gelu", tokens_per_sequence=512, batch_tokens=65536, dtype="bfloat16",
                  device="cuda", seconds=5.0, warmup_batches=2, min_batches=3, norm="post",
                  seed=1, threads=None) -> dict:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch.cuda.is_available() is False")
    if device == "cpu" and dtype == "float16":
        raise ValueError("float16 needs --device cuda")
    if tokens_per_sequence < 1 or batch_tokens < 1:
        raise ValueError("--tokens-per-sequence and --batch-tokens must be >= 1")
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    n = tokens_per_sequence
    batch = max(1, batch_tokens // n)
    dev = torch.device(device)
    model = SdpaEncoder(shape["hidden"], shape["heads"], shape["layers"], shape["intermediate"],
                        shape["vocab"], n, norm, act)
    model = model.to(device=dev, dtype=DTYPES[dtype]).eval()
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, shape["vocab"], (batch, n), generator=gen).to(dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)

    lat = []
    with torch.inference_mode():
        for _ in range(warmup_batches):
            model(ids)
        if cuda:
            torch.cuda.synchronize(dev)
            first = torch.cuda.Event(enable_timing=True)
            first.record()
        t0 = time.perf_counter()
        while True:
            if cuda:
                b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                b0.record()
                model(ids)
                b1.record()
                b1.synchronize()
                lat.append(b0.elapsed_time(b1) / 1e3)
            else:
                b0 = time.perf_counter()
                model(ids)
                lat.append(time.perf_counter() - b0)
            if time.perf_counter() - t0 >= seconds and len(lat) >= min_batches:
                break
        if cuda:
            last = torch.cuda.Event(enable_timing=True)
            last.record()
            last.synchronize()
            wall = first.elapsed_time(last) / 1e3
        else:
            wall = time.perf_counter() - t0

    flops = matmul_flops(batch, n, shape["hidden"], shape["layers"], shape["intermediate"])
    tokens, sequences = len(lat) * batch * n, len(lat) * batch
    out = {
        "tokens_per_second": tokens / wall,
        "sequences_per_second": sequences / wall,
        "batches": len(lat),
        "tokens": tokens,
        "sequences": sequences,
        "seconds": wall,
        "batch_latency_p50_ms": percentile_nearest_rank(lat, 50) * 1e3,
        "batch_latency_p99_ms": percentile_nearest_rank(lat, 99) * 1e3,
        "peak_rss_bytes": peak_rss_bytes(),
        "backend": "pytorch-sdpa",
        "device": device,
        "dtype": dtype,
        "tokens_per_sequence": n,
        "batch_tokens": batch_tokens,
        "sequences_per_batch": batch,
        "hidden": shape["hidden"],
        "heads": shape["heads"],
        "layers": shape["layers"],
        "intermediate": shape["intermediate"],
        "vocab": shape["vocab"],
        "act": act,
        "norm": norm,
        "attention": "sdpa" if HAVE_SDPA else "math",
        "flops_per_batch": flops,
        "tflops": flops * len(lat) / wall / 1e12,
        "seed": seed,
        "warmup_batches": warmup_batches,
        "torch_version": torch.__version__,
    }
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(dev)
        out["peak_gpu_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", help="read the shape from DIR/config.json")
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--tokens-per-sequence", type=int, default=512)
    ap.add_argument("--batch-tokens", type=int, default=65536)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cuda")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--warmup-batches", type=int, default=2)
    ap.add_argument("--min-batches", type=int, default=3)
    ap.add_argument("--norm", choices=["post", "pre"], default="post")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (CPU)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    try:
        shape, act = resolve_shape(a)
        r = run_benchmark(shape, act, a.tokens_per_sequence, a.batch_tokens, a.dtype, a.device,
                          a.seconds, a.warmup_batches, a.min_batches, a.norm, a.seed, a.threads)
    except (ValueError, OSError, KeyError) as e:
        print(f"bench_sdpa: error: {e}", file=sys.stderr)
        return 2
    if a.json:  # the runner's header (tool, date, command, commit, machine), then the result
        print(json.dumps({**header("bench_sdpa"), **r}))
    else:
        print(f"sdpa {a.dtype} {a.device} D={shape['hidden']} L={shape['layers']} n={r['tokens_per_sequence']} "
              f"x{r['sequences_per_batch']}: {r['tokens_per_second']:.0f} tokens/s, {r['tflops']:.1f} TFLOP/s, "
              f"{r['batches']} batches in {r['seconds']:.2f} s, p50 {r['batch_latency_p50_ms']:.1f} ms, "
              f"p99 {r['batch_latency_p99_ms']:.1f} ms ({r['attention']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

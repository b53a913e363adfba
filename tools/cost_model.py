#!/usr/bin/env python3
"""Cost model of the CUDA engine: base-long in bfloat16 on one H200 (docs/kernels.md, "Cost model").

For every kernel and GEMM of one batch, the bytes it must move and the FLOPs it must do (the
formulas of server/engine/profiling_ops.cc, namespace `cost`, which fastformer-bench --profile reports),
the floor at the measured ceilings (4.3 TB/s device-to-device copy, 790 TFLOP/s bf16 matrix
product), and the expected time of the kernels as this issue writes them: the floor's bytes plus
what each kernel moves beyond them (pooling partials, token scores, the erf-GELU pass), at an
efficiency per kernel class, plus a fixed cost per launch. Standard library only.

    python3 tools/cost_model.py            # the markdown tables of docs/kernels.md
    python3 tools/cost_model.py --json     # the same figures as JSON
"""
import argparse
import json
from typing import NamedTuple


class Sizes(NamedTuple):
    D: int  # hidden
    H: int  # heads
    I: int  # intermediate
    layers: int
    E: int  # bytes per element of the serving dtype

    @property
    def qks(self):  # the fused Q|K|s width, padded to a multiple of 8 elements (1,552 for base-long)
        return (2 * self.D + self.H + 7) // 8 * 8


BASE_LONG_BF16 = Sizes(D=768, H=12, I=3072, layers=12, E=2)  # make_demo_model.py --preset base-long
CHUNK = 256  # kernels/pooling_chunks.h kChunkTokens
SHAPES = [("128 x 512", 128, 65536), ("1 x 65,536", 1, 65536)]  # (name, sequences B, tokens T)

# Ceilings measured on an H200 here (.library/device/KINDS.md): a device-to-device copy counting
# bytes read and written, and an 8192^3 bf16 matrix product on random data.
BANDWIDTH = 4.3e12
MATRIX = 790e12
PCIE = 25e9  # host-to-device copies of the batch's ids from pinned memory, one copy
# The batch's inputs before issue 48: ten copies from pageable memory, measured at 3.4-4.2 GB/s
# on the H200 (docs/gpu-reports/2026-12-04-run2-reread.md), each with its own call and staging.
PAGEABLE = 3.8e9
COPY_US = 10.0  # per host-to-device copy call: the driver's staging and the call itself
HOST_INPUT_COPIES = 10  # token_seq, ids, embedding index, positions, offsets, chunks x 3, mask
# The host's cost of enqueueing one kernel (cudaLaunchKernel and our argument set-up), for the
# GPU-busy estimate at small batches; a CUDA graph replays a whole batch for about GRAPH_US.
ENQUEUE_US = 4.0
GRAPH_US = 15.0
# The host's work between two batches, when the GPU has nothing queued: the outputs'
# synchronize and conversion, the results handed to their requests, the next batch's set-up
# (its inputs already staged). An assumption too.
BATCH_GAP_US = 100.0

# The fraction of a ceiling each class of kernel is expected to reach (docs/kernels.md says why).
EFFICIENCY = {
    "gemm K=768": 0.80,   # of MATRIX
    "gemm K=3072": 0.90,  # of MATRIX
    "row": 0.80,          # of BANDWIDTH: streaming, 16-byte vectors, a warp per row
    "pooling": 0.70,      # of BANDWIDTH: two-level reductions, exp per (token, head)
    "copy": 1.0,          # of PCIE (pinned) or PAGEABLE
}
LAUNCH_US = 2.0  # per kernel: the gap between dependent launches on one stream and the last wave's tail


def chunks(B, T):
    return B * -(-(T // B) // CHUNK)  # B equal sequences of T / B tokens, 256 tokens a chunk


# ---- the formulas of profiling_ops.cc (namespace cost): (bytes, flops) per batch, `e` bytes an element
def linear(e, M, N, K, bias=False, accumulate=False):
    return e * (M * K + N * K + (2 if accumulate else 1) * M * N + (N if bias else 0)), 2 * M * N * K


def query_pool(e, B, T, D, H):
    return e * (T * H + T * D + B * D), T * (2 * D + 4 * H)


def key_pool(e, B, T, D, H):
    W = H * D
    return e * (T * D + 2 * B * D + W + H), T * (D + 2 * W + 2 * D + 4 * H)


def mix(e, B, T, D):
    return e * (2 * T * D + B * D), T * D


def bias_residual_layernorm(e, T, D):
    return e * (3 * T * D + 3 * D), 10 * T * D


def embed(e, T, D):
    return T * (8 + 3 * D * e) + 2 * D * e, 8 * T * D


def attention_pool(e, B, T, D):
    return e * (2 * T * D + D + 1 + B * D), T * (5 * D + 4)


def begin_batch(B, T):
    return T * (4 + 4 + 4 + 1) + (B + 1) * 4, 0


def download(e, rows, cols):
    return rows * cols * (e + 4), 0


def ops(B, T, m=BASE_LONG_BF16, gelu_pass=True, fused_key_pool=False):
    """The ops of one batch as the forward graph issues them (pooled embeddings only), each as
    (name, layer, class, (bytes, flops) by formula, extra bytes the kernels move beyond the
    formula, kernel launches); layer -1 outside the encoder layers. `fused_key_pool`: the key
    pool in one pass over K (issue 48), so no second read of K and no float scores."""
    D, H, I, e = m.D, m.H, m.I, m.E
    partials = 2 * chunks(B, T) * (D + 2 * H) * 4  # float m, l, v written by the chunks, read by the combine
    key_extra = partials if fused_key_pool else partials + e * T * D + 2 * 4 * T * H
    out = [("begin_batch", -1, "copy", begin_batch(B, T), 0, 0), ("embed", -1, "row", embed(e, T, D), 0, 1)]
    for layer in range(m.layers):
        out += [
            ("qks_gemm", layer, "gemm K=768", linear(e, T, m.qks, D, bias=True), 0, 1),  # BIAS epilogue
            ("query_pool", layer, "pooling", query_pool(e, B, T, D, H), partials, 2),    # partials, combine
            # key_scores (a kernel of its own: K read a second time, the float scores r [T, H]
            # written and read again), then partials and combine
            # (fused_key_pool: one kernel reads K once, scores on tensor cores, then the combine)
            ("key_pool", layer, "pooling", key_pool(e, B, T, D, H), key_extra, 2 if fused_key_pool else 3),
            ("mix", layer, "row", mix(e, B, T, D), 0, 1),
            ("transform_gemm", layer, "gemm K=768", linear(e, T, D, D, accumulate=True), 0, 1),
            ("attn_out_gemm", layer, "gemm K=768", linear(e, T, D, D), 0, 1),
            ("attn_ln", layer, "row", bias_residual_layernorm(e, T, D), 0, 1),
            # exact-erf GELU: the GEMM stores, a fused bias + erf pass reads and writes [T, I] again
            ("ffn_in_gemm", layer, "gemm K=768", linear(e, T, I, D, bias=True), 0, 1),
            ("ffn_in_bias_gelu", layer, "row", (0, 0), 2 * e * T * I if gelu_pass else 0, int(gelu_pass)),
            ("ffn_out_gemm", layer, "gemm K=3072", linear(e, T, D, I), 0, 1),
            ("ffn_ln", layer, "row", bias_residual_layernorm(e, T, D), 0, 1),
        ]
    out += [
        ("pooler_fc1_gemm", -1, "gemm K=768", linear(e, T, D, D, bias=True), 0, 1),
        # pooler scores z_t [T] written and read as float, then partials and combine
        ("attention_pool", -1, "pooling", attention_pool(e, B, T, D), 2 * 4 * T + 2 * chunks(B, T) * (D + 2) * 4, 3),
        ("download_pooled", -1, "row", download(e, B, D), 0, 1),
    ]
    return out


def model(B, T, gelu_pass=True, gemm_efficiency=None, fused_key_pool=False, host="pinned"):
    """Per op summed over the layers: the floor and the expected time. `gelu_pass` False: the
    erf-GELU in the GEMM's epilogue; `gemm_efficiency`: one efficiency for every GEMM instead of
    EFFICIENCY's; `fused_key_pool`: the key pool in one pass; `host`: how the batch's inputs go
    up: "pageable" (ten copies, before issue 48), "pinned" (one copy from a pinned buffer) or
    "staged" (that copy made while the batch before computes: off the critical path)."""
    merged = {}  # name -> [count, class, bytes, flops, extra, launches], summed over the layers
    for name, _, kind, (bytes_, flops), extra, launches in ops(B, T, gelu_pass=gelu_pass,
                                                               fused_key_pool=fused_key_pool):
        row = merged.setdefault(name, [0, kind, 0, 0, 0, 0])
        row[0] += 1
        row[2] += bytes_
        row[3] += flops
        row[4] += extra
        row[5] += launches
    rows = []
    for name, (count, kind, bytes_, flops, extra, launches) in merged.items():
        floor_s = max(bytes_ / BANDWIDTH, flops / MATRIX)
        if kind.startswith("gemm"):
            eff = gemm_efficiency or EFFICIENCY[kind]
            expected_s = max(flops / (eff * MATRIX), bytes_ / BANDWIDTH)
        elif kind == "copy":
            if host == "pageable":
                expected_s = HOST_INPUT_COPIES * COPY_US * 1e-6 + bytes_ / PAGEABLE
            elif host == "pinned":
                expected_s = COPY_US * 1e-6 + bytes_ / (EFFICIENCY[kind] * PCIE)
            else:
                expected_s = 0.0
        else:
            expected_s = (bytes_ + extra) / (EFFICIENCY[kind] * BANDWIDTH)
        expected_s += launches * LAUNCH_US * 1e-6
        rows.append({"op": name, "count": count, "class": kind, "launches": launches,
                     "bytes_per_token": bytes_ / T, "extra_bytes_per_token": extra / T, "flops_per_token": flops / T,
                     "floor_ms": floor_s * 1e3, "expected_ms": expected_s * 1e3})
    return rows


def summary(rows, T):
    floor = sum(r["floor_ms"] for r in rows)
    expected = sum(r["expected_ms"] for r in rows)
    return {"floor_ms": floor, "expected_ms": expected, "floor_tokens_per_s": T / floor * 1e3,
            "expected_tokens_per_s": T / expected * 1e3}


def markdown(results):
    (name_a, _, T), (name_b, _, _) = SHAPES
    rows_a, rows_b = results[name_a]["ops"], results[name_b]["ops"]
    lines = [
        f"| op | per batch | class | bytes / token | extra bytes / token | FLOPs / token | floor, {name_a} (ms) "
        f"| expected, {name_a} (ms) | expected, {name_b} (ms) |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for a, b in zip(rows_a, rows_b):
        eff = EFFICIENCY[a["class"]]
        lines.append(
            f"| `{a['op']}` | {a['count']} | {a['class']} ({eff:.0%}) | {a['bytes_per_token']:,.0f} "
            f"| {a['extra_bytes_per_token']:,.0f} | {a['flops_per_token'] / 1e6:,.3f} M | {a['floor_ms']:.3f} "
            f"| {a['expected_ms']:.3f} | {b['expected_ms']:.3f} |")
    sa, sb = results[name_a]["summary"], results[name_b]["summary"]
    total_bytes = sum(r["bytes_per_token"] for r in rows_a)
    total_extra = sum(r["extra_bytes_per_token"] for r in rows_a)
    total_flops = sum(r["flops_per_token"] for r in rows_a)
    lines.append(f"| **total** | | | {total_bytes:,.0f} | {total_extra:,.0f} | {total_flops / 1e6:,.1f} M "
                 f"| **{sa['floor_ms']:.2f}** | **{sa['expected_ms']:.2f}** | **{sb['expected_ms']:.2f}** |")
    lines.append("")
    lines.append(f"{T:,}-token batches: floor {sa['floor_tokens_per_s'] / 1e6:.2f}M tokens/s; expected "
                 f"**{sa['expected_tokens_per_s'] / 1e6:.2f}M tokens/s** ({name_a}) and "
                 f"**{sb['expected_tokens_per_s'] / 1e6:.2f}M tokens/s** ({name_b}).")
    lines.append("")
    lines.append("| variant | " + " | ".join(f"{name} (tokens/s)" for name, _, _ in SHAPES) + " |")
    lines.append("| --- |" + " ---: |" * len(SHAPES))
    for label, kwargs in VARIANTS:
        cells = []
        for name, B, T in SHAPES:
            cells.append(f"{summary(model(B, T, **kwargs), T)['expected_tokens_per_s'] / 1e6:.2f}M")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# What the expected rate becomes if one assumption or one kernel changes.
VARIANTS = [
    ("as this issue writes the kernels (the table above)", {}),
    ("every GEMM at 90% of 790 TFLOP/s", {"gemm_efficiency": 0.90}),
    ("every GEMM at 70%", {"gemm_efficiency": 0.70}),
    ("the bias + erf-GELU pass folded into the GEMM's epilogue", {"gelu_pass": False}),
    ("both: GEMMs at 90% and no GELU pass", {"gemm_efficiency": 0.90, "gelu_pass": False}),
    # Issue 48's changes, one by one and together (docs/kernels.md, "Issue 48").
    ("issue 48 before: the batch's inputs in ten pageable copies", {"host": "pageable"}),
    ("issue 48: + key pool in one pass over K", {"fused_key_pool": True}),
    ("issue 48: + inputs staged while the batch before computes", {"host": "staged"}),
    ("issue 48: GELU epilogue + one-pass key pool + staged inputs",
     {"gelu_pass": False, "fused_key_pool": True, "host": "staged"}),
    ("issue 48: all three, GEMMs at 90%",
     {"gelu_pass": False, "fused_key_pool": True, "host": "staged", "gemm_efficiency": 0.90}),
]


def busy(T, graphs=False, **kwargs):
    """The GPU's busy share of a batch's wall time at T tokens (one sequence per 512 tokens):
    the kernels' expected time against the host's time to enqueue them (launches x ENQUEUE_US,
    or one graph replay), the batch taking the longer of the two, plus the host's gap between
    batches (BATCH_GAP_US), when the GPU waits."""
    rows = model(max(1, T // 512), T, host="staged", **kwargs)
    gpu_ms = sum(r["expected_ms"] for r in rows)
    launches = sum(r["launches"] for r in rows)
    host_ms = (GRAPH_US if graphs else launches * ENQUEUE_US) * 1e-3
    return {"tokens": T, "gpu_ms": gpu_ms, "host_ms": host_ms, "launches": launches,
            "busy": gpu_ms / (max(gpu_ms, host_ms) + BATCH_GAP_US * 1e-3)}


def busy_markdown():
    lines = ["| batch tokens | launches | kernels (ms) | host enqueue, streams (ms) | GPU busy, streams "
             "| GPU busy, CUDA graphs | the same at 8 us a launch: streams, graphs |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    global ENQUEUE_US
    for T in (2048, 8192, 65536):
        a, g = busy(T), busy(T, graphs=True)
        saved, ENQUEUE_US = ENQUEUE_US, 2 * ENQUEUE_US
        a8, g8 = busy(T), busy(T, graphs=True)
        ENQUEUE_US = saved
        lines.append(f"| {T:,} | {a['launches']} | {a['gpu_ms']:.3f} | {a['host_ms']:.3f} | {a['busy']:.0%} "
                     f"| {g['busy']:.0%} | {a8['busy']:.0%}, {g8['busy']:.0%} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON instead of markdown")
    args = parser.parse_args()
    results = {}
    for name, B, T in SHAPES:
        rows = model(B, T)
        results[name] = {"sequences": B, "tokens": T, "ops": rows, "summary": summary(rows, T)}
    if args.json:
        print(json.dumps({"efficiency": EFFICIENCY, "launch_us": LAUNCH_US, "shapes": results,
                          "busy": [busy(T) for T in (2048, 8192, 65536)]}, indent=1))
    else:
        print(markdown(results))
        print()
        print(busy_markdown())


if __name__ == "__main__":
    main()

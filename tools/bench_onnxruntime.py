#!/usr/bin/env python3
"""ONNX Runtime baseline for `fastformer-bench`: the official Fastformer module exported to
ONNX and run on ONNX Runtime's CPU execution provider, on the same workload.

    bench_onnxruntime.py --model-dir DIR --threads N --batch-tokens N --lengths SPEC
                         --seconds S --seed N [--pool-batches 8] [--warmup-batches 2]
                         [--bench-bin PATH/fastformer-bench] [--buckets 4] [--opset 17]
                         [--parity-sequences 3] [--no-profile] [--save-onnx PATH] [--json]

Needs onnxruntime and torch in one interpreter: run it with .venv-bench/bin/python
(tools/ort_env.py makes it); run with another python that lacks onnxruntime, it calls
ort_env.ensure() and re-executes itself under the venv's python.

Export (in a child process, so torch's memory stays out of the measured process): the
model is loaded from DIR with the reference code (tools/reference.py) in float32, and
Model's official path (word embedding, FastformerEncoder with its additive -10000 mask,
attention pooling, head if present) is exported with torch.onnx.export (opset --opset)
as  (input_ids int64 [batch, sequence], attention_mask int64 [batch, sequence])
 -> (embedding float32 [batch, hidden], logits float32 [batch, labels] if the model has a
head), with batch and sequence dynamic.

Session: CPUExecutionProvider, intra_op_num_threads = --threads, inter_op_num_threads = 1,
sequential execution, ORT_ENABLE_ALL graph optimisations (ONNX Runtime's defaults otherwise).

Parity (before any timing; exit status 3 and no figures when it fails): --parity-sequences
sequences of the pool (the shortest, the longest, and ones between) run as ONE padded ONNX
Runtime batch must match the PyTorch module (float32) run on each sequence alone: for each
output, max |ort - torch| <= 1e-4 x max |torch|. The error against the float64 reference is
reported too (not gated).

Workload: tools/workload.py's pool, or with --bench-bin the pool `fastformer-bench
--print-workload` prints for the same arguments (checked equal to tools/workload.py's; a
difference is an error). Two modes, each timed like tools/bench_pytorch.py (run_timed:
--warmup-batches untimed, then >= --seconds and >= one pass, wall clock per batch):
  padded  each pool batch padded on the right to its longest sequence, with its
          attention mask (PyTorch's calling convention; the same batches as ours).
  sorted  all pool sequences sorted by length and cut into --buckets buckets of equal
          count; each bucket padded to its own longest sequence and split into batches
          of floor(batch_tokens / that length) sequences, so no batch holds more than
          --batch-tokens padded tokens (what a careful user does).
The padded input arrays are built before timing. tokens counts real tokens, padded_tokens
the padded ones. peak_rss_bytes of a mode is the process's high-water mark (VmHWM, reset
through /proc/self/clear_refs when the mode starts; the session's weights included).

Kernels: the optimised graph's nodes, from one profiled run of the first padded pool
batch (onnxruntime's profiler: op type, execution provider, count, share of node time);
and the CPU flags of /proc/cpuinfo. MLAS (ONNX Runtime's GEMM library) picks its kernels from
CPUID at run time and does not report the choice; `mlas_sgemm_kernel_inferred` is the
choice MLAS's dispatch (mlas/lib/platform.cpp) makes for these flags.

--json prints one JSON object: the run's settings, onnxruntime_version, providers,
threads, inter_op_threads, opset, cpu, kernels, parity, and per mode under
modes.padded / modes.sorted the fields of bench_pytorch.py (tokens_per_second,
sequences_per_second, batches, tokens, sequences, seconds, batch_latency_p50_ms,
batch_latency_p99_ms, peak_rss_bytes, padded_tokens, backend, threads, dtype, lengths,
batch_tokens, seed, pool_batches, warmup_batches). The object opens with the bench runner's
header (tools/fastformer_testing/bench.py, standard library only): tool, date, command, commit,
machine.

tools/bench_openvino.py imports the export (export(); --_export-threads is its torch thread
count), prepare_workload(), parity_sequences(), pad_batch(), check_parity() and time_modes()
from here, so the two peers run the same model file on the same batches.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
from machine_info import cpu_info  # noqa: E402
from workload import add_bench_arguments, make_pool, parse_lengths, run_timed, summarize  # noqa: E402
from fastformer_testing.bench import header  # noqa: E402

TOLERANCE = 1e-4
MODES = ("padded", "sorted")


class ParityError(Exception):
    pass


# ----------------------------------------------------------------------------- model directory


def model_facts(model_dir) -> dict:
    """vocab_size, pad_token_id, max_position_embeddings from config.json and the
    safetensors header (no torch needed)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    we = header.get("word_embedding.weight")
    if we is None:
        raise ValueError(f"{model_dir}: the model has no word embedding; the benchmark sends token ids")
    return {"vocab_size": we["shape"][0], "pad_token_id": cfg.get("pad_token_id", 0),
            "max_position_embeddings": cfg["max_position_embeddings"]}


# ----------------------------------------------------------------------------- batches


def pad_batch(seqs, pad_token_id, length=None):
    """(input_ids, attention_mask) int64 [B, length or longest], padded on the right."""
    L = length or max(len(s) for s in seqs)
    ids = np.full((len(seqs), L), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(seqs), L), dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
        mask[i, :len(s)] = 1
    return ids, mask


def sorted_batches(pool, buckets, batch_tokens):
    """All pool sequences sorted by length, `buckets` buckets of equal count, each cut into
    batches of floor(batch_tokens / bucket's longest) sequences. Returns
    (batches as lists of sequences, the padded length of each batch, bucket summaries)."""
    seqs = sorted((s for b in pool for s in b), key=len)
    n, k = len(seqs), max(1, min(buckets, len(seqs)))
    batches, lengths, info, start = [], [], [], 0
    for j in range(k):
        size = n // k + (1 if j < n % k else 0)
        bucket = seqs[start:start + size]
        start += size
        longest = len(bucket[-1])
        per = max(1, batch_tokens // longest)
        parts = [bucket[i:i + per] for i in range(0, len(bucket), per)]
        batches += parts
        lengths += [longest] * len(parts)
        info.append({"sequences": len(bucket), "min_length": len(bucket[0]), "max_length": longest,
                     "batches": len(parts), "sequences_per_batch": per})
    return batches, lengths, info


def parity_sequences(pool, count):
    """`count` pool sequences: the shortest, the longest, and evenly spaced ones between."""
    seqs = sorted((s for b in pool for s in b), key=len)
    if count >= len(seqs):
        return seqs
    idx = sorted({round(i * (len(seqs) - 1) / max(1, count - 1)) for i in range(count)})
    return [seqs[i] for i in idx]


def relative_error(got, want) -> float:
    """max |got - want| / max |want| (both arrays of the same shape)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise ParityError(f"shape {got.shape} != {want.shape}")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) if want.size else 0.0
    if not np.all(np.isfinite(got)):
        return float("inf")
    return err / scale if scale > 0 else err


def check_parity(got: dict, want: dict, tolerance=TOLERANCE, runtime="ONNX Runtime") -> dict:
    """Per output name, relative_error(got, want); raises ParityError above `tolerance`."""
    errs = {k: relative_error(got[k], want[k]) for k in want}
    bad = {k: e for k, e in errs.items() if not e <= tolerance}
    if bad:
        raise ParityError(f"{runtime} does not match the PyTorch module: " + ", ".join(
            f"{k} max|diff|/max|ref| = {e:.3g} > {tolerance:g}" for k, e in bad.items()))
    return errs


# ----------------------------------------------------------------------------- export (child)


def export_child(model_dir, work, opset, threads=None):
    """Runs in a child process: writes work/model.onnx, work/reference.npz, work/export.json.
    torch runs on `threads` threads (default: every CPU of the affinity mask)."""
    import torch
    from reference import load_model_dir

    torch.set_num_threads(threads or max(1, len(os.sched_getaffinity(0))))
    with open(os.path.join(work, "parity.json"), encoding="utf-8") as f:
        seqs = json.load(f)

    class Exported(torch.nn.Module):
        """Model's official path with an explicit attention mask; pooled vector and logits."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            m = self.model
            mask = attention_mask.to(torch.float32)
            pooled = m.fastformer_model(m.word_embedding(input_ids), mask)
            if m.dense_linear is None:
                return (pooled,)
            return pooled, m.dense_linear(pooled)

    model, cfg = load_model_dir(model_dir, dtype=torch.float32)
    names = ["embedding"] + (["logits"] if model.dense_linear is not None else [])
    wrapped = Exported(model).eval()
    # example: batch 2, 17 positions, the second row padded (neither dimension 1)
    ids = torch.tensor([[(7 * i) % (model.vocab_size - 1) + 1 for i in range(17)]] * 2, dtype=torch.long)
    ids[ids == cfg.pad_token_id] = cfg.pad_token_id + 1 if cfg.pad_token_id + 1 < model.vocab_size else 1
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    ids[1, 11:] = cfg.pad_token_id
    dyn = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"}}
    dyn.update({n: {0: "batch"} for n in names})
    t0 = time.perf_counter()
    import warnings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer warnings about the max_position_embeddings check
        torch.onnx.export(wrapped, (ids, mask), os.path.join(work, "model.onnx"),
                          input_names=["input_ids", "attention_mask"], output_names=names,
                          dynamic_axes=dyn, opset_version=opset, do_constant_folding=True)
    export_seconds = time.perf_counter() - t0
    # the PyTorch references: each parity sequence alone (no padding), float32 and float64
    ref = {}
    with torch.no_grad():
        for dtype, tag in ((torch.float32, "float32"), (torch.float64, "float64")):
            m = wrapped.to(dtype)
            outs = [m(torch.tensor([s], dtype=torch.long), torch.ones((1, len(s)), dtype=torch.long))
                    for s in seqs]
            for j, n in enumerate(names):
                ref[f"{tag}/{n}"] = np.concatenate([o[j].double().numpy() for o in outs])
    np.savez(os.path.join(work, "reference.npz"), **ref)
    with open(os.path.join(work, "export.json"), "w", encoding="utf-8") as f:
        json.dump({"outputs": names, "export_seconds": export_seconds, "torch_version": torch.__version__,
                   "opset": opset}, f)


def export(model_dir, work, opset, seqs, threads=None):
    """The official module as work/model.onnx, and the PyTorch references of `seqs`, made by
    a child process (this file with --_export-to); torch on `threads` threads if given."""
    with open(os.path.join(work, "parity.json"), "w", encoding="utf-8") as f:
        json.dump(seqs, f)
    extra = ["--_export-threads", str(threads)] if threads else []
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--model-dir", model_dir,
                        "--opset", str(opset), "--_export-to", work, *extra], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"ONNX export failed (exit {p.returncode}):\n{p.stderr[-4000:]}")
    with open(os.path.join(work, "export.json"), encoding="utf-8") as f:
        info = json.load(f)
    ref = dict(np.load(os.path.join(work, "reference.npz")))
    return info, ref


# ----------------------------------------------------------------------------- ONNX Runtime


def session_options(ort, threads, profile_dir=None):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if profile_dir:
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(profile_dir, "ort_profile")
    return so


def run_outputs(sess, names, ids, mask):
    return dict(zip(names, sess.run(names, {"input_ids": ids, "attention_mask": mask})))


def profile_kernels(ort, onnx_path, threads, names, warm, batch, work):
    """A run of `warm` (ids, mask), then one of `batch`, profiled: per (op type, provider) of
    the second run, the node count and share of node time."""
    sess = ort.InferenceSession(onnx_path, session_options(ort, threads, work),
                                providers=["CPUExecutionProvider"])
    run_outputs(sess, names, *warm)
    ids, mask = batch
    run_outputs(sess, names, ids, mask)
    path = sess.end_profiling()
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    os.unlink(path)
    # the last run's node events (names end in _kernel_time)
    runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    last = runs[-1] if runs else None
    ops = {}
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        if last and not (last["ts"] <= e["ts"] <= last["ts"] + last["dur"]):
            continue
        a = e.get("args", {})
        key = (a.get("op_name", "?"), a.get("provider", "?"))
        c = ops.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += e.get("dur", 0)
    total = sum(v[1] for v in ops.values()) or 1
    rows = [{"op": k[0], "provider": k[1], "nodes": v[0], "time_share": round(v[1] / total, 4)}
            for k, v in sorted(ops.items(), key=lambda kv: -kv[1][1])]
    return {"profiled_batch_shape": list(ids.shape), "ops": rows}


def mlas_sgemm_kernel(flags) -> str:
    """The float GEMM kernel MLAS's x86-64 dispatch picks for these CPUID flags."""
    if flags.get("avx512f"):
        return "MlasGemmFloatKernelAvx512F (avx512f)"
    if flags.get("avx2") and flags.get("fma"):
        return "MlasGemmFloatKernelFma3 (avx2+fma)"
    return "MlasGemmFloatKernelSse/Avx"


def reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def bench_pool(bench_bin, model_dir, lengths, batch_tokens, seed, pool_batches):
    p = subprocess.run([bench_bin, "--model-dir", model_dir, "--lengths", lengths, "--batch-tokens",
                        str(batch_tokens), "--seed", str(seed), "--pool-batches", str(pool_batches),
                        "--print-workload"], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{bench_bin} --print-workload failed: {p.stderr.strip()}")
    pool = json.loads(p.stdout)
    return pool.get("batches", pool) if isinstance(pool, dict) else pool


def prepare_workload(model_dir, lengths, batch_tokens, seed, pool_batches, bench_bin=None):
    """(model facts, the pool, where the pool came from): tools/workload.py's pool, checked
    equal to `bench_bin --print-workload`'s when bench_bin is given."""
    parse_lengths(lengths)
    facts = model_facts(model_dir)
    pool = make_pool(seed, lengths, facts["vocab_size"], facts["pad_token_id"], batch_tokens, pool_batches)
    source = "tools/workload.py"
    if bench_bin:
        theirs = bench_pool(bench_bin, model_dir, lengths, batch_tokens, seed, pool_batches)
        if theirs != pool:
            raise RuntimeError(f"{bench_bin} --print-workload differs from tools/workload.py's pool")
        pool, source = theirs, "fastformer-bench --print-workload (equal to tools/workload.py)"
    if max(len(s) for b in pool for s in b) > facts["max_position_embeddings"]:
        raise ValueError(f"sequences longer than max_position_embeddings {facts['max_position_embeddings']}")
    return facts, pool, source


def time_modes(run, pool, pad, buckets, batch_tokens, seconds, warmup_batches, settings, log):
    """Both modes (MODES) timed with run(ids, mask): per mode bench_pytorch.py's fields,
    mode, mode_batches, peak_rss_bytes (and buckets for sorted)."""
    sbatches, slens, bucket_info = sorted_batches(pool, buckets, batch_tokens)
    plans = {"padded": (pool, [None] * len(pool)), "sorted": (sbatches, slens)}
    modes = {}
    for mode in MODES:
        batches, padlens = plans[mode]
        arrays = [pad_batch(b, pad, L) for b, L in zip(batches, padlens)]
        resettable = reset_peak_rss()
        log(f"timing {mode} ({len(batches)} batches) ...")

        def run_batch(i):
            run(*arrays[i])

        indices, lat, wall = run_timed(run_batch, len(batches), seconds, warmup_batches)
        r = summarize(batches, indices, lat, wall, padded_tokens=sum(arrays[i][0].size for i in indices),
                      mode=mode, mode_batches=len(batches), **settings)
        r["peak_rss_bytes"] = peak_rss_bytes()
        r["peak_rss_source"] = "VmHWM since the mode started" if resettable else "ru_maxrss of the process"
        if mode == "sorted":
            r["buckets"] = bucket_info
        modes[mode] = r
    return modes


def run_benchmark(model_dir, threads=1, batch_tokens=8192, lengths="uniform:16:256", seconds=10.0,
                  seed=1, pool_batches=8, warmup_batches=2, bench_bin=None, buckets=4, opset=17,
                  parity_count=3, profile=True, save_onnx=None, log=None) -> dict:
    import onnxruntime as ort

    log = log or (lambda *a: None)
    facts, pool, source = prepare_workload(model_dir, lengths, batch_tokens, seed, pool_batches, bench_bin)
    pad = facts["pad_token_id"]
    checked = parity_sequences(pool, parity_count)

    work = tempfile.mkdtemp(prefix="bench_ort_")
    try:
        log("exporting to ONNX ...")
        info, ref = export(model_dir, work, opset, checked)
        onnx_path = os.path.join(work, "model.onnx")
        if save_onnx:
            shutil.copyfile(onnx_path, save_onnx)
        names = info["outputs"]
        pids, pmask = pad_batch(checked, pad)
        kernels = None
        if profile:
            log("profiling one run ...")
            kernels = profile_kernels(ort, onnx_path, threads, names, (pids, pmask),
                                      pad_batch(pool[0], pad), work)
        t0 = time.perf_counter()
        sess = ort.InferenceSession(onnx_path, session_options(ort, threads),
                                    providers=["CPUExecutionProvider"])
        session_seconds = time.perf_counter() - t0
        onnx_bytes = os.path.getsize(onnx_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # parity: one padded ORT batch against each sequence alone in PyTorch
    got = run_outputs(sess, names, pids, pmask)
    errs32 = check_parity(got, {n: ref[f"float32/{n}"] for n in names})
    errs64 = {n: relative_error(got[n], ref[f"float64/{n}"]) for n in names}
    torch64 = {n: relative_error(ref[f"float32/{n}"], ref[f"float64/{n}"]) for n in names}
    parity = {"sequences": len(checked), "lengths": [len(s) for s in checked], "tolerance": TOLERANCE,
              "measure": "max|ort - torch| / max|torch| per output; ORT: one padded batch, "
                         "PyTorch: each sequence alone",
              "rel_err_vs_torch_float32": errs32, "rel_err_vs_torch_float64": errs64,
              "torch_float32_rel_err_vs_float64": torch64, "passed": True}

    settings = dict(backend="onnxruntime", threads=threads, dtype="float32", lengths=lengths,
                    batch_tokens=batch_tokens, seed=seed, pool_batches=pool_batches,
                    warmup_batches=warmup_batches)
    modes = time_modes(lambda ids, mask: sess.run(names, {"input_ids": ids, "attention_mask": mask}),
                       pool, pad, buckets, batch_tokens, seconds, warmup_batches, settings, log)

    cpu = cpu_info()
    return dict(settings, seconds_requested=seconds, workload=source,
                onnxruntime_version=ort.__version__, providers=sess.get_providers(),
                available_providers=ort.get_available_providers(), inter_op_threads=1,
                execution_mode="ORT_SEQUENTIAL", graph_optimization_level="ORT_ENABLE_ALL",
                opset=opset, torch_version=info["torch_version"], export_seconds=info["export_seconds"],
                session_seconds=session_seconds, onnx_bytes=onnx_bytes, outputs=names, cpu=cpu,
                mlas_sgemm_kernel_inferred=mlas_sgemm_kernel(cpu["flags"]), kernels=kernels,
                parity=parity, modes=modes)


def ensure_onnxruntime():
    """Re-execute under .venv-bench's python (installing it if needed) when onnxruntime is missing."""
    try:
        import onnxruntime  # noqa: F401
        return
    except ImportError:
        pass
    import ort_env
    py = ort_env.ensure()
    if os.path.abspath(py) == os.path.abspath(sys.executable):
        raise RuntimeError(f"{py} cannot import onnxruntime")
    os.execv(str(py), [str(py), os.path.abspath(__file__), *sys.argv[1:]])


def print_modes(r: dict) -> None:
    """One line per timed mode of a result (the text output of this tool and bench_openvino.py)."""
    for mode, m in r["modes"].items():
        print(f"  {mode}: {m['tokens_per_second']:.0f} tokens/s, {m['sequences_per_second']:.1f} seq/s, "
              f"{m['batches']} batches in {m['seconds']:.2f} s, p50 {m['batch_latency_p50_ms']:.1f} ms, "
              f"p99 {m['batch_latency_p99_ms']:.1f} ms, padding {m['padded_tokens'] / m['tokens']:.2f}x, "
              f"peak RSS {m['peak_rss_bytes'] / 2**20:.0f} MiB")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    ap.add_argument("--bench-bin", help="take the pool from this fastformer-bench --print-workload")
    ap.add_argument("--buckets", type=int, default=4, help="length buckets of the sorted mode")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--parity-sequences", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled run (kernels: null)")
    ap.add_argument("--save-onnx", help="also write the exported model here")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--_export-to", dest="export_to", help=argparse.SUPPRESS)
    ap.add_argument("--_export-threads", dest="export_threads", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.export_to:
        export_child(a.model_dir, a.export_to, a.opset, a.export_threads)
        return 0
    if a.threads < 1 or a.buckets < 1 or a.parity_sequences < 1:
        print("bench_onnxruntime: error: --threads, --buckets and --parity-sequences must be >= 1",
              file=sys.stderr)
        return 2
    if argv is None:
        ensure_onnxruntime()
    try:
        r = run_benchmark(a.model_dir, a.threads, a.batch_tokens, a.lengths, a.seconds, a.seed,
                          a.pool_batches, a.warmup_batches, a.bench_bin, a.buckets, a.opset,
                          a.parity_sequences, not a.no_profile, a.save_onnx,
                          log=lambda m: print(f"bench_onnxruntime: {m}", file=sys.stderr, flush=True))
    except (ValueError, OSError) as e:
        print(f"bench_onnxruntime: error: {e}", file=sys.stderr)
        return 2
    except ParityError as e:
        print(f"bench_onnxruntime: PARITY FAILED: {e}", file=sys.stderr)
        return 3
    if a.json:  # the runner's header (tool, date, command, commit, machine), then the result
        print(json.dumps({**header("bench_onnxruntime"), **r}))
    else:
        p = r["parity"]
        print(f"onnxruntime {r['onnxruntime_version']} {'/'.join(r['providers'])} threads={a.threads} "
              f"opset={a.opset} lengths={a.lengths} batch_tokens={a.batch_tokens}; parity vs PyTorch "
              f"float32: " + ", ".join(f"{k} {v:.1e}" for k, v in p["rel_err_vs_torch_float32"].items()))
        print_modes(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

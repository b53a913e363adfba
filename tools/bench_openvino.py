#!/usr/bin/env python3
"""OpenVINO peer of tools/bench_onnxruntime.py: the same ONNX export of the official Fastformer
module, run on OpenVINO's CPU plugin, on the same workload and in the same two modes.

    bench_openvino.py --model-dir DIR --threads N --batch-tokens N --lengths SPEC
                      --seconds S --seed N [--precision f32|bf16] [--pool-batches 8]
                      [--warmup-batches 2] [--bench-bin PATH/fastformer-bench] [--buckets 4]
                      [--opset 17] [--parity-sequences 3] [--save-onnx PATH] [--json]

Needs openvino and torch in one interpreter: .venv-bench/bin/python (tools/ort_env.py puts
`openvino` from PyPI there beside onnxruntime); run with another python that lacks openvino,
it calls ort_env.ensure(need=("openvino",)) and re-executes itself under the venv's python.

Shared with bench_onnxruntime.py (imported, not copied): the export (its child process,
torch on --threads threads), the workload (tools/workload.py's pool, or --bench-bin's,
checked equal), the parity sequences and padded batch, the padded and sorted (length-sorted
buckets) modes and their timing and fields, and the parity measure.

Compilation: openvino.Core().read_model(model.onnx) (OpenVINO's ONNX frontend), then
compile_model(..., "CPU", {INFERENCE_NUM_THREADS: --threads, NUM_STREAMS: 1,
PERFORMANCE_HINT: LATENCY, INFERENCE_PRECISION_HINT: f32 or bf16}); one infer request,
used synchronously, as ORT's one sequential session. The precision OpenVINO actually uses
is read back (compiled_model.get_property("INFERENCE_PRECISION_HINT")); a mismatch is an
error. bf16 needs "BF16" in the CPU plugin's OPTIMIZATION_CAPABILITIES (AVX512_BF16 or
AMX-BF16): without it --precision bf16 is refused (exit 2) rather than silently run in f32.

Parity (before any timing; exit 3 and no figures when it fails), on one padded OpenVINO
batch of --parity-sequences pool sequences against the PyTorch module on each sequence alone:
  f32   per output max |ov - torch| <= 1e-4 x max |torch|  (bench_onnxruntime.TOLERANCE).
  bf16  per sequence, cosine(pooled embedding, PyTorch float32 embedding) >= 0.99. bf16
        keeps 8 significant bits (relative rounding 2^-9 ~ 2e-3 per operation), so an
        element-wise 1e-4 bound cannot hold through a dozen layers; the pooled vector is
        what is served, and its direction is what retrieval and a linear head use. 0.99 is
        far below what a correct bf16 run gives (typically > 0.999) and far above what a
        broken one does (unrelated vectors are near 0). The element-wise errors are
        reported, not gated.

--json prints one JSON object: the settings, openvino_version, device "CPU",
full_device_name, optimization_capabilities, bf16_supported, precision_requested,
inference_precision (read back), the compiled model's properties, exec_graph (the
compiled graph's layers counted per layer type and runtime precision: shows where bf16
runs; gemm_primitives: the FullyConnected/MatMul kernels, e.g. brgemm_avx512_amx_bf16),
cpu, parity and modes.padded / modes.sorted with bench_onnxruntime.py's fields
(backend "openvino", dtype "float32" or "bfloat16"); it opens with the bench runner's header
(tools/fastformer_testing/bench.py, standard library only): tool, date, command, commit, machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

TOOLS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TOOLS)
import bench_onnxruntime as bo  # noqa: E402  (importable without onnxruntime)
from machine_info import cpu_info  # noqa: E402
from workload import add_bench_arguments  # noqa: E402
from fastformer_testing.bench import header  # noqa: E402

PRECISIONS = {"f32": "float32", "bf16": "bfloat16"}
BF16_MIN_COSINE = 0.99
DEVICE = "CPU"


class PrecisionUnsupported(ValueError):
    pass


def cosines(got, want):
    """Row-wise cosine similarity of two [rows, hidden] arrays."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        raise bo.ParityError(f"shape {got.shape} != {want.shape}")
    if not np.all(np.isfinite(got)):
        return [float("-inf")] * len(got)
    num = np.sum(got * want, axis=1)
    den = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return [float(c) for c in np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)]


def check_cosine(got, want, minimum=BF16_MIN_COSINE):
    cos = cosines(got, want)
    if not min(cos) >= minimum:
        raise bo.ParityError(f"OpenVINO bf16 does not match the PyTorch module: pooled-embedding cosine "
                             f"{min(cos):.4f} < {minimum:g} (per sequence: {', '.join(f'{c:.4f}' for c in cos)})")
    return cos


def check_precision(precision, caps) -> bool:
    """Whether the CPU plugin's OPTIMIZATION_CAPABILITIES `caps` offer BF16; raises
    PrecisionUnsupported for --precision bf16 without it (never a silent f32 run)."""
    if precision not in PRECISIONS:
        raise ValueError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    bf16 = isinstance(caps, list) and "BF16" in caps
    if precision == "bf16" and not bf16:
        raise PrecisionUnsupported(
            f"--precision bf16: OpenVINO's CPU plugin does not offer BF16 on this CPU "
            f"(OPTIMIZATION_CAPABILITIES {caps}; it needs avx512_bf16 or amx_bf16); use --precision f32")
    return bf16


def _prop(obj, name):
    try:
        v = obj.get_property(name) if not isinstance(obj, tuple) else obj[0].get_property(obj[1], name)
    except Exception as e:  # a property this OpenVINO release lacks
        return f"unavailable: {e.__class__.__name__}"
    if isinstance(v, (list, tuple)):
        return [str(x) for x in v]
    return v if isinstance(v, (int, float, bool)) else str(v)


def precision_name(value) -> str:
    """'f32' / 'bf16' from an ov.Type or its string ('f32', '<Type: 'bfloat16'>', ...)."""
    s = str(value).lower()
    if "bf16" in s or "bfloat16" in s:
        return "bf16"
    if "f32" in s or "float32" in s:
        return "f32"
    return s


def exec_graph(compiled):
    """The compiled graph's layers counted per (layer type, runtime precision)."""
    counts, prims = {}, {}
    for op in compiled.get_runtime_model().get_ordered_ops():
        rt = op.get_rt_info()
        get = lambda k: str(rt[k].astype(str)) if k in rt else "?"  # noqa: E731
        key = (get("layerType"), get("runtimePrecision"))
        counts[key] = counts.get(key, 0) + 1
        if key[0] in ("FullyConnected", "MatMul"):  # the GEMM kernels: brgemm_avx512_amx etc.
            k = f"{key[0]}: {get('primitiveType')}"
            prims[k] = prims.get(k, 0) + 1
    rows = [{"layer_type": k[0], "runtime_precision": k[1], "layers": n}
            for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"layers": sum(counts.values()), "by_type_and_precision": rows,
            "bf16_layers": sum(n for k, n in counts.items() if "bf16" in k[1].lower()),
            "gemm_primitives": dict(sorted(prims.items()))}


def run_benchmark(model_dir, threads=1, batch_tokens=8192, lengths="uniform:16:256", seconds=10.0,
                  seed=1, pool_batches=8, warmup_batches=2, bench_bin=None, buckets=4, opset=17,
                  parity_count=3, precision="f32", save_onnx=None, log=None) -> dict:
    import openvino as ov

    log = log or (lambda *a: None)
    core = ov.Core()
    caps = _prop((core, DEVICE), "OPTIMIZATION_CAPABILITIES")
    bf16_supported = check_precision(precision, caps)
    facts, pool, source = bo.prepare_workload(model_dir, lengths, batch_tokens, seed, pool_batches, bench_bin)
    pad = facts["pad_token_id"]
    checked = bo.parity_sequences(pool, parity_count)

    work = tempfile.mkdtemp(prefix="bench_ov_")
    try:
        log("exporting to ONNX ...")
        info, ref = bo.export(model_dir, work, opset, checked, threads=threads)
        onnx_path = os.path.join(work, "model.onnx")
        if save_onnx:
            shutil.copyfile(onnx_path, save_onnx)
        onnx_bytes = os.path.getsize(onnx_path)
        config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_PRECISION_HINT": precision}
        t0 = time.perf_counter()
        compiled = core.compile_model(core.read_model(onnx_path), DEVICE, config)
        compile_seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(work, ignore_errors=True)
    used = precision_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
    if used != precision:
        raise PrecisionUnsupported(f"--precision {precision}: the compiled model reports "
                                   f"INFERENCE_PRECISION_HINT {used}")
    names = info["outputs"]
    by_name = {o.get_any_name(): o for o in compiled.outputs}
    if set(names) - set(by_name):
        raise RuntimeError(f"compiled model outputs {sorted(by_name)} lack {names}")
    req = compiled.create_infer_request()

    def infer(ids, mask):
        res = req.infer({"input_ids": ids, "attention_mask": mask})
        return {n: np.array(res[by_name[n]]) for n in names}

    # parity: one padded OpenVINO batch against each sequence alone in PyTorch
    got = infer(*bo.pad_batch(checked, pad))
    want32 = {n: ref[f"float32/{n}"] for n in names}
    errs64 = {n: bo.relative_error(got[n], ref[f"float64/{n}"]) for n in names}
    torch64 = {n: bo.relative_error(ref[f"float32/{n}"], ref[f"float64/{n}"]) for n in names}
    parity = {"sequences": len(checked), "lengths": [len(s) for s in checked], "precision": precision,
              "rel_err_vs_torch_float64": errs64, "torch_float32_rel_err_vs_float64": torch64}
    if precision == "f32":
        parity.update(tolerance=bo.TOLERANCE, rel_err_vs_torch_float32=bo.check_parity(
            got, want32, runtime="OpenVINO f32"),
            measure="max|ov - torch| / max|torch| per output; OpenVINO: one padded batch, "
                    "PyTorch: each sequence alone")
    else:
        parity.update(min_cosine=BF16_MIN_COSINE,
                      embedding_cosine_vs_torch_float32=check_cosine(got["embedding"], want32["embedding"]),
                      rel_err_vs_torch_float32={n: bo.relative_error(got[n], want32[n]) for n in names},
                      measure="per sequence cosine(ov pooled embedding, torch float32) >= min_cosine; "
                              "element-wise errors reported, not gated")
    parity["passed"] = True

    settings = dict(backend="openvino", threads=threads, dtype=PRECISIONS[precision], lengths=lengths,
                    batch_tokens=batch_tokens, seed=seed, pool_batches=pool_batches,
                    warmup_batches=warmup_batches)
    modes = bo.time_modes(lambda ids, mask: req.infer({"input_ids": ids, "attention_mask": mask}),
                          pool, pad, buckets, batch_tokens, seconds, warmup_batches, settings, log)
    props = {k: _prop(compiled, k) for k in ("INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT",
                                             "INFERENCE_PRECISION_HINT", "EXECUTION_MODE_HINT",
                                             "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING",
                                             "SCHEDULING_CORE_TYPE", "OPTIMAL_NUMBER_OF_INFER_REQUESTS")}
    return dict(settings, seconds_requested=seconds, workload=source, openvino_version=ov.get_version(),
                device=DEVICE, full_device_name=_prop((core, DEVICE), "FULL_DEVICE_NAME"),
                optimization_capabilities=caps, bf16_supported=bf16_supported,
                precision_requested=precision, inference_precision=used, compile_config=config,
                compiled_properties=props, opset=opset, torch_version=info["torch_version"],
                export_seconds=info["export_seconds"], compile_seconds=compile_seconds,
                onnx_bytes=onnx_bytes, outputs=names, cpu=cpu_info(), exec_graph=exec_graph(compiled),
                parity=parity, modes=modes)


def ensure_openvino():
    """Re-execute under .venv-bench's python (installing openvino if needed) when it is missing."""
    try:
        import openvino  # noqa: F401
        return
    except ImportError:
        pass
    import ort_env
    try:
        py = ort_env.ensure(need=("openvino",))
    except ort_env.OrtUnavailable as e:
        raise RuntimeError(f"{ort_env.missing_openvino_message()}\n(the install failed: {e})") from None
    if os.path.abspath(py) == os.path.abspath(sys.executable):
        raise RuntimeError(ort_env.missing_openvino_message(py))
    os.execv(str(py), [str(py), os.path.abspath(__file__), *sys.argv[1:]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_arguments(ap)
    ap.add_argument("--precision", default="f32",
                    help="OpenVINO's INFERENCE_PRECISION_HINT: f32 or bf16 (bf16 where the CPU has it)")
    ap.add_argument("--bench-bin", help="take the pool from this fastformer-bench --print-workload")
    ap.add_argument("--buckets", type=int, default=4, help="length buckets of the sorted mode")
    ap.add_argument("--opset", type=int, default=17)
    ap.add_argument("--parity-sequences", type=int, default=3)
    ap.add_argument("--save-onnx", help="also write the exported model here")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args(argv)
    err = lambda m: print(f"bench_openvino: error: {m}", file=sys.stderr)  # noqa: E731
    if a.threads < 1 or a.buckets < 1 or a.parity_sequences < 1:
        err("--threads, --buckets and --parity-sequences must be >= 1")
        return 2
    if a.precision not in PRECISIONS:
        err(f"--precision must be one of {', '.join(PRECISIONS)}, not {a.precision!r}")
        return 2
    try:
        if argv is None:
            ensure_openvino()
        import openvino  # noqa: F401
    except (ImportError, RuntimeError) as e:
        err(e if isinstance(e, RuntimeError) else __import__("ort_env").missing_openvino_message())
        return 2
    try:
        r = run_benchmark(a.model_dir, a.threads, a.batch_tokens, a.lengths, a.seconds, a.seed,
                          a.pool_batches, a.warmup_batches, a.bench_bin, a.buckets, a.opset,
                          a.parity_sequences, a.precision, a.save_onnx,
                          log=lambda m: print(f"bench_openvino: {m}", file=sys.stderr, flush=True))
    except (ValueError, OSError) as e:
        err(e)
        return 2
    except bo.ParityError as e:
        print(f"bench_openvino: PARITY FAILED: {e}", file=sys.stderr)
        return 3
    if a.json:  # the runner's header (tool, date, command, commit, machine), then the result
        print(json.dumps({**header("bench_openvino"), **r}))
    else:
        p = r["parity"]
        gate = (f"embedding cosine >= {min(p['embedding_cosine_vs_torch_float32']):.4f}" if a.precision == "bf16"
                else ", ".join(f"{k} {v:.1e}" for k, v in p["rel_err_vs_torch_float32"].items()))
        print(f"openvino {r['openvino_version']} {r['full_device_name']} precision={r['inference_precision']} "
              f"threads={a.threads} lengths={a.lengths} batch_tokens={a.batch_tokens}; parity vs PyTorch "
              f"float32: {gate}")
        bo.print_modes(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())

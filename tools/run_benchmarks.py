#!/usr/bin/env python3
"""Run the engine benchmarks recorded in docs/benchmarks.md and print them as Markdown.

    run_benchmarks.py [--build-dir build] [--models-dir models] [--threads 2]
                      [--seconds 20] [--long] [--no-ort] [--no-openvino]

The header names the CPU (/proc/cpuinfo: model name, family, model, and the flags that
pick GEMM kernels: avx2, avx512f, avx512_bf16, amx, ...).

CPU engine (fastformer-bench) against the PyTorch reference (bench_pytorch.py) on the
`official` preset, same sequences, same thread count.

Then against ONNX Runtime (bench_onnxruntime.py: the official module exported to ONNX, the
CPU execution provider with the same intra-op threads, inter-op 1; its workload is taken
from fastformer-bench --print-workload): `official` on uniform:16:256 (the engine and
PyTorch figures of the first table) and `base-long` (hidden 768, 12 layers) on fixed:512,
each ONNX Runtime mode (padded: our batches padded to their longest; sorted: all sequences
in 4 length buckets) with ours / ORT. base-long's batches are all 16 x 512, so it runs a
pool of 4 batches (enough for 4 full sorted batches) and 1 warm-up batch. ONNX Runtime is
installed from PyPI into .venv-bench by tools/ort_env.py on first use; if that fails the
section says why and the exit status is 1 (the other tables are still printed). --no-ort
skips the section.

Then against OpenVINO (bench_openvino.py: the same export and workload, the CPU plugin with the
same threads, INFERENCE_PRECISION_HINT f32 and bf16, bf16 where the CPU has it): the same two
models and workloads, ours in float32 and bfloat16 beside it. --no-openvino skips it.

With --long also one 65,536-token sequence of `base-long` and its peak memory against the
bound weights + (8 x hidden + intermediate) x 4 bytes x tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
sys.path.insert(0, str(REPO / "tools"))
import machine_info  # noqa: E402
import ort_env  # noqa: E402


def run_json(cmd, show_stderr=False, env=None, optional=False):
    """The last stdout line of `cmd` as JSON; with `optional`, None when it fails."""
    print("+ " + " ".join(f"{k}={v}" for k, v in (env or {}).items()) + (" " if env else "")
          + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    p = subprocess.run([str(c) for c in cmd], stdout=subprocess.PIPE, text=True,
                       stderr=None if show_stderr else subprocess.PIPE, env={**os.environ, **(env or {})})
    if p.returncode != 0 and optional:
        why = (p.stderr or "").strip().splitlines()
        print(f"({Path(str(cmd[0])).name} refused: {why[-1] if why else p.returncode})", file=sys.stderr)
        return None
    if p.returncode != 0:
        if p.stderr:
            print(p.stderr, file=sys.stderr)
        raise SystemExit(f"run_benchmarks: {Path(str(cmd[0])).name} exited with {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def ensure_model(models_dir: Path, preset: str) -> Path:
    out = models_dir / preset
    if not (out / "model.safetensors").exists():
        subprocess.run([PYTHON, REPO / "tools/make_demo_model.py", "--preset", preset, "--seed", "1",
                        "--out", out], check=True)
    return out


def machine() -> str:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{machine_info.describe()}; load average at start {load}"


def ms(r) -> str:
    return f"{r['batch_latency_p50_ms']:,.0f} / {r['batch_latency_p99_ms']:,.0f}"


def mib(r) -> str:
    return f"{r['peak_rss_bytes'] / 2**20:,.0f}"


def ort_section(args, bench, official, ours_official, torch_official) -> bool:
    """ONNX Runtime against the engine; False when ONNX Runtime could not be installed."""
    print("\n### ONNX Runtime\n", flush=True)
    try:
        ort_python = ort_env.ensure(python=PYTHON)
    except ort_env.OrtUnavailable as e:
        print(f"ONNX Runtime: not run, it could not be installed: {e}")
        return False
    base = ensure_model(Path(args.models_dir), "base-long")
    runs = [("official", official, "uniform:16:256", [], ours_official, torch_official)]
    base_extra = ["--pool-batches", 4, "--warmup-batches", 1]
    runs.append(("base-long", base, "fixed:512", base_extra, None, None))
    rows, notes = [], []
    for name, model_dir, lengths, extra, ours, torch_ in runs:
        common = ["--model-dir", model_dir, "--threads", args.threads, "--batch-tokens", args.batch_tokens,
                  "--lengths", lengths, "--seconds", args.seconds, "--seed", 1, *extra, "--json"]
        if ours is None:
            ours = run_json([bench, "--backend", "cpu", *common])
        r = run_json([ort_python, REPO / "tools/bench_onnxruntime.py", "--bench-bin", bench, *common],
                     show_stderr=True)
        pad, srt = r["modes"]["padded"], r["modes"]["sorted"]
        # The engine as served (float32), in bfloat16 where oneDNN finds AVX512_BF16 or AMX,
        # and limited to AVX2 (standing in for an AVX2-only CPU; ONNX Runtime keeps its ISA).
        variants = [("float32", ours),
                    ("bfloat16", run_json([bench, "--backend", "cpu", "--dtype", "bfloat16", *common],
                                          optional=True)),
                    ("float32, `ONEDNN_MAX_CPU_ISA=AVX2`",
                     run_json([bench, "--backend", "cpu", *common], env={"ONEDNN_MAX_CPU_ISA": "AVX2"}))]
        for label, v in variants:
            if v is None:
                notes.append(f"- `{name}` {label}: refused on this CPU (no AVX512_BF16 or AMX)")
                continue
            t = v["tokens_per_second"]
            rows.append(
                f"| `{name}` | `{lengths}` | {label} ({v['device'].split('oneDNN ')[-1].rstrip(')')}) | {t:,.0f} | "
                f"{pad['tokens_per_second']:,.0f} | "
                f"{srt['tokens_per_second']:,.0f} | **{t / pad['tokens_per_second']:.2f}x** | "
                f"**{t / srt['tokens_per_second']:.2f}x** | "
                + (f"{torch_['tokens_per_second']:,.0f} | " if torch_ and label == "float32" else "not run | ")
                + f"{pad['padded_tokens'] / pad['tokens']:.2f}x / {srt['padded_tokens'] / srt['tokens']:.2f}x | "
                f"{ms(v)} | {ms(pad)} | {ms(srt)} | {mib(v)} | {mib(pad)} / {mib(srt)} |")
        if ours.get("gemm_self_check"):
            notes.append(f"- `{name}` engine: {ours['gemm_self_check']}")
        p = r["parity"]
        top = ", ".join(f"{o['op']} {o['time_share']:.0%}" for o in (r["kernels"] or {}).get("ops", [])[:4])
        notes.append(f"- `{name}`: parity vs PyTorch float32 (max|diff| / max|ref|, limit {p['tolerance']:g}, "
                     f"{p['sequences']} sequences): "
                     + ", ".join(f"{k} {v:.1e}" for k, v in p["rel_err_vs_torch_float32"].items())
                     + f"; node time: {top or 'not profiled'}")
        print(f"(done: {name} {lengths})", file=sys.stderr, flush=True)
    print(f"onnxruntime {r['onnxruntime_version']}, {'/'.join(r['providers'])}, intra-op threads "
          f"{r['threads']}, inter-op {r['inter_op_threads']}, {r['execution_mode']}, "
          f"{r['graph_optimization_level']}, opset {r['opset']} (torch {r['torch_version']} export), "
          f"float32; MLAS float GEMM kernel for these flags: {r['mlas_sgemm_kernel_inferred']}\n")
    print("| model | workload | engine (oneDNN ISA) | engine tokens/s | ORT padded tokens/s | ORT sorted tokens/s | "
          "engine / ORT padded | engine / ORT sorted | PyTorch tokens/s | ORT padding (padded / sorted) | "
          "engine p50 / p99 ms | ORT padded p50 / p99 ms | ORT sorted p50 / p99 ms | engine peak RSS MiB | "
          "ORT peak RSS MiB (padded / sorted) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print("\n" + "\n".join(notes), flush=True)
    return True


def openvino_section(args, bench, runs) -> bool:
    """OpenVINO (CPU plugin, f32 and bf16) against the engine in both dtypes; `runs` are
    (name, model_dir, lengths, extra args). False when OpenVINO could not be installed."""
    print("\n### OpenVINO\n", flush=True)
    try:
        ov_python = ort_env.ensure(python=PYTHON, need=("openvino",))
    except ort_env.OrtUnavailable as e:
        print(f"OpenVINO: not run, it could not be installed: {e}")
        return False
    rows, notes, info = [], [], None
    for name, model_dir, lengths, extra in runs:
        common = ["--model-dir", model_dir, "--threads", args.threads, "--batch-tokens", args.batch_tokens,
                  "--lengths", lengths, "--seconds", args.seconds, "--seed", 1, *extra, "--json"]
        ours = {d: run_json([bench, "--backend", "cpu", "--dtype", d, *common], optional=d == "bfloat16")
                for d in ("float32", "bfloat16")}
        ov = {p: run_json([ov_python, REPO / "tools/bench_openvino.py", "--bench-bin", bench, "--precision", p,
                           *common], show_stderr=True, optional=p == "bf16") for p in ("f32", "bf16")}
        info = next((r for r in ov.values() if r), info)
        best_ours = max(r["tokens_per_second"] for r in ours.values() if r)
        best_ov = max(m["tokens_per_second"] for r in ov.values() if r for m in r["modes"].values())

        def t(r):
            return f"{r['tokens_per_second']:,.0f}" if r else "refused"

        def modes(r):
            return " / ".join(f"{m['tokens_per_second']:,.0f}" for m in r["modes"].values()) if r else "refused"
        rows.append(f"| `{name}` | `{lengths}` | {t(ours['float32'])} | {t(ours['bfloat16'])} | {modes(ov['f32'])} | "
                    f"{modes(ov['bf16'])} | **{best_ours / best_ov:.2f}x** |")
        for p, r in ov.items():
            if r:
                prims = (r.get("exec_graph") or {}).get("gemm_primitives") or {}
                notes.append(f"- `{name}` OpenVINO {p}: precision used {r['inference_precision']}, GEMM kernels "
                             + (", ".join(f"{k} x{n}" for k, n in prims.items()) or "not reported"))
        print(f"(done: {name} {lengths}, OpenVINO)", file=sys.stderr, flush=True)
    if info:
        print(f"openvino {info['openvino_version']}, CPU plugin, {info['full_device_name']}, capabilities "
              f"{', '.join(info['optimization_capabilities'])}, {args.threads} threads, one stream; padded / "
              "sorted as for ONNX Runtime\n")
    print("| model | workload | ours float32 tokens/s | ours bfloat16 tokens/s | OpenVINO f32 padded / sorted | "
          "OpenVINO bf16 padded / sorted | ours best / OpenVINO best |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print("\n" + "\n".join(notes), flush=True)
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--batch-tokens", type=int, default=8192)
    ap.add_argument("--long", action="store_true", help="also the 65,536-token base-long memory run")
    ap.add_argument("--no-ort", action="store_true", help="skip the ONNX Runtime comparison")
    ap.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO comparison")
    args = ap.parse_args()

    bench = REPO / args.build_dir / "bin" / "fastformer-bench"
    models = Path(args.models_dir)
    official = ensure_model(models, "official")
    print(f"Machine: {machine()}\n")
    print("| workload | engine tokens/s | PyTorch tokens/s | speed-up | engine p50 / p99 ms | PyTorch p50 / p99 ms | engine peak RSS MiB | PyTorch peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    first = {}
    for lengths in ("uniform:16:256", "fixed:256"):
        common = ["--model-dir", official, "--threads", args.threads, "--batch-tokens", args.batch_tokens,
                  "--lengths", lengths, "--seconds", args.seconds, "--seed", 1, "--json"]
        ours = run_json([bench, "--backend", "cpu", *common])
        torch_ = run_json([PYTHON, REPO / "tools/bench_pytorch.py", *common])
        first[lengths] = (ours, torch_)
        print(f"| `{lengths}` | {ours['tokens_per_second']:,.0f} | {torch_['tokens_per_second']:,.0f} | "
              f"{ours['tokens_per_second'] / torch_['tokens_per_second']:.2f}x | "
              f"{ours['batch_latency_p50_ms']:.0f} / {ours['batch_latency_p99_ms']:.0f} | "
              f"{torch_['batch_latency_p50_ms']:.0f} / {torch_['batch_latency_p99_ms']:.0f} | "
              f"{ours['peak_rss_bytes'] / 2**20:.0f} | {torch_['peak_rss_bytes'] / 2**20:.0f} |", flush=True)
    ort_ok = args.no_ort or ort_section(args, bench, official, *first["uniform:16:256"])
    ov_ok = args.no_openvino or openvino_section(args, bench, [
        ("official", official, "uniform:16:256", []),
        ("base-long", ensure_model(models, "base-long"), "fixed:512", ["--pool-batches", 4, "--warmup-batches", 1])])
    if args.long:
        base = ensure_model(models, "base-long")
        cfg = json.load(open(base / "config.json"))
        tokens = 65536
        r = run_json([bench, "--backend", "cpu", "--model-dir", base, "--threads", args.threads,
                      "--batch-tokens", tokens, "--lengths", f"fixed:{tokens}", "--seconds", 0,
                      "--pool-batches", 1, "--warmup-batches", 0, "--seed", 1, "--json"])
        weights = (base / "model.safetensors").stat().st_size
        bound = weights + (8 * cfg["hidden_size"] + cfg["intermediate_size"]) * 4 * tokens
        print(f"\nbase-long, one {tokens:,}-token sequence: {r['tokens_per_second']:,.0f} tokens/s, "
              f"{r['seconds']:.1f} s, peak RSS {r['peak_rss_bytes'] / 2**20:,.0f} MiB; "
              f"bound weights + (8D + I) x 4 B x T = {bound / 2**20:,.0f} MiB "
              f"({'within' if r['peak_rss_bytes'] < bound else 'OVER'} the bound)")
    return 0 if ort_ok and ov_ok else 1


if __name__ == "__main__":
    sys.exit(main())

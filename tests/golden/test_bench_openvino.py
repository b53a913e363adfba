"""tools/bench_openvino.py: OpenVINO's CPU plugin on bench_onnxruntime.py's ONNX export, the
f32 and bf16 parity gates, the two modes, the JSON, and the refusals.

OpenVINO comes from PyPI into <repo>/.venv-bench (tools/ort_env.py, need=("openvino",));
the tests that need it are skipped, with the reason, only when that install fails. bf16 runs
only where /proc/cpuinfo has avx512_bf16 or amx_bf16 (skipped with the reason otherwise).
A tiny model and 0.5 s per mode keep it to about 15 s once the venv exists.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

import bench_onnxruntime as bo
import bench_openvino as bov  # importable without openvino
import machine_info
import make_demo_model as mdm
import ort_env
import workload as wl

def cpu_has_bf16() -> bool:
    return bool({"avx512_bf16", "amx_bf16"} & machine_info.cpu_flags())


PRECISIONS = ["f32", pytest.param("bf16", marks=pytest.mark.skipif(
    not cpu_has_bf16(), reason="the CPU has neither avx512_bf16 nor amx_bf16 (OpenVINO runs bf16 on those)"))]


@pytest.fixture(scope="module")
def ov_python():
    try:
        return ort_env.ensure(log=lambda msg: None, need=("openvino",))
    except ort_env.OrtUnavailable as e:
        pytest.skip(f"openvino cannot be installed: {e}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("ov") / "m"
    mdm.make_demo_model(d, preset="tiny", seed=1, log=lambda *a: None)
    return d


@pytest.mark.parametrize("precision", PRECISIONS)
def test_bench_openvino_smoke(ov_python, golden, tiny, tmp_path, precision):
    bench = golden.bin_dir() / "fastformer-bench"
    onnx = tmp_path / "model.onnx"
    cmd = [str(ov_python), str(golden.TOOLS / "bench_openvino.py"), "--model-dir", str(tiny),
           "--threads", "1", "--batch-tokens", "256", "--lengths", "uniform:4:40", "--seconds", "0.5",
           "--seed", "3", "--pool-batches", "3", "--precision", precision, "--save-onnx", str(onnx), "--json"]
    if bench.is_file():
        cmd += ["--bench-bin", str(bench)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["workload"].startswith("fastformer-bench" if bench.is_file() else "tools/workload.py")
    assert r["openvino_version"] and r["device"] == "CPU" and r["full_device_name"]
    caps = r["optimization_capabilities"]
    assert "FP32" in caps and r["bf16_supported"] == ("BF16" in caps)
    assert r["precision_requested"] == r["inference_precision"] == precision
    assert r["compiled_properties"]["INFERENCE_NUM_THREADS"] == 1
    assert r["compile_config"] == {"INFERENCE_NUM_THREADS": 1, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY",
                                   "INFERENCE_PRECISION_HINT": precision}
    assert (r["threads"], r["opset"], r["outputs"]) == (1, 17, ["embedding", "logits"])
    assert r["dtype"] == {"f32": "float32", "bf16": "bfloat16"}[precision]
    eg = r["exec_graph"]
    assert eg["layers"] > 0 and eg["gemm_primitives"]
    assert (eg["bf16_layers"] > 0) == (precision == "bf16"), eg
    par = r["parity"]
    assert par["passed"] and par["sequences"] == 3 and par["precision"] == precision
    if precision == "f32":
        assert par["tolerance"] == bo.TOLERANCE
        for errs in (par["rel_err_vs_torch_float32"], par["rel_err_vs_torch_float64"]):
            assert set(errs) == {"embedding", "logits"} and all(0 <= e <= 1e-4 for e in errs.values()), errs
    else:
        assert par["min_cosine"] == 0.99 and len(par["embedding_cosine_vs_torch_float32"]) == 3
        assert all(0.99 <= c <= 1 + 1e-9 for c in par["embedding_cosine_vs_torch_float32"])
        assert all(0 < e < 0.1 for e in par["rel_err_vs_torch_float32"].values())  # bf16, not f32
    golden.check_peer_modes(r, "openvino", wl.make_pool(3, "uniform:4:40", 1000, 0, 256, 3), 1,
                            "uniform:4:40", 256, 3)
    check_against_torch(ov_python, golden, tiny, onnx, precision, tmp_path)


RUN_OV = """
import sys, numpy as np, openvino as ov
onnx, prec, out = sys.argv[1:4]
ids, mask = np.load(out + ".in.npy"), None
mask = (ids != -1).astype(np.int64); ids = np.where(ids < 0, 0, ids).astype(np.int64)
core = ov.Core()
c = core.compile_model(core.read_model(onnx), "CPU", {"INFERENCE_PRECISION_HINT": prec, "INFERENCE_NUM_THREADS": 1})
r = c.create_infer_request().infer({"input_ids": ids, "attention_mask": mask})
np.save(out, np.array(r[[o for o in c.outputs if o.get_any_name() == "embedding"][0]]))
"""


def check_against_torch(ov_python, golden, model_dir, onnx, precision, tmp_path):
    """Independently of the tool's gate: the saved ONNX file on OpenVINO, one padded batch of
    two sequences, against this process's PyTorch module on each sequence alone."""
    import torch
    from reference import load_model_dir

    seqs = [[5, 17, 3, 99, 42, 7, 8], [11, 12, 13, 250, 14, 15, 16, 17, 18, 19, 20, 301, 22]]
    L = max(map(len, seqs))
    ids = np.array([s + [-1] * (L - len(s)) for s in seqs], dtype=np.int64)  # -1: padding
    out = tmp_path / "ov_emb.npy"
    np.save(str(out) + ".in.npy", ids)
    p = subprocess.run([str(ov_python), "-c", RUN_OV, str(onnx), precision, str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    got = np.load(out)
    model, _ = load_model_dir(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        want = np.concatenate([model.fastformer_model(model.word_embedding(torch.tensor([s])),
                                                      torch.ones((1, len(s)))).numpy() for s in seqs])
    if precision == "f32":
        assert bo.relative_error(got, want) <= bo.TOLERANCE
    else:
        assert min(bov.cosines(got, want)) >= bov.BF16_MIN_COSINE
        assert bo.relative_error(got, want) > 1e-6  # really bf16: not bit-near float32


def test_cosine_gate_fails_loudly():
    want = np.linspace(-2, 3, 40).reshape(4, 10)
    assert min(bov.check_cosine(want * 1.5 + 1e-3, want)) > 0.999
    with pytest.raises(bo.ParityError, match="cosine"):
        bov.check_cosine(np.roll(want, 3, axis=1), want)
    with pytest.raises(bo.ParityError):
        bov.check_cosine(np.full((4, 10), np.nan), want)
    with pytest.raises(bo.ParityError):
        bov.check_cosine(np.zeros((4, 9)), want)


def test_bf16_refused_without_the_capability():
    assert bov.check_precision("bf16", ["BF16", "FP32"]) is True
    assert bov.check_precision("f32", ["FP32"]) is False
    with pytest.raises(bov.PrecisionUnsupported, match="does not offer BF16.*use --precision f32"):
        bov.check_precision("bf16", ["FP32", "INT8"])
    with pytest.raises(ValueError, match="f32, bf16"):
        bov.check_precision("fp16", ["FP32"])


def test_bench_openvino_rejects_bad_arguments(tmp_path, capsys):
    assert bov.main(["--model-dir", str(tmp_path), "--threads", "0"]) == 2
    assert "--threads, --buckets and --parity-sequences must be >= 1" in capsys.readouterr().err
    assert bov.main(["--model-dir", str(tmp_path), "--precision", "fp16"]) == 2
    assert "--precision must be one of f32, bf16, not 'fp16'" in capsys.readouterr().err


def test_missing_openvino_names_the_fix(tmp_path, capsys):
    try:
        import openvino  # noqa: F401
        pytest.skip("this interpreter imports openvino")
    except ImportError:
        pass
    assert bov.main(["--model-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "openvino is not importable" in err and "tools/ort_env.py --need openvino" in err

"""tools/bench_onnxruntime.py: the ONNX export, the parity gate, the two modes and the JSON.

ONNX Runtime comes from PyPI into <repo>/.venv-bench (tools/ort_env.py, as `make bench`
does); the test that needs it is skipped, with the reason, only when that install fails.
A tiny model and a 0.5 s run per mode keep it to a few seconds once the venv exists.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import numpy as np
import pytest

import bench_onnxruntime as bo  # importable without onnxruntime
import make_demo_model as mdm
import ort_env
import workload as wl

@pytest.fixture(scope="module")
def ort_python():
    try:
        return ort_env.ensure(log=lambda msg: None)
    except ort_env.OrtUnavailable as e:
        pytest.skip(f"onnxruntime cannot be installed: {e}")


def test_bench_onnxruntime_smoke(ort_python, golden, tmp_path):
    d = tmp_path / "m"
    mdm.make_demo_model(d, preset="tiny", seed=1, log=lambda *a: None)
    bench = golden.bin_dir() / "fastformer-bench"
    cmd = [str(ort_python), str(golden.TOOLS / "bench_onnxruntime.py"), "--model-dir", str(d),
           "--threads", "1", "--batch-tokens", "256", "--lengths", "uniform:4:40", "--seconds", "0.5",
           "--seed", "3", "--pool-batches", "3", "--json"]
    if bench.is_file():  # the pool as fastformer-bench prints it (make test builds it)
        cmd += ["--bench-bin", str(bench)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["workload"].startswith("fastformer-bench" if bench.is_file() else "tools/workload.py")
    par = r["parity"]
    assert par["passed"] and par["tolerance"] == 1e-4 and par["sequences"] == 3
    assert set(par["rel_err_vs_torch_float32"]) == {"embedding", "logits"}  # tiny has a head
    for errs in (par["rel_err_vs_torch_float32"], par["rel_err_vs_torch_float64"]):
        assert all(0 <= e <= 1e-4 for e in errs.values()), errs
    assert r["onnxruntime_version"] and r["providers"] == ["CPUExecutionProvider"]
    assert (r["threads"], r["inter_op_threads"], r["opset"], r["dtype"]) == (1, 1, 17, "float32")
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile"} <= set(r["cpu"]["flags"])
    assert r["cpu"]["model_name"] and r["mlas_sgemm_kernel_inferred"]
    ops = {o["op"] for o in r["kernels"]["ops"]}
    assert "MatMul" in ops or "FusedMatMul" in ops or "Gemm" in ops, ops
    golden.check_peer_modes(r, "onnxruntime", wl.make_pool(3, "uniform:4:40", 1000, 0, 256, 3), 1,
                            "uniform:4:40", 256, 3)


def test_sorted_batches_keep_the_sequences_and_the_budget():
    pool = wl.make_pool(1, "uniform:16:256", 1000, 0, 8192, 8)
    batches, lengths, info = bo.sorted_batches(pool, 4, 8192)
    flat = [tuple(s) for b in batches for s in b]
    assert Counter(flat) == Counter(tuple(s) for b in pool for s in b)
    assert [len(s) for s in flat] == sorted(len(s) for s in flat)
    assert len(info) == 4 and sum(b["sequences"] for b in info) == len(flat)
    for b, L in zip(batches, lengths):
        assert max(len(s) for s in b) <= L and len(b) * L <= 8192
    ids, mask = bo.pad_batch(batches[0], 0, lengths[0])
    assert ids.shape == (len(batches[0]), lengths[0]) and int(mask.sum()) == sum(len(s) for s in batches[0])


def test_parity_check_fails_loudly():
    want = {"embedding": np.linspace(-2, 3, 40).reshape(4, 10)}
    ok = bo.check_parity({"embedding": want["embedding"] * (1 + 5e-6)}, want)
    assert 0 < ok["embedding"] <= 1e-4
    with pytest.raises(bo.ParityError, match="embedding"):
        bo.check_parity({"embedding": want["embedding"] + 3e-4 * 3}, want)
    with pytest.raises(bo.ParityError):
        bo.check_parity({"embedding": np.full((4, 10), np.nan)}, want)
    with pytest.raises(bo.ParityError):
        bo.check_parity({"embedding": np.zeros((4, 9))}, want)


def test_bench_onnxruntime_rejects_bad_arguments(tmp_path):
    assert bo.main(["--model-dir", str(tmp_path), "--threads", "0"]) == 2

"""Tests of the GPU check's parts that run without a GPU: report.py's parsers and
verdicts on synthetic results, gpu-check.sh with no GPU, and the CPU paths of
tools/bench_sdpa.py, tools/bench_pytorch.py and copy_bandwidth.py. The GoogleTest GPU tests of
this folder (gpu_engine_test.cc) run under ctest (label gpu), not here.

    /usr/bin/python3 -m pytest tests/gpu -q
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import report  # noqa: E402

PYTHON = sys.executable


def have_torch():
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- parsers

NCU_LONG = '''==PROF== Connected to process 4242 (/repo/build-gpu/bin/fastformer-bench)
==PROF== Profiling "residual_layernorm_kernel": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","fastformer-bench","127.0.0.1","residual_layernorm_kernel","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","201,326,592"
"0","4242","fastformer-bench","127.0.0.1","residual_layernorm_kernel","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","100,663,296"
"0","4242","fastformer-bench","127.0.0.1","residual_layernorm_kernel","1","7","(256, 1, 1)","(65536, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","100,000"
"1","4242","fastformer-bench","127.0.0.1","nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","150000000"
"1","4242","fastformer-bench","127.0.0.1","nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","100000000"
"1","4242","fastformer-bench","127.0.0.1","nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN","1","7","(384, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","400"
"2","4242","fastformer-bench","127.0.0.1","bias_gelu_kernel","1","7","(256, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","Mbyte","805.31"
"2","4242","fastformer-bench","127.0.0.1","bias_gelu_kernel","1","7","(256, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","Mbyte","402.65"
"2","4242","fastformer-bench","127.0.0.1","bias_gelu_kernel","1","7","(256, 1, 1)","(8192, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","0.5"
"3","4242","fastformer-bench","127.0.0.1","combine_partials_kernel","1","7","(128, 1, 1)","(12, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_read.sum","byte","4096"
"3","4242","fastformer-bench","127.0.0.1","combine_partials_kernel","1","7","(128, 1, 1)","(12, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes_write.sum","byte","1024"
"3","4242","fastformer-bench","127.0.0.1","combine_partials_kernel","1","7","(128, 1, 1)","(12, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","3000"
==PROF== Disconnected from process 4242
'''

NCU_WIDE = '''"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"
"","","","","","","","byte","byte","nsecond"
"0","1","b","h","residual_layernorm_kernel","1","7","201326592","100663296","100000"
"1","1","b","h","residual_layernorm_kernel","1","7","201326592","100663296","120000"
'''


def test_parse_ncu_long_form_units_and_separators():
    launches = report.parse_ncu(NCU_LONG)
    by = {l["name"]: l for l in launches}
    assert len(launches) == 4
    assert by["residual_layernorm_kernel"]["bytes"] == 301989888
    assert by["residual_layernorm_kernel"]["time_s"] == pytest.approx(100e-6)
    assert by["bias_gelu_kernel"]["bytes"] == pytest.approx(1207.96e6)
    assert by["bias_gelu_kernel"]["time_s"] == pytest.approx(0.5e-3)
    assert by["nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN"]["time_s"] == pytest.approx(400e-6)


def test_parse_ncu_wide_form():
    launches = report.parse_ncu(NCU_WIDE)
    assert [l["time_s"] for l in launches] == [pytest.approx(100e-6), pytest.approx(120e-6)]
    rows = report.kernel_table(launches, 4.0e12)
    assert len(rows) == 1 and rows[0]["launches"] == 2
    assert rows[0]["bw"] == pytest.approx(2 * 301989888 / 220e-6)


def test_kernel_table_classifies_gemm_and_small_kernels():
    rows = {r["name"]: r for r in report.kernel_table(report.parse_ncu(NCU_LONG), 4.0e12)}
    assert rows["nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_TNN"]["gemm"]
    assert not rows["residual_layernorm_kernel"]["gemm"] and rows["residual_layernorm_kernel"]["significant"]
    assert rows["residual_layernorm_kernel"]["fraction"] == pytest.approx(301989888 / 100e-6 / 4.0e12)
    assert not rows["combine_partials_kernel"]["significant"]  # latency-bound, too small to count


def test_parse_number():
    assert report.parse_number('"1,234,567"') == 1234567
    assert report.parse_number("9,5") == 9.5
    assert report.parse_number("12.5") == 12.5
    assert report.parse_number("n/a") is None


CTEST_SKIPPED = """    Start 129: Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32"
1/3 Test #129: Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32" .....***Skipped   0.78 sec
100% tests passed, 0 tests failed out of 3

The following tests did not run:
\t129 - Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32" (Skipped)
\t130 - Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float16" (Skipped)
"""


def test_parse_ctest():
    assert report.parse_ctest(CTEST_SKIPPED) == {"passed": 1, "failed": 0, "skipped": 2, "total": 3}
    assert report.parse_ctest("67% tests passed, 1 tests failed out of 3") == \
        {"passed": 2, "failed": 1, "skipped": 0, "total": 3}
    assert report.parse_ctest("No tests were found!!!") == "none"
    assert report.parse_ctest("") is None


def test_the_gpu_tests_are_in_this_folder_and_skip_as_skipped():
    """fastformer_gpu_tests (ctest -L gpu, which gpu-check.sh runs) is built from tests/gpu, and a
    GTEST_SKIP there (no usable GPU) is reported by ctest as Skipped, which parse_ctest counts."""
    cmake = (HERE / "CMakeLists.txt").read_text()
    assert "add_executable(fastformer_gpu_tests gpu_engine_test.cc" in cmake
    assert "fastformer_gtest_discover(fastformer_gpu_tests LABELS gpu)" in cmake
    assert "GTEST_SKIP()" in (HERE / "gpu_engine_test.cc").read_text()
    wiring = (ROOT / "tests" / "CMakeLists.txt").read_text()
    assert "add_subdirectory(gpu)" in wiring
    assert 'SKIP_REGULAR_EXPRESSION "\\\\[  SKIPPED \\\\]"' in wiring
    assert "-L gpu" in (HERE / "gpu-check.sh").read_text()


def test_parse_sanitizer():
    text = """[==========] 4 tests from 1 test suite ran. (2000 ms total)
[  PASSED  ] 4 tests.
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""
    assert report.parse_sanitizer(text) == {"hazards": 2, "errors": 1, "warnings": 1, "tests": 4, "passed": 4}
    assert report.parse_sanitizer("========= ERROR SUMMARY: 0 errors")["errors"] == 0


# ----------------------------------------------------------------------------- the report


def bench(tps, **kw):
    d = {"tokens_per_second": tps, "sequences_per_second": tps / 512, "batches": 40,
         "batch_latency_p50_ms": 20.0, "batch_latency_p99_ms": 25.0, "backend": "cuda"}
    d.update(kw)
    return json.dumps(d)


def make_run(tmp_path, mode="gpu"):
    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.env").write_text(f"mode={mode}\ngpu_why=\nbudget_s=450\nbench_seconds=3\ncuda_arch=90\n"
                                  "started=s\nfinished=f\nelapsed_s=400\n")
    matrix = [
        ("ours-short", "ours", "base-long", "bfloat16", "fixed:512", "65536", "short", bench(3.0e6)),
        ("ours-long", "ours", "base-long", "bfloat16", "fixed:65536", "65536", "long", bench(2.0e6)),
        ("ours-8k", "ours", "base-long", "bfloat16", "fixed:8192", "65536", "seq8192", bench(2.8e6)),
        ("ours-mix", "ours", "base-long", "bfloat16", "uniform:64:4096", "65536", "mix-ref", bench(2.9e6)),
        ("torch-eager", "pytorch", "base-long", "bfloat16", "uniform:64:4096", "65536", "ref",
         bench(0.5e6, padded_tokens=2000, tokens=1000)),
        ("sdpa-8192", "sdpa", "base-long", "bfloat16", "fixed:8192", "65536", "sdpa8192",
         bench(1.0e6, tokens_per_sequence=8192, tflops=400.0)),
        ("torch-compile", "pytorch-compile", "base-long", "bfloat16", "uniform:64:4096", "65536",
         "ref-compile", json.dumps({"tokens_per_second": None, "compile_error": "BackendCompilerFailed: boom"})),
    ]
    stages = []
    for sid, engine, model, dtype, lengths, bt, role, out in matrix:
        (run / f"{sid}.out").write_text("some log line\n" + out + "\n")
        stages.append(f"{sid}\t{engine} {model}\tok\t0\t5\t")
    (run / "benches.tsv").write_text("\n".join("|".join(m[:7]) for m in matrix) + "\n")
    (run / "failing.err").write_text("error: the build broke here\n")
    stages.append("failing\tbuild\tfailed\t2\t30\texit 2")
    stages.append("ctest-gpu\tctest -L gpu\tok\t0\t10\t")
    stages.append("ncu\tncu\tok\t0\t30\t")
    (run / "stages.tsv").write_text("\n".join(stages) + "\n")
    (run / "ctest-gpu.out").write_text("100% tests passed, 0 tests failed out of 6\n")
    (run / "copy-bandwidth.out").write_text(json.dumps(
        {"device": "cuda", "bytes": 1 << 30, "repeats": 20, "bandwidth_bytes_per_second": 4.0e12,
         "best_bandwidth_bytes_per_second": 4.1e12, "device_name": "NVIDIA H200"}) + "\n")
    (run / "ncu.csv").write_text(NCU_LONG)
    (run / "gpu-query.csv").write_text("name, driver_version\nNVIDIA H200, 580\n")
    return run


def test_report_targets_ratios_and_failures(tmp_path):
    run = make_run(tmp_path)
    out, summary = tmp_path / "r.md", tmp_path / "s.txt"
    assert report.main(["--run", str(run), "--out", str(out), "--summary", str(summary)]) == 0
    md = out.read_text()
    targets = md.split("## Targets (issue 4)")[1].split("##")[0]
    rows = {line.split("|")[1].strip(): line for line in targets.splitlines() if line.startswith("| ")}
    assert "PASS" in rows["base-long bf16, 512-token sequences, 65,536-token batches"]
    assert "FAIL" in rows["base-long bf16, one 65,536-token sequence"]
    assert "0.67" in rows["per-token speed, one 65,536-token sequence ÷ 512-token sequences"]
    assert "5.80x" in targets and "2.80x" in targets
    # residual_layernorm: 302 MB in 100 us = 3.02 TB/s = 75% of 4.0; bias_gelu 1.21 GB in 0.5 ms = 60%.
    kernel_row = [line for line in targets.splitlines() if "non-GEMM" in line][0]
    assert "60%" in kernel_row and "FAIL" in kernel_row and "bias_gelu_kernel" in kernel_row
    assert "6/6 passed" in targets
    assert "torch.compile failed: BackendCompilerFailed: boom" in md
    assert "### failing: failed (exit 2)" in md and "the build broke here" in md
    assert "NVIDIA H200" in summary.read_text()


def test_report_smoke_mode_gives_no_verdicts(tmp_path):
    run = make_run(tmp_path, mode="cpu-smoke")
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    targets = out.read_text().split("## Targets (issue 4)")[1].split("##")[0]
    assert "PASS" not in targets and "FAIL" not in targets
    assert "not a GPU figure (cpu-smoke)" in targets


def test_report_survives_an_empty_run(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    assert "not measured" in out.read_text()


# ----------------------------------------------------------------------------- the script


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="a GPU machine runs the real check")
def test_gpu_check_without_a_gpu_is_quick_and_writes_a_report(tmp_path):
    rep = tmp_path / "report.md"
    env = dict(os.environ, GPU_CHECK_WORK=str(tmp_path / "work"))
    env.pop("OUT", None)
    p = subprocess.run(["bash", str(HERE / "gpu-check.sh"), str(rep)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    md = rep.read_text()
    assert "mode: **no-gpu**" in md
    stages = md.split("## Stages")[1].split("##")[0]
    for sid in ("nvidia-smi", "ctest-gpu", "memcheck", "racecheck", "copy-bandwidth",
                "ours-bl-bf16-fixed512", "torch-eager", "sdpa-8192", "torch-compile", "ncu"):
        line = [ln for ln in stages.splitlines() if ln.startswith(f"| {sid} |")]
        assert line and "| skipped |" in line[0] and "no GPU" in line[0], sid


# ----------------------------------------------------------------------------- the tools on the CPU

needs_torch = pytest.mark.skipif(not have_torch(), reason="needs torch")


@needs_torch
def test_bench_sdpa_cpu(tmp_path):
    p = subprocess.run([PYTHON, str(ROOT / "tools/bench_sdpa.py"), "--device", "cpu", "--dtype", "float32",
                        "--hidden", "32", "--heads", "4", "--layers", "2", "--intermediate", "64",
                        "--vocab", "100", "--tokens-per-sequence", "16", "--batch-tokens", "64",
                        "--seconds", "0.05", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["sequences_per_batch"] == 4 and r["tokens"] == r["batches"] * 64 and r["batches"] >= 3
    assert r["tokens_per_second"] > 0 and r["batch_latency_p99_ms"] >= r["batch_latency_p50_ms"]
    assert (r["hidden"], r["heads"], r["layers"], r["intermediate"], r["norm"]) == (32, 4, 2, 64, "post")
    assert r["flops_per_batch"] == 2 * (2 * 64 * (3 * 32 * 32 + 32 * 32 + 2 * 32 * 64) + 2 * 2 * 4 * 16 * 16 * 32)


@needs_torch
def test_bench_sdpa_reads_the_model_dir_and_refuses_cuda_without_a_gpu(tmp_path):
    import torch
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": 16, "num_attention_heads": 2,
                                               "num_hidden_layers": 1, "intermediate_size": 32,
                                               "vocab_size": 50}))
    p = subprocess.run([PYTHON, str(ROOT / "tools/bench_sdpa.py"), "--model-dir", str(d), "--device", "cpu",
                        "--dtype", "float32", "--tokens-per-sequence", "8", "--batch-tokens", "8",
                        "--seconds", "0", "--norm", "pre", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["hidden"], r["heads"], r["layers"], r["intermediate"], r["vocab"]) == (16, 2, 1, 32, 50)
    if not torch.cuda.is_available():
        p = subprocess.run([PYTHON, str(ROOT / "tools/bench_sdpa.py"), "--model-dir", str(d), "--device", "cuda"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "torch.cuda.is_available() is False" in p.stderr


@needs_torch
def test_copy_bandwidth_cpu():
    p = subprocess.run([PYTHON, str(HERE / "copy_bandwidth.py"), "--device", "cpu", "--bytes", "1048576",
                        "--repeats", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["bandwidth_bytes_per_second"] == pytest.approx(2 * r["copy_bytes_per_second"])


@needs_torch
def test_bench_pytorch_compile_failure_is_reported_not_raised(tmp_path):
    sys.path.insert(0, str(ROOT / "tools"))
    import make_demo_model as mdm
    mdm.make_demo_model(tmp_path / "m", preset="tiny", seed=0, log=lambda *a: None)
    code = f"""
import sys, json, torch
sys.path.insert(0, {str(ROOT / 'tools')!r})
import bench_pytorch as bp
def broken(model, dynamic=None):
    def f(x):
        raise RuntimeError("inductor exploded")
    return f
torch.compile = broken
sys.exit(bp.main(["--model-dir", {str(tmp_path / 'm')!r}, "--batch-tokens", "128", "--lengths", "uniform:4:20",
                  "--seconds", "0.05", "--pool-batches", "2", "--compile", "--json"]))
"""
    p = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["tokens_per_second"] is None and r["compile"] is True
    assert r["compile_error"] == "RuntimeError: inductor exploded"

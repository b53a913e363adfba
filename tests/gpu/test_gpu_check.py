"""Tests of the GPU check's parts that run without a GPU: report.py's parsers and
verdicts on synthetic results, gpu-check.sh with no GPU and with a fake one (a fake
nvidia-smi, no cuBLASLt, a small budget; fake nvcc, cmake, python, fastformer-bench and
ncu for the stage order, the caps, the budget, the knobs and where nvcc is found), and
the CPU paths of tools/bench_sdpa.py,
tools/bench_pytorch.py and copy_bandwidth.py. The GoogleTest GPU tests of this folder
(gpu_engine_test.cc) run under ctest (label gpu), not here.

    /usr/bin/python3 -m pytest tests/gpu -q
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
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


# The tail of `ctest -L gpu -E BaseLong -V` under CMake 4.4.3 on the H200 (2026-12-04): CMake 4
# leaves ", 0 tests failed" out of the summary, which the first lease's parser did not read.
CTEST4_PASSED = """9/9 Test #14: Dtypes/GpuEngineTest.ProfileTimesEveryOpWithEvents/"bfloat16" .....   Passed    0.67 sec

The following tests passed:
	Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32"

100% tests passed out of 9

Label Time Summary:
gpu    =   9.09 sec*proc (9 tests)
"""


def test_parse_ctest_of_cmake4():
    assert report.parse_ctest(CTEST4_PASSED) == {"passed": 9, "failed": 0, "skipped": 0, "total": 9}
    text = ("The following tests did not run:\n\t  1 - A.Skips (Skipped)\t\t\tgpu\n\n"
            "The following tests FAILED:\n\t  3 - A.Fails (Failed)      gpu\n"
            "67% tests passed, 1 tests failed out of 3\n")
    assert report.parse_ctest(text) == {"passed": 1, "failed": 1, "skipped": 1, "total": 3}


GTEST_SKIPPED = """[==========] Running 2 tests from 1 test suite.
[ RUN      ] Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/0
tests/gpu/gpu_engine_test.cc:105: Skipped
no usable GPU: backend cuda: no usable CUDA driver or device (CUDA driver version is insufficient)
[  SKIPPED ] Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/0 (805 ms)
[ RUN      ] Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/1
[       OK ] Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/1 (738 ms)
[==========] 2 tests from 1 test suite ran. (1543 ms total)
[  PASSED  ] 1 test.
[  SKIPPED ] 1 test, listed below:
[  SKIPPED ] Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/0
"""

CTEST_V_SKIPPED = """129: [ RUN      ] Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/0
129: tests/gpu/gpu_engine_test.cc:63: Skipped
129: no usable GPU: backend cuda: cannot load the CUDA engine plugin (libcudart.so.13: not found)
129: [  SKIPPED ] Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/0 (1 ms)
1/2 Test #129: Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32" .....***Skipped   0.78 sec
130: tests/gpu/gpu_engine_test.cc:63: Skipped
130: no usable GPU: backend cuda: cannot load the CUDA engine plugin (libcudart.so.13: not found)
2/2 Test #130: Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float16" .....***Skipped   0.70 sec
100% tests passed, 0 tests failed out of 2

The following tests did not run:
\t129 - Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float32" (Skipped)
\t130 - Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/"float16" (Skipped)
"""


def test_parse_gtest_and_skip_reasons():
    assert report.parse_gtest(GTEST_SKIPPED) == {"total": 2, "passed": 1, "failed": 0, "skipped": 1}
    assert report.parse_gtest("[==========] 3 tests from 1 test suite ran. (1 ms total)\n[  PASSED  ] 1 test.\n"
                              "[  FAILED  ] 2 tests, listed below:\n") == \
        {"total": 3, "passed": 1, "failed": 2, "skipped": 0}
    assert report.parse_gtest("Segmentation fault") is None
    assert report.skip_reasons(GTEST_SKIPPED) == [
        "no usable GPU: backend cuda: no usable CUDA driver or device (CUDA driver version is insufficient)"]
    # ctest -V prefixes each line with the test's number; the same reason is listed once.
    assert report.skip_reasons(CTEST_V_SKIPPED) == [
        "no usable GPU: backend cuda: cannot load the CUDA engine plugin (libcudart.so.13: not found)"]


def test_a_skipped_test_with_a_gpu_present_fails_the_stage_with_its_reason():
    """ctest and GoogleTest count a skipped test as passed; with a GPU present it ran nothing."""
    status, why = report.stage_verdict("ctest", CTEST_V_SKIPPED, gpu=True)
    assert status == "failed"
    assert why.startswith("2 of 2 gpu tests skipped with a GPU present (every one): no usable GPU: ")
    assert "libcudart.so.13: not found" in why
    status, why = report.stage_verdict("gtest", GTEST_SKIPPED, gpu=True)
    assert status == "failed" and why.startswith("1 of 2 tests skipped with a GPU present: no usable GPU")
    # Without a GPU a skip is what the tests should do.
    assert report.stage_verdict("ctest", CTEST_V_SKIPPED, gpu=False) == (None, "")
    assert report.stage_verdict("ctest", "100% tests passed, 0 tests failed out of 6", gpu=True) == (None, "")
    assert report.stage_verdict("ctest", "67% tests passed, 1 tests failed out of 3", gpu=True) == \
        ("failed", "1 of 3 gpu tests failed")
    assert report.stage_verdict("ctest", "No tests were found!!!", gpu=True) == \
        ("failed", "no test carries the label gpu")
    assert report.stage_verdict("gtest", "[==========] 0 tests from 0 test suites ran. (0 ms total)\n"
                                "[  PASSED  ] 0 tests.\n", gpu=True) == ("failed", "no test matched the filter")
    assert report.stage_verdict("gtest", "Segmentation fault (core dumped)", gpu=True)[0] == "failed"


def test_a_tool_the_runtime_refuses_is_skipped_with_its_words():
    ncu_refused = ("==PROF== Connected to process 4242 (/repo/build-gpu/bin/fastformer-bench)\n"
                   "==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
                   "Performance Counters on the target device 0.\n")
    status, why = report.stage_verdict("ncu", ncu_refused, gpu=True)
    assert status == "skipped" and why.startswith("refused by this machine's runtime: ==ERROR== ERR_NVGPUCTRPERM")
    # ncu that profiled kernels ran, whatever else it printed.
    assert report.stage_verdict("ncu", ncu_refused + NCU_LONG, gpu=True) == (None, "")
    sanitizer_refused = "========= Error: Target application terminated before first instrumented API call\n"
    assert report.stage_verdict("sanitizer", sanitizer_refused, gpu=True)[0] == "skipped"
    assert report.stage_verdict("sanitizer", "========= COMPUTE-SANITIZER\n========= Error: Device not supported\n",
                                gpu=True)[0] == "skipped"
    # A sanitizer that ran and found errors failed, with its counts, whatever else it printed.
    found = "========= Invalid __global__ read of size 4 bytes\n========= ERROR SUMMARY: 1 error\n"
    assert report.stage_verdict("sanitizer", found + "permission", gpu=True) == (
        "failed", "compute-sanitizer found 1 error (ERROR SUMMARY: 1 error): 1 invalid access; "
                  "first: Invalid __global__ read of size 4 bytes")
    assert report.stage_verdict("sanitizer", "Segmentation fault", gpu=True) == (None, "")


def test_verdict_command_line(tmp_path):
    f = tmp_path / "ctest-gpu.out"
    f.write_text(CTEST_V_SKIPPED)
    p = subprocess.run([PYTHON, str(HERE / "report.py"), "--verdict", "ctest", str(f), str(tmp_path / "none.err"),
                        "--gpu", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    status, why = p.stdout.rstrip("\n").split("\t")
    assert status == "failed" and "skipped with a GPU present" in why
    p = subprocess.run([PYTHON, str(HERE / "report.py"), "--verdict", "ctest", str(f), "--gpu", "0"],
                       capture_output=True, text=True, timeout=60)
    assert p.stdout == "keep\n"


def test_a_later_stage_record_replaces_the_earlier(tmp_path):
    (tmp_path / "stages.tsv").write_text("a\tA\tok\t0\t3\t\nb\tB\tok\t0\t1\t\n"
                                         "a\tA\tfailed\t0\t3\t2 of 6 gpu tests skipped\n")
    stages = report.load_stages(str(tmp_path))
    assert [(s["id"], s["status"], s["note"]) for s in stages] == \
        [("a", "failed", "2 of 6 gpu tests skipped"), ("b", "ok", "")]


def test_the_gpu_tests_are_in_this_folder_and_skip_as_skipped():
    """fastformer_gpu_tests (ctest -L gpu, which gpu-check.sh runs) is built from tests/gpu, and a
    GTEST_SKIP there (no usable GPU) is reported by ctest as Skipped, which parse_ctest counts."""
    cmake = (HERE / "CMakeLists.txt").read_text()
    assert "add_executable(fastformer_gpu_tests gpu_engine_test.cc" in cmake
    assert "fastformer_gtest_discover(fastformer_gpu_tests LABELS gpu)" in cmake
    source = (HERE / "gpu_engine_test.cc").read_text()
    assert "GTEST_SKIP()" in source and "TEST_P(GpuEngineTest, BaseLongShapeMatchesTheCpuEngine)" in source
    wiring = (ROOT / "tests" / "CMakeLists.txt").read_text()
    assert "add_subdirectory(gpu)" in wiring
    script = (HERE / "gpu-check.sh").read_text()
    assert "-L gpu -E BaseLong" in script and "--gtest_filter=*BaseLong*" in script


def _cmakes():
    """Debian's CMake, and CMake 4 (FASTFORMER_CMAKE4: make test-golden passes the PyPI one of
    mk/cache.mk), the release line a lent GPU machine has (4.4.3 on 2026-12-04)."""
    four = os.environ.get("FASTFORMER_CMAKE4", "")
    return [pytest.param(shutil.which("cmake") or "", id="system"), pytest.param(four, id="cmake4")]


@pytest.mark.parametrize("cmake", _cmakes())
def test_fastformer_gtest_discover_reports_gtest_skip_as_skipped(tmp_path, cmake):
    """tests/CMakeLists.txt's fastformer_gtest_discover, in a project of its own, under each
    CMake: ctest lists a GTEST_SKIP test as Skipped and a passing one as passed, with the
    label. On the first H200 lease, CMake 4.4 could not read the discovered-tests file our extra
    SKIP_REGULAR_EXPRESSION property made, and ctest ran none of the GPU tests."""
    if not cmake or not Path(cmake).exists():
        pytest.skip("no such CMake here (FASTFORMER_CMAKE4 unset or missing: make test-golden sets it)")
    if not shutil.which("c++"):
        pytest.skip("no C++ compiler")
    version = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout.split()[2]
    ctest = str(Path(cmake).with_name("ctest")) if Path(cmake).with_name("ctest").exists() else "ctest"
    wiring = (ROOT / "tests" / "CMakeLists.txt").read_text()
    function = re.search(r"function\(fastformer_gtest_discover .*?endfunction\(\)", wiring, re.S)
    assert function, "fastformer_gtest_discover is gone from tests/CMakeLists.txt"
    (tmp_path / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.25)\nproject(discover CXX)\nenable_testing()\n"
        "find_package(GTest REQUIRED)\ninclude(GoogleTest)\n" + function.group(0) + "\n"
        "add_executable(t t.cc)\ntarget_link_libraries(t PRIVATE GTest::gtest_main)\n"
        "fastformer_gtest_discover(t LABELS gpu)\n")
    (tmp_path / "t.cc").write_text('#include <gtest/gtest.h>\nTEST(Gpu, Skips) { GTEST_SKIP() << "no GPU"; }\n'
                                   "TEST(Gpu, Passes) { EXPECT_EQ(2 + 2, 4); }\n")
    build = tmp_path / "b"
    env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_GENERATOR",)}
    for cmd in ([cmake, "-S", str(tmp_path), "-B", str(build)], [cmake, "--build", str(build)]):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=180)
        assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([ctest, "--test-dir", str(build), "-L", "gpu"], capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert "Error" not in out and p.returncode == 0, f"CMake {version}: {out}"
    assert re.search(r"Gpu\.Skips \.+\s*\*+Skipped", out), f"CMake {version}: {out}"
    assert re.search(r"Gpu\.Passes \.+\s*Passed", out), f"CMake {version}: {out}"
    assert "100% tests passed" in out and "gpu" in out, f"CMake {version}: {out}"
    # The report's parser reads this CMake's summary (CMake 4 words it differently).
    assert report.parse_ctest(out) == {"passed": 1, "failed": 0, "skipped": 1, "total": 2}, out


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


def op(name, layer, ms, nbytes, flops=0.0, calls=1):
    return {"name": name, "layer": layer, "calls": calls, "ms": ms, "bytes": nbytes, "flops": flops}


# Against 4.0 TB/s of copy: query_pool 300 MB in 0.1 ms (two layers) = 75%, attn_ln 240 MB in
# 0.1 ms = 60% (the worst that counts); key_pool_combine is too small to count, the GEMM and
# the download are not kernels the target is about.
PROFILE_SHORT = [op("qks_gemm", 0, 0.5, 1e8, 1e11), op("query_pool", 0, 0.05, 1.5e8), op("query_pool", 1, 0.05, 1.5e8),
                 op("attn_ln", 0, 0.1, 2.4e8), op("key_pool_combine", 0, 0.01, 1e6),
                 op("download_pooled", -1, 1.0, 1e6)]
PROFILE_LONG = [op("qks_gemm", 0, 0.5, 1e8, 1e11), op("query_pool", 0, 0.1, 3.2e8)]


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
        ("prof-short", "ours-profile", "base-long", "bfloat16", "fixed:512", "65536", "profile-short",
         bench(2.9e6, profile=PROFILE_SHORT)),
        ("prof-long", "ours-profile", "base-long", "bfloat16", "fixed:65536", "65536", "profile-long",
         bench(2.0e6, profile=PROFILE_LONG)),
    ]
    stages = []
    for sid, engine, model, dtype, lengths, bt, role, out in matrix:
        (run / f"{sid}.out").write_text("some log line\n" + out + "\n")
        stages.append(f"{sid}\t{engine} {model}\tok\t0\t5\t")
    (run / "benches.tsv").write_text("\n".join("|".join(m[:7]) for m in matrix) + "\n")
    (run / "failing.err").write_text("error: the build broke here\n")
    stages.append("failing\tbuild\tfailed\t2\t30\texit 2")
    stages.append("ctest-gpu\tctest -L gpu\tok\t0\t10\t")
    stages.append("parity-base-long\tbase-long parity\tok\t0\t12\t")
    (run / "parity-base-long.out").write_text("[==========] 2 tests from 1 test suite ran. (9000 ms total)\n"
                                              "[  PASSED  ] 2 tests.\n")
    (run / "cublaslt.env").write_text(
        "include_dir=/usr/lib/python3/dist-packages/nvidia/cu13/include\ninclude_version=13.4.1\n"
        "include_from=Python wheel\nlibrary=/usr/lib/python3/dist-packages/nvidia/cu13/lib/libcublasLt.so.13\n"
        "library_file=/usr/lib/python3/dist-packages/nvidia/cu13/lib/libcublasLt.so.13\n"
        "library_version=13.4.1\nlibrary_from=Python wheel\n")
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
    targets = md.split("## Targets")[1].split("##")[0]
    rows = {line.split("|")[1].strip(): line for line in targets.splitlines() if line.startswith("| ")}
    assert "PASS" in rows["base-long bf16, 512-token sequences, 65,536-token batches"]
    assert "FAIL" in rows["base-long bf16, one 65,536-token sequence"]
    assert "0.67" in rows["per-token speed, one 65,536-token sequence ÷ 512-token sequences"]
    assert "5.80x" in targets and "2.80x" in targets
    # residual_layernorm: 302 MB in 100 us = 3.02 TB/s = 75% of 4.0; bias_gelu 1.21 GB in 0.5 ms = 60%.
    kernel_row = [line for line in targets.splitlines() if "non-GEMM" in line and "ncu" in line][0]
    assert "60%" in kernel_row and "FAIL" in kernel_row and "bias_gelu_kernel" in kernel_row
    # The same target from --profile, per shape: the worst op that moves enough bytes.
    short = [line for line in targets.splitlines() if "--profile" in line and "512-token" in line][0]
    assert "attn_ln" in short and "| 60% | FAIL |" in short
    long = [line for line in targets.splitlines() if "--profile" in line and "65,536-token" in line][0]
    assert "query_pool" in long and "| 80% | PASS |" in long
    profile = md.split("## Where the time goes")[1].split("\n## ")[0]
    kinds = {line.split("|")[1].strip(): line.split("|")[-2].strip() for line in profile.splitlines()
             if line.startswith("| ") and "---" not in line and "| op |" not in line}
    assert kinds["qks_gemm"] == "GEMM" and kinds["download_pooled"] == "transfer"
    assert kinds["key_pool_combine"] == "small" and kinds["attn_ln"] == "counts"
    # The cost model of docs/kernels.md beside the measured figures, per op and in total.
    sys.path.insert(0, str(ROOT / "tools"))
    import cost_model
    expected = {r["op"]: r["expected_ms"] for r in cost_model.model(128, 65536)}
    qks_row = [line for line in profile.splitlines() if line.startswith("| qks_gemm |")][0]
    assert f"| {expected['qks_gemm']:.3f} |" in qks_row
    expected_tps = cost_model.summary(cost_model.model(1, 65536), 65536)["expected_tokens_per_s"]
    assert f"(cost model {report.fmt_rate(expected_tps)})" in rows["base-long bf16, one 65,536-token sequence"]
    assert "6/6 passed" in targets
    assert "2/2 passed" in [line for line in targets.splitlines() if "base-long-shaped parity" in line][0]
    assert "cuBLASLt: header /usr/lib/python3/dist-packages/nvidia/cu13/include (13.4.1, Python wheel)" in md
    assert "torch.compile failed: BackendCompilerFailed: boom" in md
    assert "### failing: failed (exit 2)" in md and "the build broke here" in md
    assert "NVIDIA H200" in summary.read_text()


def test_report_smoke_mode_gives_no_verdicts(tmp_path):
    run = make_run(tmp_path, mode="cpu-smoke")
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    targets = out.read_text().split("## Targets")[1].split("##")[0]
    assert "PASS" not in targets and "FAIL" not in targets
    assert "not a GPU figure (cpu-smoke)" in targets


def test_report_survives_an_empty_run(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    assert "not measured" in out.read_text()


# ----------------------------------------------------------------------------- issue 47: recorded outputs

FIXTURES = HERE / "fixtures"


def fixture(name):
    return (FIXTURES / name).read_text()


def sanitizer_text(name):
    """A recorded sanitizer stage's stdout and stderr, as --verdict reads them."""
    err = FIXTURES / (name + ".err")
    return fixture(name + ".out") + "\n" + (err.read_text() if err.exists() else "")


def test_sanitizer_verdicts_on_recorded_outputs():
    """An internal error is a tool failure, never a hazard (the 2026-12-04 run 1 counted racecheck's
    "1 hazard displayed (1 error, 0 warnings)" as one); real hazards and invalid accesses fail with
    their counts; clean runs keep their exit status."""
    assert report.stage_verdict("sanitizer", sanitizer_text("racecheck-internal-error"), gpu=True) == (
        "tool-error",
        "sanitizer internal error during Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/1 (a tool failure, "
        "not a hazard): Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.; its "
        "summary counted it: RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)")
    assert report.stage_verdict("sanitizer", sanitizer_text("racecheck-hazard"), gpu=True) == (
        "failed",
        "compute-sanitizer found 2 hazards (RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)): 2 races; "
        "first: Error: Race reported between Write access at pool_combine_kernel<float, float> "
        "(additive_pooling.cu:162) and Read access at pool_combine_kernel<float, float> (additive_pooling.cu:171) "
        "[96 hazards]")
    assert report.stage_verdict("sanitizer", sanitizer_text("memcheck-out-of-bounds"), gpu=True) == (
        "failed",
        "compute-sanitizer found 3 errors (ERROR SUMMARY: 3 errors): 2 invalid accesses, 1 CUDA API error; "
        "first: Invalid __global__ read of size 4 bytes at pool_partials_kernel<__nv_bfloat16, float> "
        "(additive_pooling.cu:88)")
    assert report.stage_verdict("sanitizer", sanitizer_text("memcheck-clean"), gpu=True) == (None, "")
    assert report.stage_verdict("sanitizer", sanitizer_text("racecheck-clean"), gpu=True) == (None, "")


def test_sanitizer_internal_error_beside_real_findings():
    """Hazards win over an internal error; the API errors an internal error causes are its own."""
    internal = "========= Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.\n"
    race = ("========= Error: Race reported between Write access at k(float *)+0x10 in a.cu:3\n"
            "=========     and Read access at k(float *)+0x20 in a.cu:4 [2 hazards]\n")
    both = race + internal + "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
    status, why = report.stage_verdict("sanitizer", both, gpu=True)
    assert status == "failed"
    assert why == ("compute-sanitizer found 1 hazard (RACECHECK SUMMARY: 2 hazards displayed (2 errors, "
                   "0 warnings)): 1 race; first: Error: Race reported between Write access at k (a.cu:3) and "
                   "Read access at k (a.cu:4) [2 hazards]; besides 1 sanitizer internal error (a tool failure, "
                   "not counted): Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception.")
    api = ('========= Program hit cudaErrorIllegalAddress (error 700) due to "an illegal memory access was '
           'encountered" on CUDA API call to cudaStreamSynchronize.\n')
    # memcheck: the internal error, then the call that fails because of it: a tool failure.
    assert report.stage_verdict("sanitizer", internal + api + "========= ERROR SUMMARY: 2 errors\n",
                                gpu=True)[0] == "tool-error"
    # A summary that counts one more error than the internal error and its consequence explain.
    status, why = report.stage_verdict("sanitizer", internal + api + "========= ERROR SUMMARY: 3 errors\n", gpu=True)
    assert status == "failed" and why.startswith("compute-sanitizer found 1 error (ERROR SUMMARY: 3 errors)")
    # No summary at all (the sanitizer died) with an internal error: still the tool's failure.
    assert report.stage_verdict("sanitizer", internal, gpu=True)[0] == "tool-error"
    # The program's own words are not the sanitizer's: no prefix, no "sanitizer" in the line.
    assert report.stage_verdict("sanitizer", "what(): cuBLAS internal error\n========= ERROR SUMMARY: 0 errors\n",
                                gpu=True) == (None, "")


def test_sanitizer_verdict_command_line_says_tool_error():
    p = subprocess.run([PYTHON, str(HERE / "report.py"), "--verdict", "sanitizer",
                        str(FIXTURES / "racecheck-internal-error.out"), str(FIXTURES / "racecheck-internal-error.err"),
                        "--gpu", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    status, why = p.stdout.rstrip("\n").split("\t")
    assert status == "tool-error" and "not a hazard" in why
    p = subprocess.run([PYTHON, str(HERE / "report.py"), "--verdict", "sanitizer",
                        str(FIXTURES / "memcheck-clean.out"), "--gpu", "1"], capture_output=True, text=True, timeout=60)
    assert p.stdout == "keep\n"


def test_sanitizer_analysis_names_the_tests_that_ran():
    a = report.sanitizer_analysis(sanitizer_text("racecheck-internal-error"))
    assert a["filter"] == "*Small*"
    assert a["runs"] == [("Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/0", "ok"),
                         ("Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/1", "did not finish")]
    assert a["stopped_in"] == "Dtypes/GpuEngineTest.SmallBatchMatchesTheCpuEngine/1"
    assert a["real"] == 0 and len(a["internal"]) == 1
    a = report.sanitizer_analysis(sanitizer_text("memcheck-out-of-bounds"))
    assert a["filter"] == "*BaseLong*"
    assert [o for _, o in a["runs"]] == ["ok", "ok", "failed"]
    assert a["runs"][-1][0] == "Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/2"
    assert (a["real"], len(a["errors"]), len(a["api"])) == (3, 2, 1)
    a = report.sanitizer_analysis(sanitizer_text("racecheck-hazard"))
    assert (a["real"], len(a["errors"]), len(a["warnings"])) == (2, 2, 1)
    assert report.runs_text(a["runs"][:2]) == ("Dtypes/GpuEngineTest.: BaseLongShapeMatchesTheCpuEngine/0 ok, "
                                               "BaseLongShapeMatchesTheCpuEngine/1 ok")
    assert report.gtest_filter("", "compute-sanitizer memcheck (x), fastformer_gpu_tests --gtest_filter=*BaseLong*") \
        == "*BaseLong*"


def add_stages(run, *records):
    """Appends stage records (id, title, status, note) to a run's stages.tsv."""
    with open(run / "stages.tsv", "a") as f:
        for sid, title, status, note in records:
            f.write(f"{sid}\t{title}\t{status}\t{'0' if status == 'ok' else '99'}\t7\t{note}\t40\t100\n")


def copy_fixture(run, name, sid):
    (run / f"{sid}.out").write_text(fixture(name + ".out"))
    err = FIXTURES / (name + ".err")
    if err.exists():
        (run / f"{sid}.err").write_text(err.read_text())


def target_row(md, start):
    targets = md.split("## Targets")[1].split("\n## ")[0]
    rows = [ln for ln in targets.splitlines() if ln.startswith("| " + start)]
    assert len(rows) == 1, (start, rows)
    return [c.strip() for c in re.split(r"(?<!\\)\|", rows[0].strip()[1:-1])]


def sanitizer_title(tool, filt, loading):
    return (f"compute-sanitizer {tool} (scope; CUDA_MODULE_LOADING={loading}), fastformer_gpu_tests "
            f"--gtest_filter={filt}")


def test_report_a_sanitizer_tool_failure_is_retried_and_never_a_hazard(tmp_path):
    """gpu-check.sh's four sanitizer stages. racecheck: an internal error, then a clean retry with
    the other module loading: the retry's result stands (PASS), the first run is a tool failure,
    retried. racecheck-base-long: an internal error whose retry was skipped: not measured, never
    FAIL. memcheck-base-long: real invalid reads: FAIL with the counts. memcheck: clean."""
    run = make_run(tmp_path)
    copy_fixture(run, "memcheck-clean", "memcheck")
    copy_fixture(run, "memcheck-out-of-bounds", "memcheck-base-long")
    copy_fixture(run, "racecheck-internal-error", "racecheck")
    copy_fixture(run, "racecheck-clean", "racecheck-retry")
    (run / "racecheck-base-long.out").write_text(
        fixture("racecheck-internal-error.out").replace("*Small*", "*BaseLong*")
        .replace("SmallBatchMatchesTheCpuEngine", "BaseLongShapeMatchesTheCpuEngine"))
    tool_error = report.stage_verdict("sanitizer", sanitizer_text("racecheck-internal-error"), True)[1]
    add_stages(run,
               ("memcheck", sanitizer_title("memcheck", "*Small*", "LAZY"), "ok", ""),
               ("memcheck-base-long", sanitizer_title("memcheck", "*BaseLong*", "LAZY"), "failed", "exit 99"),
               ("memcheck-base-long", sanitizer_title("memcheck", "*BaseLong*", "LAZY"), "failed",
                report.stage_verdict("sanitizer", sanitizer_text("memcheck-out-of-bounds"), True)[1]),
               ("racecheck", sanitizer_title("racecheck", "*Small*", "default"), "failed", "exit 99"),
               ("racecheck", sanitizer_title("racecheck", "*Small*", "default"), "tool-error", tool_error),
               ("racecheck-retry", sanitizer_title("racecheck", "*Small*", "EAGER"), "ok", ""),
               ("racecheck-base-long", sanitizer_title("racecheck", "*BaseLong*", "default"), "tool-error",
                tool_error),
               ("racecheck-base-long-retry", sanitizer_title("racecheck", "*BaseLong*", "EAGER"), "skipped",
                "time budget spent (GPU_CHECK_BUDGET_S=420)"))
    out, summary = tmp_path / "r.md", tmp_path / "s.txt"
    assert report.main(["--run", str(run), "--out", str(out), "--summary", str(summary)]) == 0
    md = out.read_text()
    table = {r["stage"]: r for r in stage_table(md)}
    assert table["racecheck"]["status"] == "tool failure (sanitizer internal error), retried"
    assert table["racecheck-retry"]["status"] == "ok"
    assert table["racecheck-base-long"]["status"] == ("tool failure (sanitizer internal error), retry skipped: "
                                                      "time budget spent (GPU_CHECK_BUDGET_S=420)")
    assert table["memcheck-base-long"]["status"] == "failed"
    # Targets: the retry's result stands; a tool failure is not measured, never a hazard.
    row = target_row(md, "compute-sanitizer racecheck, fastformer_gpu_tests *Small* ")
    assert row[1:] == ["0 hazards", "0 hazards; 3 tests ran; retry (racecheck-retry, CUDA_MODULE_LOADING=EAGER) "
                       "after the first run's tool failure (sanitizer internal error)", "PASS"]
    row = target_row(md, "compute-sanitizer racecheck, fastformer_gpu_tests *BaseLong* ")
    assert row[3] == "not measured: tool failure (sanitizer internal error)"
    assert row[2] == ("tool failure (sanitizer internal error): Internal Sanitizer Error: The Sanitizer failed to "
                      "handle a hardware exception., not a hazard (its summary counted it: RACECHECK SUMMARY: "
                      "1 hazard displayed (1 error, 0 warnings)); 2 tests ran, 1 not ok; stopped in "
                      "Dtypes/GpuEngineTest.BaseLongShapeMatchesTheCpuEngine/1")
    row = target_row(md, "compute-sanitizer memcheck, fastformer_gpu_tests *BaseLong* ")
    assert row[2] == ("3 errors; ERROR SUMMARY: 3 errors; first: Invalid __global__ read of size 4 bytes at "
                      "pool_partials_kernel<__nv_bfloat16, float> (additive_pooling.cu:88); 3 tests ran, 1 not ok")
    assert row[3] == "FAIL"
    row = target_row(md, "compute-sanitizer memcheck, fastformer_gpu_tests *Small* ")
    assert row[2:] == ["0 errors; 3 tests ran", "PASS"]
    # The sanitizer summary (Correctness): the retry's result, both stages named, the tests each ran.
    correctness = md.split("## Correctness on the GPU")[1].split("\n## ")[0]
    line = [ln for ln in correctness.splitlines() if ln.startswith("| compute-sanitizer racecheck (*Small*)")][0]
    assert "racecheck: tool failure (sanitizer internal error), retried" in line and "racecheck-retry: ok" in line
    result = line.split(" | ")[1]  # the retry's result; the first run's words only in the stage column
    assert result.startswith("0 hazards; 3 tests ran; retry") and "hazard displayed" not in result
    assert ("- racecheck (first run, tool failure (sanitizer internal error)): Dtypes/GpuEngineTest.: "
            "SmallBatchMatchesTheCpuEngine/0 ok, SmallBatchMatchesTheCpuEngine/1 did not finish") in correctness
    assert ("- racecheck-retry: Dtypes/GpuEngineTest.: SmallBatchMatchesTheCpuEngine/0 ok, "
            "SmallBatchMatchesTheCpuEngine/1 ok, SmallBatchMatchesTheCpuEngine/2 ok") in correctness
    assert ("- memcheck-base-long: Dtypes/GpuEngineTest.: BaseLongShapeMatchesTheCpuEngine/0 ok, "
            "BaseLongShapeMatchesTheCpuEngine/1 ok, BaseLongShapeMatchesTheCpuEngine/2 failed") in correctness
    # Failures and the summary name the tool failure as such.
    assert "### racecheck: tool failure (sanitizer internal error), retried (sanitizer internal error during" in md
    text = summary.read_text()
    assert "  stage racecheck: tool failure (sanitizer internal error), retried (sanitizer internal error" in text
    assert "[FAIL] compute-sanitizer memcheck, fastformer_gpu_tests *BaseLong*" in text
    assert "[PASS] compute-sanitizer racecheck, fastformer_gpu_tests *Small*" in text


def test_parse_ncu_counts_l2_write_sectors():
    """issue 47: bytes = DRAM bytes read + 32 x L2 write sectors; dram__bytes_write misses the
    writes the L2 still holds (bias_activation: 4 MiB of DRAM writes for 32 MiB written)."""
    launches = report.parse_ncu(fixture("ncu-l2.csv"))
    assert len(launches) == 6 and all(l["bytes_from"] == "l2-write" for l in launches)
    first = launches[3]
    assert first["name"] == "bias_activation_kernel"
    assert first["bytes"] == 33554432 + 32 * 1048576
    assert (first["dram_write"], first["l2_write"], first["l2_read"]) == (4194304, 33554432, 33554432)
    rows = {r["name"]: r for r in report.kernel_table(launches, 4.0e12)}
    ba = rows["bias_activation_kernel"]
    assert ba["launches"] == 2 and ba["bytes"] == 134217728 and ba["dram_write"] == 9437184
    assert ba["time_s"] == pytest.approx(46e-6)
    assert ba["fraction"] == pytest.approx(134217728 / 46e-6 / 4.0e12)  # 73%, where DRAM writes made it 42%
    assert rows["key_scores_kernel"]["bytes"] == 37748736 + 32 * 32768 and rows["key_scores_kernel"]["significant"]
    assert not rows["pool_combine_kernel"]["significant"]
    # The wide ('raw') form with the same metrics, units in the second row.
    wide = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","dram__bytes_read.sum",'
            '"dram__bytes_write.sum","gpu__time_duration.sum","lts__t_sectors_op_read.sum",'
            '"lts__t_sectors_op_write.sum"\n'
            '"","","","","","","","byte","byte","usecond","sector","Ksector"\n'
            '"0","1","b","h","bias_activation_kernel","1","7","33554432","4194304","22","1048576","1048.576"\n')
    (l,) = report.parse_ncu(wide)
    assert l["bytes"] == pytest.approx(33554432 + 32 * 1048576) and l["time_s"] == pytest.approx(22e-6)
    # An older CSV (DRAM metrics only): DRAM read + written, as before.
    old = {l["name"]: l for l in report.parse_ncu(NCU_LONG)}
    assert old["residual_layernorm_kernel"]["bytes_from"] == "dram"
    assert old["residual_layernorm_kernel"]["bytes"] == 201326592 + 100663296


def test_report_ncu_table_says_where_its_bytes_come_from(tmp_path):
    run = make_run(tmp_path)
    (run / "ncu.csv").write_text(fixture("ncu-l2.csv"))
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    md = out.read_text()
    section = md.split("## Memory bandwidth")[1].split("\n## ")[0]
    assert "Bytes: DRAM bytes read (`dram__bytes_read`) + L2 write sectors x 32 B (`lts__t_sectors_op_write`)" \
        in section
    line = [ln for ln in section.splitlines() if ln.startswith("| bias_activation_kernel |")][0]
    assert [c.strip() for c in line.strip("|").split("|")] == [
        "bias_activation_kernel", "2", "0.046", "128.0 MiB", "64.0 MiB", "64.0 MiB", "9.0 MiB", "2.92 TB/s", "73%",
        "counts"]
    # The 70% target from ncu on the same bytes: key_scores_kernel, 38.8 MB in 52 us = 19% of 4.0 TB/s.
    row = target_row(md, "non-GEMM kernels vs device-to-device copy bandwidth, ncu")
    assert "(DRAM read + L2 write sectors; worst kernel" in row[0] and "key_scores_kernel" in row[0]
    assert row[2:] == ["19%", "FAIL"]
    # An old CSV: the note says the bytes understate the writes.
    (run / "ncu.csv").write_text(NCU_LONG)
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    md = out.read_text()
    assert "so the writes still held in the 50 MB L2 when a kernel ended are not counted, and the bytes and " \
           "bandwidths **understate the writes**" in md
    assert "DRAM read + written, understating writes held in the L2" in target_row(md, "non-GEMM kernels vs "
                                                                                        "device-to-device")[0]


def profile_json(names, layers=12):
    """One line of `fastformer-bench --profile --json` on base-long bf16 fixed:512 @65536: a
    profile row per op and layer, with the keys the bench writes."""
    rows = []
    for layer in range(layers):
        for name, ms, nbytes, flops in names:
            rows.append({"bytes": nbytes, "calls": 1.0, "flops": flops, "gbps": nbytes / ms / 1e6, "kernel": "",
                         "layer": layer, "ms": ms, "name": name, "share": 0.01, "tflops": flops / ms / 1e9})
    return bench(2.5e6, profile=rows, lengths="fixed:512", model="base-long", dtype="bfloat16", batch_tokens=65536)


def profile_rows_of(md, shape="512-token sequences"):
    section = md.split("## Where the time goes")[1].split("\n## ")[0]
    part = section.split(shape)[1].split("base-long bfloat16, ")[0]
    rows = {}
    for ln in part.splitlines():
        if ln.startswith("| ") and "---" not in ln and "| op |" not in ln:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows, part


def test_profile_split_rows_are_both_compared_with_the_cost_model(tmp_path):
    """The engine's --profile gives ffn_in_gemm (the GEMM alone) and ffn_in_bias_gelu (the
    exact-erf GELU pass) apart, as tools/cost_model.py prices them: both are compared. An older
    profile's ffn_in_gemm includes the pass: it is left out, with the reason."""
    sys.path.insert(0, str(ROOT / "tools"))
    import cost_model
    expected = {r["op"]: r["expected_ms"] for r in cost_model.model(128, 65536)}
    run = make_run(tmp_path)
    split = [("ffn_in_gemm", 0.49, 5.08e8, 3.09e11), ("ffn_in_bias_gelu", 0.24, 8.05e8, 0.0),
             ("ffn_out_gemm", 0.41, 5.08e8, 3.09e11)]
    (run / "prof-short.out").write_text("log\n" + profile_json(split) + "\n")
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    rows, part = profile_rows_of(out.read_text())
    assert rows["ffn_in_gemm"][3] == f"{expected['ffn_in_gemm']:.3f}"
    assert rows["ffn_in_bias_gelu"][3] == f"{expected['ffn_in_bias_gelu']:.3f}"
    assert rows["ffn_in_bias_gelu"][9] == "counts"  # a row kernel moving 805 MB a launch, judged for the 70%
    assert rows["ffn_in_gemm"][9] == "GEMM"
    assert ("`ffn_in_gemm` is the GEMM alone and `ffn_in_bias_gelu` the pass after it (the profile splits them, "
            "as the cost model does): both are compared.") in part
    compared = expected["ffn_in_gemm"] + expected["ffn_in_bias_gelu"] + expected["ffn_out_gemm"]
    assert f"The 3 ops compared with the cost model by name take {12 * (0.49 + 0.24 + 0.41):.2f} ms against its " \
           f"{compared:.2f} ms." in part
    assert "left out of the comparison" not in part
    # An older fastformer-bench: one ffn_in_gemm row with the pass in it.
    (run / "prof-short.out").write_text("log\n" + profile_json([("ffn_in_gemm", 0.74, 5.08e8, 3.09e11),
                                                                 ("ffn_out_gemm", 0.41, 5.08e8, 3.09e11)]) + "\n")
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    rows, part = profile_rows_of(out.read_text())
    assert rows["ffn_in_gemm"][3] == "—" and rows["ffn_out_gemm"][3] == f"{expected['ffn_out_gemm']:.3f}"
    assert "ffn_in_bias_gelu" not in rows
    assert (f"`ffn_in_gemm` is left out of the comparison: this profile has no `ffn_in_bias_gelu` row, so its "
            f"`ffn_in_gemm` includes that pass (the exact-erf GELU), which the cost model prices apart "
            f"({expected['ffn_in_gemm']:.3f} ms for the GEMM, {expected['ffn_in_bias_gelu']:.3f} ms for the pass).") \
        in part
    assert "The 1 ops compared with the cost model by name take 4.92 ms" in part


SERVER_TARGETS = ("server parity (bf16 cosine >= 0.999 to CPU float32, same argmax)",
                  "server ÷ engine tokens/s >= 0.90", "drain: 0 lost, exit 0")


def server_run(tmp_path, parity="server-parity-ok.json", load="server-load-ok.json", stages=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    run = make_run(tmp_path)
    for name, sid in ((parity, "server-parity"), (load, "server-load")):
        if name:
            (run / f"{sid}.json").write_text(fixture(name) if name.endswith(".json") else name)
    add_stages(run, *(stages or [("server-parity", "the server: parity", "ok", ""),
                                 ("server-load", "the server: saturation, low load, drain", "ok", "")]))
    out, summary = tmp_path / "r.md", tmp_path / "s.txt"
    assert report.main(["--run", str(run), "--out", str(out), "--summary", str(summary)]) == 0
    md = out.read_text()
    section = md.split("## The server on the GPU")[1].split("\n## ")[0]
    return md, section, summary.read_text()


def test_report_server_on_the_gpu_all_ok(tmp_path):
    md, section, summary = server_run(tmp_path)
    assert target_row(md, SERVER_TARGETS[0])[2:] == [
        "min cosine 0.99968 over 4 groups (grpc, http, text-grpc, text-http), 80 requests; argmax 16/16 same", "PASS"]
    assert target_row(md, SERVER_TARGETS[1])[2:] == ["0.91 (server 2.10 M ÷ engine 2.30 M tokens/s)", "PASS"]
    assert target_row(md, SERVER_TARGETS[2])[2:] == [
        "500 requests: 480 answered, 20 refused (UNAVAILABLE 20), 0 lost, none hung, exit 0", "PASS"]
    assert ("- backend **cuda**, dtype auto picked: **bfloat16**; the server's log: `[2026-12-08 10:02:11.412] "
            "[info] backend cuda: dtype auto -> bfloat16") in section
    grpc = [ln for ln in section.splitlines() if ln.startswith("| grpc |")][0]
    assert [c.strip() for c in grpc.strip("|").split("|")] == [
        "grpc", "base-long", "32", "33", "123,456", "0.99971", "≥ 0.999", "request 7 (4,096 tokens)", "no head", "0",
        "ok"]
    assert "| text-http | official | 8 | 8 | 5,120 | 0.99991 | ≥ 0.999 | request 5 (1,024 tokens) | 8/8 | 0 | ok |" \
        in section
    assert "| server ÷ engine | **0.91** (target ≥ 0.90) |" in section
    assert "| engine tokens/s (fastformer-bench, the same plugin, model, lengths and budget) | 2.30 M (bfloat16) |" \
        in section
    assert "| batches, mean batch tokens (/metrics) | 300, 60,000 |" in section
    assert "| GPU memory | 12,345 MiB (nvidia-smi --query-compute-apps) |" in section
    assert "| end to end (client) | 1.20 / 2.50 |" in section
    assert "| the server's queue | 0.10 / 0.30 |" in section and "| the server's compute | 0.90 / 1.50 |" in section
    assert "| refused, by code | 20 (UNAVAILABLE 20) |" in section and "| lost | 0 |" in section
    assert "| server exit code | 0 |" in section and "| verdict | ok |" in section
    for label in SERVER_TARGETS:
        assert f"[PASS] {label}" in summary, label


def test_report_server_parity_group_failed(tmp_path):
    md, section, summary = server_run(tmp_path, parity="server-parity-failed.json")
    verdict = target_row(md, SERVER_TARGETS[0])[3]
    assert verdict == ("FAIL: text-http: min cosine 0.99812 < 0.999 (request 6 (1,498 tokens)); argmax differs "
                       "in 1 of 8; 1 request failed")
    line = [ln for ln in section.splitlines() if ln.startswith("| text-http |")][0]
    assert "| 0.99812 |" in line and "| 7/8 |" in line and "FAIL: min cosine 0.99812 < 0.999" in line
    assert '- text-http: request 2: HTTP 503: {"error": {"message": "server is draining"}}' in section
    assert "[FAIL: text-http: min cosine 0.99812" in summary


def test_report_server_stage_skipped_without_a_gpu(tmp_path):
    why = "no GPU: nvidia-smi not found (no NVIDIA driver on this machine)"
    md, section, summary = server_run(tmp_path, parity=None, load=None, stages=[
        ("server-parity", "the server: parity", "skipped", why), ("server-load", "the server: load", "skipped", why)])
    for label in SERVER_TARGETS:
        assert target_row(md, label)[2:] == ["—", f"not measured: skipped: {why}"], label
        assert f"[not measured: skipped: {why}] {label}" in summary
    assert section.strip() == f"Not measured: server-parity skipped: {why}; server-load skipped: {why}."
    # No stage and no file at all (an older run): not run, and no crash.
    md, _, _ = server_run(tmp_path / "older", parity=None, load=None, stages=[("other", "x", "ok", "")])
    assert target_row(md, SERVER_TARGETS[1])[3] == "not measured: not run (no stage server-load, no server-load.json)"


def test_report_server_below_target_and_a_lost_drain(tmp_path):
    md, section, summary = server_run(tmp_path, load="server-load-below-target.json")
    assert target_row(md, SERVER_TARGETS[1])[2:] == ["0.82 (server 1.89 M ÷ engine 2.30 M tokens/s)", "FAIL"]
    assert target_row(md, SERVER_TARGETS[2])[2:] == [
        "500 requests: 470 answered, 28 refused (UNAVAILABLE 27, DEADLINE_EXCEEDED 1), 3 lost, one or more hung, "
        "exit ?",
        "FAIL: 3 requests lost (neither answered nor refused with a clear code); a request hung; "
        "no 'drained; exiting' in the server's log"]
    assert "| of them unclear (not a clear refusal) | 1 |" in section
    assert "| neither answered nor refused | 2 |" in section and "| hung | yes |" in section
    assert "| server exit code | — |" in section
    assert "[FAIL] server ÷ engine tokens/s >= 0.90: 0.82" in summary


def test_report_server_stage_that_failed_early(tmp_path):
    """Keys missing or null, an error: rendered, never a crash."""
    load = json.dumps({"backend": "cuda", "dtype": None, "model": "base-long", "max_batch_tokens": 65536,
                       "saturation": {}, "low_load": {}, "drain": {}, "ok": False,
                       "error": "fastformer-server exited 1 before listening: libcublasLt.so.13: cannot open"})
    parity = json.dumps({"backend": "cuda", "groups": None, "threshold": None, "ok": False, "error": None})
    md, section, _ = server_run(tmp_path, parity=parity, load=load, stages=[
        ("server-parity", "the server: parity", "failed", "exit 2"),
        ("server-load", "the server: load", "failed", "a verdict does not hold: error")])
    assert target_row(md, SERVER_TARGETS[0])[3] == "not measured: failed: exit 2"
    for label in SERVER_TARGETS[1:]:
        assert target_row(md, label)[3] == ("not measured: failed: fastformer-server exited 1 before listening: "
                                            "libcublasLt.so.13: cannot open"), label
    assert "The stage did not complete: fastformer-server exited 1 before listening" in section
    md, _, _ = server_run(tmp_path / "garbage", parity="{not json", load="[]")
    assert target_row(md, SERVER_TARGETS[0])[3] == "not measured: stage server-parity ok, but no readable " \
        "server-parity.json"
    assert target_row(md, SERVER_TARGETS[2])[3] == "not measured: stage server-load ok, but no readable " \
        "server-load.json"


# ----------------------------------------------------------------------------- the script


# The stages in the order gpu-check.sh runs them (issues 21 and 47): what only a GPU can tell
# first: engine parity, server parity, copy bandwidth, the server under load, the engine's
# benchmarks, the sanitizers (the small model, then base-long's shapes; a <ID>-retry follows a
# tool failure), ncu, torch.compile last. The model stages run in the background and are left out.
STAGE_ORDER = ["cublaslt", "probes", "nvidia-smi", "deps", "configure", "build", "ctest-gpu", "parity-base-long",
               "ctest-gpu-opt-in", "parity-base-long-opt-in",
               "server-parity", "copy-bandwidth", "server-load", "ours-bl-bf16-fixed512", "ours-bl-bf16-fixed65536",
               "prof-bl-bf16-fixed512", "prof-bl-bf16-fixed65536", "ours-bl-bf16-mix", "ours-bl-bf16-fixed8192",
               "bench-old-new", "bench-opt-in", "memcheck", "memcheck-base-long", "racecheck", "racecheck-base-long", "ncu", "torch-eager",
               "sdpa-8192", "sdpa-512", "torch-compile"]


# ----------------------------------------------------------------------------- issue 48: old and new, opt-in


def add_records(run, *lines):
    """Appends whole stage records (id, title, status, rc, seconds, note, limit, at) to stages.tsv."""
    with open(run / "stages.tsv", "a") as f:
        f.write("".join(line + "\n" for line in lines))


def ab_run(tmp_path, parity_file="parity-base-long-opt-in.out", cutlass="4.2.0.0"):
    """make_run's GPU run with the recorded issue-48 outputs: the alternated old/new and opt-in runs
    (fixtures/bench-*.json, in bench_ab.py's format), the opt-in GPU tests, and the CUTLASS record."""
    run = make_run(tmp_path)
    for name in ("bench-old-new.json", "bench-opt-in.json", "ctest-gpu-opt-in.out"):
        shutil.copy(FIXTURES / name, run / name)
    shutil.copy(FIXTURES / parity_file, run / "parity-base-long-opt-in.out")
    failed = "failed" in parity_file
    add_records(run, "ctest-gpu-opt-in\tctest -L gpu, FASTFORMER_CUDA_OPT_IN=all\tok\t0\t3\t\t30\t60",
               f"parity-base-long-opt-in\tbase-long parity, FASTFORMER_CUDA_OPT_IN=all\t{'failed' if failed else 'ok'}"
               f"\t{1 if failed else 0}\t3\t{'exit 1' if failed else ''}\t30\t63",
               "bench-old-new\told and new\tok\t0\t33\t\t48\t120",
               "bench-opt-in\topt-in\tok\t0\t49\t\t72\t153")
    (run / "cutlass.env").write_text(
        f"include_dir=/repo/.deps/cutlass/include\nversion={cutlass}\nwhy=\n" if cutlass else
        "include_dir=\nversion=\nwhy=no CUTLASS headers in .deps (deploy/carry-gpu-deps.sh packs them)\n")
    return run


def section(md, title):
    return md.split(f"## {title}")[1].split("\n## ")[0]


def test_report_old_and_new_in_one_run(tmp_path):
    """new ÷ old per shape from the alternated runs, against ratios worked out by hand from the
    fixture: 512-token sequences (2.50 + 2.54) / 2 over (2.00 + 2.04) / 2 = 2.52 / 2.02 = 1.2475;
    one 65,536-token sequence 2.42 / 2.12 = 1.1415."""
    run = ab_run(tmp_path)
    out, summary = tmp_path / "r.md", tmp_path / "s.txt"
    assert report.main(["--run", str(run), "--out", str(out), "--summary", str(summary)]) == 0
    md = out.read_text()
    old_new = section(md, "Old and new in one run")
    assert "- old: commit `d6c8eadb2a28ced74cae41e862aa72a2d1918fe0`, the last before issue 48's work" in old_new
    assert "the carried server's (deploy/build-binaries.sh, commit 1a2b3c4" in old_new
    assert "2 of each per shape, --seconds 2.0 each" in old_new
    rows = {ln.split("|")[1].strip(): ln for ln in old_new.splitlines() if ln.startswith("| ")}
    short = rows["512-token sequences, 65,536-token batches"]
    assert f"{2.52 / 2.02:.2f}x" == "1.25x" and "| 2.02 M (2.00 M, 2.04 M) | 2.52 M (2.50 M, 2.54 M) | 1.25x | PASS |" in short
    long = rows["one 65,536-token sequence"]
    assert f"{2.42 / 2.12:.2f}x" == "1.14x" and "| 1.14x | FAIL |" in long
    targets = section(md, "Targets")
    assert "| new ÷ old (d6c8ead), base-long bf16, 512-token sequences, 65,536-token batches (bench-old-new) | ≥ 1.2x " \
           "| 1.25x | PASS |" in targets
    assert "| new ÷ old (d6c8ead), base-long bf16, one 65,536-token sequence (bench-old-new) | ≥ 1.2x | 1.14x | FAIL |" \
        in targets
    assert "[FAIL] new ÷ old (d6c8ead)" in summary.read_text()


def test_report_old_and_new_not_run_says_why(tmp_path):
    run = make_run(tmp_path)
    add_records(run, "bench-old-new\told and new\tskipped\t\t0\tno baseline carried: .deps/baseline/bin/"
               "fastformer-bench missing\t\t120")
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    md = out.read_text()
    assert "Not run: skipped: no baseline carried" in section(md, "Old and new in one run")
    row = " | ".join(target_row(md, "new ÷ old (the baseline commit), base-long bf16, one 65,536-token sequence"))
    assert "not measured: skipped: no baseline carried" in row


def test_report_opt_in_kernels_and_which_may_become_the_default(tmp_path):
    """Per opt-in: parity, and tokens/s against the default's mean (hand-worked from the fixture:
    512-token sequences, default (2.50 + 2.52) / 2 = 2.51 M; all 2.60 / 2.51 = 1.04x; cutlass-gelu
    2.59 / 2.51 = 1.03x; fused-key-pool 2.51 / 2.51 = 1.00x. One 65,536-token sequence, default
    2.41 M; all 2.55 / 2.41 = 1.06x; cutlass-gelu 2.46 / 2.41 = 1.02x; fused-key-pool 2.50 / 2.41 =
    1.04x; gemm-timing 2.50 / 2.51 = 1.00x and 2.41 / 2.41 = 1.00x): cutlass-gelu may become the
    default, fused-key-pool is not faster on 512-token sequences, gemm-timing on neither."""
    run = ab_run(tmp_path)
    out, summary = tmp_path / "r.md", tmp_path / "s.txt"
    assert report.main(["--run", str(run), "--out", str(out), "--summary", str(summary)]) == 0
    md = out.read_text()
    opt = section(md, "Opt-in kernels")
    rows = {ln.split("|")[1].strip(): ln for ln in opt.splitlines() if ln.startswith("| ") and "---" not in ln}
    assert "parity passed (ctest -L gpu 9/9, base-long 3/3)" in rows["all"]
    assert "2.60 M tokens/s vs 2.51 M default (1.04x)" in rows["all"] and "2.55 M tokens/s vs 2.41 M default (1.06x)" in rows["all"]
    assert "2.59 M tokens/s vs 2.51 M default (1.03x)" in rows["cutlass-gelu"]
    assert "2.46 M tokens/s vs 2.41 M default (1.02x)" in rows["cutlass-gelu"]
    assert rows["cutlass-gelu"].rstrip(" |").endswith("**yes**: parity passed, faster on every shape")
    assert "2.51 M tokens/s vs 2.51 M default (1.00x)" in rows["fused-key-pool"]
    assert "2.50 M tokens/s vs 2.41 M default (1.04x)" in rows["fused-key-pool"]
    assert "no: not faster on every shape (≥ 1.01x)" in rows["fused-key-pool"]
    assert "2.50 M tokens/s vs 2.51 M default (1.00x)" in rows["gemm-timing"]
    assert "no: not faster on every shape" in rows["gemm-timing"]
    # What the engine said it ran (its device line): the set for all, the kernel alone for each.
    assert "| cutlass-gelu, fused-key-pool, gemm-timing |" in rows["all"]
    assert "| cutlass-gelu |" in rows["cutlass-gelu"]
    assert "May become the default (parity passed, faster on every shape): cutlass-gelu." in opt
    assert "CUTLASS 4.2.0.0 headers: carried" in opt
    assert header_line(md, "build") == ("- build: CUTLASS 4.2.0.0 headers: carried (`/repo/.deps/cutlass/include`, "
                                        "-DFASTFORMER_CUTLASS_DIR)")
    targets = section(md, "Targets")
    assert "| parity with the CPU engine, all dtypes (ctest -L gpu, base-long apart), FASTFORMER_CUDA_OPT_IN=all " \
           "| all gpu tests pass | 9/9 passed | PASS |" in targets
    assert "opt-in: May become the default (parity passed, faster on every shape): cutlass-gelu." in summary.read_text()


def test_report_opt_in_parity_failed_keeps_every_kernel_opt_in(tmp_path):
    run = ab_run(tmp_path, parity_file="parity-base-long-opt-in-failed.out", cutlass="")
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    md = out.read_text()
    opt = section(md, "Opt-in kernels")
    rows = {ln.split("|")[1].strip(): ln for ln in opt.splitlines() if ln.startswith("| ") and "---" not in ln}
    assert "parity failed (ctest -L gpu 9/9, base-long 2/3 (failed: exit 1))" in rows["all"]
    for name in ("cutlass-gelu", "fused-key-pool", "gemm-timing"):
        assert "parity failed with all" in rows[name] and "no: parity failed" in rows[name], rows[name]
    assert ("No opt-in kernel may become the default yet: cutlass-gelu: parity failed; fused-key-pool: parity failed; "
            "gemm-timing: parity failed.") in opt
    row = " | ".join(target_row(md, "base-long-shaped parity (768 hidden, 12 heads, 3,072, two layers; each dtype vs "
                                    "the CPU engine), FASTFORMER_CUDA_OPT_IN=all"))
    assert "2/3 passed, 1 failed" in row and "FAIL" in row
    assert header_line(md, "build").startswith("- build: CUTLASS headers absent: the CUTLASS kernel is not built (no CUTLASS")


def test_report_an_opt_in_kernel_the_engine_did_not_run_is_not_measured(tmp_path):
    """cutlass-gelu asked for on a build without CUTLASS: the engine says "cutlass-gelu off: ..."
    in its device line, and the kernel may not become the default whatever its figures."""
    run = ab_run(tmp_path)
    doc = json.loads((run / "bench-opt-in.json").read_text())
    for r in doc["runs"]:
        if r["arm"] == "cutlass-gelu":
            r["result"]["device"] = "NVIDIA H200 (device 0, bfloat16, opt-in cutlass-gelu off: this build has no CUTLASS kernels)"
    (run / "bench-opt-in.json").write_text(json.dumps(doc))
    out = tmp_path / "r.md"
    assert report.main(["--run", str(run), "--out", str(out)]) == 0
    opt = section(out.read_text(), "Opt-in kernels")
    row = [ln for ln in opt.splitlines() if ln.startswith("| cutlass-gelu |")][0]
    assert "no: it did not run (cutlass-gelu off: this build has no CUTLASS kernels)" in row
    assert "No opt-in kernel may become the default yet" in opt


def fake_bench(path, tps, log):
    """A fastformer-bench that appends its arguments to LOG and prints TPS (or fails with 0)."""
    body = (f'echo "$*" >>{log}\n' + ('echo "no usable CUDA driver or device" >&2; exit 1\n' if not tps else
                                      f'echo \'{{"tokens_per_second": {tps}, "backend": "cuda"}}\'\n'))
    return write_script(path, "#!/bin/sh\n" + body)


def test_bench_ab_alternates_the_arms_and_writes_every_run(tmp_path):
    log = tmp_path / "calls.txt"
    old = fake_bench(tmp_path / "old" / "fastformer-bench", 1.0e6, log)
    new = fake_bench(tmp_path / "new" / "fastformer-bench", 1.3e6, log)
    out = tmp_path / "ab.json"
    p = subprocess.run([PYTHON, str(HERE / "bench_ab.py"), "--out", str(out), "--log-dir", str(tmp_path / "logs"),
                        "--seconds", "0.5", "--lengths", "fixed:512", "--lengths", "fixed:65536",
                        "--common", "--model-dir /m --backend cuda --json",
                        "--arm", "old", str(old), "/old/lib", "", "2", "--arm", "new", str(new), "/new/lib", "--x 1", "2",
                        "--meta", "old_commit=abc"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] and doc["meta"] == {"old_commit": "abc"}
    assert [(r["lengths"], r["arm"], r["round"]) for r in doc["runs"]] == [
        (L, a, r) for L in ("fixed:512", "fixed:65536") for r in (1, 2) for a in ("old", "new")]
    calls = log.read_text().splitlines()
    assert calls[0] == "--model-dir /m --backend cuda --json --lengths fixed:512 --seconds 0.5"
    assert calls[1].endswith("--seconds 0.5 --x 1")
    figures = report.ab_figures(doc)
    assert figures["fixed:65536"]["new"]["mean"] == 1.3e6 and len(figures["fixed:512"]["old"]["runs"]) == 2


def test_bench_ab_a_failing_arm_fails_the_stage_and_says_why(tmp_path):
    log = tmp_path / "calls.txt"
    old = fake_bench(tmp_path / "old" / "fastformer-bench", 0, log)
    new = fake_bench(tmp_path / "new" / "fastformer-bench", 1.3e6, log)
    out = tmp_path / "ab.json"
    p = subprocess.run([PYTHON, str(HERE / "bench_ab.py"), "--out", str(out), "--seconds", "0.1",
                        "--lengths", "fixed:512", "--arm", "old", str(old), "", "", "1",
                        "--arm", "new", str(new), "", "", "1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    doc = json.loads(out.read_text())
    assert doc["runs"][0]["error"] == "exit 1: no usable CUDA driver or device"
    (tmp_path / "run").mkdir()
    shutil.copy(out, tmp_path / "run" / "bench-old-new.json")
    (tmp_path / "run" / "meta.env").write_text("mode=gpu\n")
    c = report.CheckRun(str(tmp_path / "run"))
    row = report.old_new_rows(c)[0]
    assert row[1].startswith("— (exit 1: no usable CUDA driver") and row[-1].startswith("not measured: no old figure")


def stage_table(md):
    """The Stages table's rows in order, each a dict of its columns."""
    section = md.split("## Stages")[1].split("\n## ")[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")]
    def cells(ln):  # a cell may hold an escaped pipe
        return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", ln.strip()[1:-1])]
    header = cells(lines[0])
    return [dict(zip(header, cells(ln))) for ln in lines[1:] if not ln.startswith("| ---")]


def stage_order(md):
    return [r["stage"] for r in stage_table(md) if not r["stage"].startswith(("model", "wait-models"))]


def header_line(md, key):
    return [ln for ln in md.split("## Targets")[0].splitlines() if ln.startswith(f"- {key}: ")][0]


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
    for sid in ("nvidia-smi", "ctest-gpu", "memcheck", "racecheck", "copy-bandwidth", "server-parity", "server-load",
                "memcheck-base-long", "racecheck-base-long", "ours-bl-bf16-fixed512", "torch-eager", "sdpa-8192",
                "ncu", "ctest-gpu-opt-in", "parity-base-long-opt-in", "bench-old-new", "bench-opt-in"):
        line = [ln for ln in stages.splitlines() if ln.startswith(f"| {sid} |")]
        assert line and "| skipped |" in line[0] and "no GPU" in line[0], sid
    assert stage_order(md) == STAGE_ORDER
    # torch.compile left the default check (issue 48): skipped, saying how to bring it back.
    compile_row = [ln for ln in stages.splitlines() if ln.startswith("| torch-compile |")][0]
    assert "| skipped |" in compile_row and "GPU_CHECK_TORCH_COMPILE=1" in compile_row
    assert header_line(md, "driver").startswith("- driver: **not found** (no GPU")
    assert header_line(md, "nvcc")  # whichever this machine has, or **not found** with where it looked


def write_script(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def path_without(name):
    """os.environ's PATH less every directory that holds an executable NAME (nvcc is in
    /usr/local/cuda/bin here)."""
    dirs = [d for d in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if d and not os.access(os.path.join(d, name), os.X_OK)]
    return os.pathsep.join(dirs)


def fake_gpu_machine(tmp_path, smi_sleeps=False, nvcc=True):
    """A PATH whose nvidia-smi claims an H200 (and with smi_sleeps, hangs when asked for its
    table), a fake nvcc (CUDACXX; none with nvcc=False, and no nvcc on PATH) so that the build
    stages get as far as cuBLASLt, and the environment of a run that finds no cuBLASLt and no
    PyTorch, with its work under tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   'case "$1" in\n'
                   '  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-fake)" ;;\n'
                   '  --query-gpu*) echo "name, driver_version"; echo "NVIDIA H200, 580.00" ;;\n'
                   + ('  *) exec sleep 600 ;;\n' if smi_sleeps else '  *) echo "fake nvidia-smi: NVIDIA H200" ;;\n')
                   + "esac\n")
    smi.chmod(0o755)
    empty = tmp_path / "nothing-here"
    empty.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
               GPU_CHECK_WORK=str(tmp_path / "work"), GPU_CHECK_BUILD_DIR=str(tmp_path / "build"),
               GPU_CHECK_CUDA_ROOTS=str(empty), GPU_CHECK_SITE_PACKAGES=str(empty), GPU_CHECK_PYTHON="none")
    for k in ("OUT", "FASTFORMER_CUBLASLT_INCLUDE_DIR", "FASTFORMER_CUBLASLT_LIBRARY", "CUDACXX", "CUDA_HOME",
              "CUDA_PATH", "GPU_CHECK_STOP_AFTER", "GPU_CHECK_CMAKE_ARGS", "GPU_CHECK_BUDGET_S",
              "GPU_CHECK_NCU_EXCLUDE", "GPU_CHECK_BUILD", "GPU_CHECK_CPU_SMOKE", "GPU_CHECK_TORCH_COMPILE",
              "GPU_CHECK_AB_SECONDS", "GPU_CHECK_OPT_INS"):
        env.pop(k, None)
    if nvcc:
        env["CUDACXX"] = str(write_script(bin_dir / "nvcc",
                                          '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.88"\n'))
    else:
        env["PATH"] = f"{bin_dir}:{path_without('nvcc')}"
    return env, empty


def fake_torch_machine(tmp_path, env):
    """On top of fake_gpu_machine: a fake python that "imports torch" and prints a benchmark's
    JSON, the two models already made (reused), a fastformer-bench in the build dir that knows
    --profile and --cuda-opt-in (the build itself is skipped: no cuBLASLt), an ncu that records its
    arguments and profiles nothing, and torch.compile asked for (GPU_CHECK_TORCH_COMPILE=1)."""
    py = write_script(tmp_path / "fake-python", '#!/bin/sh\n'
                      'case "$1" in\n'
                      '  -c) exit 0 ;;\n'
                      '  *copy_bandwidth.py) echo \'{"device": "cuda", "bytes": 1073741824, "repeats": 20, '
                      '"bandwidth_bytes_per_second": 4.0e12}\' ;;\n'
                      '  *) echo \'{"tokens_per_second": 1000000.0, "batches": 3}\' ;;\n'
                      'esac\n')
    for preset in ("base-long", "official"):
        d = tmp_path / "work" / "models" / preset
        d.mkdir(parents=True)
        (d / "model.safetensors").write_text("fake\n")
        (d / ".gpu-check-ok").write_text("")
    (tmp_path / "work" / "models" / "official" / "tokenizer.json").write_text("{}\n")  # the text path's
    write_script(tmp_path / "build" / "bin" / "fastformer-bench", '#!/bin/sh\n'
                 'case "$*" in *--help*) echo "  --profile  time every op"; echo "  --cuda-opt-in LIST"; exit 0 ;; esac\n'
                 'echo \'{"tokens_per_second": 2000000.0, "backend": "cuda", "batches": 5}\'\n')
    write_script(tmp_path / "bin" / "ncu",  # records its arguments, profiles nothing
                 f'#!/bin/sh\nfor a in "$@"; do echo "$a"; done >{tmp_path / "ncu-args.txt"}\n')
    return dict(env, GPU_CHECK_PYTHON=str(py), GPU_CHECK_TORCH_COMPILE="1")


def stage_rows(md):
    stages = md.split("## Stages")[1].split("\n## ")[0]
    return {ln.split("|")[1].strip(): ln for ln in stages.splitlines() if ln.startswith("| ") and "---" not in ln}


def run_check(env, report_path, budget):
    env = dict(env, GPU_CHECK_BUDGET_S=str(budget))
    t = time.monotonic()
    p = subprocess.run(["bash", str(HERE / "gpu-check.sh"), str(report_path)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=budget + 60)
    return p, time.monotonic() - t


def test_gpu_check_with_a_gpu_and_no_cublaslt_says_where_it_looked(tmp_path):
    env, empty = fake_gpu_machine(tmp_path)
    rep = tmp_path / "report.md"
    p, seconds = run_check(env, rep, budget=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert seconds < 60
    md = rep.read_text()
    assert "mode: **gpu**" in md and "GPU: NVIDIA H200" in md
    assert "cuBLASLt: header **not found**; library **not found**" in md
    assert header_line(md, "nvcc") == f"- nvcc: {tmp_path}/bin/nvcc (release 13.0, V13.0.88, CUDACXX)"
    assert header_line(md, "driver") == "- driver: 580.00 (nvidia-smi)"
    section = md.split("## cuBLASLt")[1].split("\n## ")[0]
    assert "cublasLt.h **not found**" in section and "libcublasLt **not found**" in section
    # Where it looked: the toolkit root's include and lib dirs, the wheels' nvidia/cu13 and nvidia/cublas.
    for d in ("include", "targets/x86_64-linux/include", "nvidia/cu13/include", "nvidia/cublas/include"):
        assert f"`{empty}/{d}`" in section, d
    for d in ("lib64", "lib", "nvidia/cu13/lib", "nvidia/cublas/lib"):
        assert f"`{empty}/{d}`" in section, d
    rows = stage_rows(md)
    assert "| failed |" in rows["cublaslt"] and "cuBLASLt not found" in rows["cublaslt"]
    for sid in ("configure", "build", "ctest-gpu", "parity-base-long", "memcheck", "racecheck"):
        assert "| skipped |" in rows[sid] and "no cublasLt.h found" in rows[sid], sid
    for sid in ("ours-bl-bf16-fixed512", "prof-bl-bf16-fixed65536", "torch-eager", "sdpa-8192", "bench-opt-in"):
        assert "| skipped |" in rows[sid] and "GPU_CHECK_PYTHON=none" in rows[sid], sid
    assert "| skipped |" in rows["torch-compile"] and "GPU_CHECK_TORCH_COMPILE=1" in rows["torch-compile"]
    assert "| ok |" in rows["nvidia-smi"]
    meta = report.load_meta(str(next((tmp_path / "work").glob("run-*"))))
    assert meta["mode"] == "gpu" and int(meta["elapsed_s"]) <= 60
    assert "cuBLASLt: header not found; library not found" in p.stdout  # the summary, in the output tail


def test_gpu_check_ends_with_a_report_within_its_budget(tmp_path):
    """A stage that hangs is stopped where the budget ends (less the report's reserve), every
    later stage is skipped as out of time, and the report is still written in time. The
    cuBLASLt given by the environment is taken as it is, and one that cannot load says so."""
    env, _ = fake_gpu_machine(tmp_path, smi_sleeps=True)
    inc = tmp_path / "cublas" / "include"
    inc.mkdir(parents=True)
    (inc / "cublasLt.h").write_text("/* fake */\n")
    (inc / "cublas_api.h").write_text("#define CUBLAS_VER_MAJOR 13\n#define CUBLAS_VER_MINOR 9\n"
                                      "#define CUBLAS_VER_PATCH 7\n")
    lib = tmp_path / "cublas" / "libcublasLt.so.13"
    lib.write_text("not a library\n")
    env.update(FASTFORMER_CUBLASLT_INCLUDE_DIR=str(inc), FASTFORMER_CUBLASLT_LIBRARY=str(lib))
    rep = tmp_path / "report.md"
    budget = 20
    p, seconds = run_check(env, rep, budget)
    assert p.returncode == 0, p.stdout + p.stderr
    assert seconds <= budget, p.stdout
    md = rep.read_text()
    rows = stage_rows(md)
    assert "| timeout |" in rows["nvidia-smi"], rows["nvidia-smi"]
    if shutil.which("cmake"):
        assert "| skipped |" in rows["configure"] and "time budget spent (GPU_CHECK_BUDGET_S=20)" in rows["configure"]
        assert "configure did not succeed" in rows["build"]
    assert f"header {inc} (13.9.7" in md
    assert "| failed |" in rows["cublaslt"] and "cannot load" in rows["cublaslt"]


def test_gpu_check_stage_order_caps_and_every_wall_time(tmp_path):
    """The stages in issue 21's order, each with its wall time, start and limit in the report;
    the engine benchmarks capped at 12 s, ncu 40, torch.compile 180."""
    env, _ = fake_gpu_machine(tmp_path)
    env = fake_torch_machine(tmp_path, env)
    rep = tmp_path / "report.md"
    p, seconds = run_check(env, rep, budget=420)
    assert p.returncode == 0, p.stdout + p.stderr
    assert seconds < 60, p.stdout
    md = rep.read_text()
    assert stage_order(md) == STAGE_ORDER
    table = {r["stage"]: r for r in stage_table(md)}
    for r in table.values():
        assert r["seconds"].isdigit() and r["at (s)"].isdigit(), r
    for sid in ("copy-bandwidth", "ours-bl-bf16-fixed512", "prof-bl-bf16-fixed65536", "ours-bl-bf16-fixed8192",
                "torch-eager", "sdpa-8192", "sdpa-512", "torch-compile"):
        assert table[sid]["status"] == "ok", table[sid]
    assert table["ours-bl-bf16-fixed512"]["limit (s)"] == "12"
    assert table["prof-bl-bf16-fixed512"]["limit (s)"] == "12" and "--profile" in table["prof-bl-bf16-fixed512"]["what"]
    assert table["ncu"]["limit (s)"] == "40" and "official bf16 fixed:512" in table["ncu"]["what"]
    assert "our kernels: from_float and cuBLAS's excluded" in table["ncu"]["what"]
    # ncu collects the metrics report.py reads: DRAM bytes and the L2 write sectors (issue 47).
    args = (tmp_path / "ncu-args.txt").read_text().splitlines()
    assert args[args.index("--metrics") + 1].split(",") == list(report.NCU_METRICS)
    assert args[args.index("--print-units") + 1] == "base" and "--csv" in args
    # The server's stages and base-long's sanitizer stages. The server stages run the carried
    # server of this checkout's .deps/server: none in a fresh clone (skipped, saying so); after a
    # developer's deploy/carry-gpu-deps.sh --server they run (here with the fake python), capped.
    carried = (ROOT / ".deps" / "server" / "bin" / "fastformer-server").exists()
    for sid, cap in (("server-parity", "60"), ("server-load", "75")):
        if carried:
            assert table[sid]["status"] != "skipped" and table[sid]["limit (s)"] == cap, table[sid]
        else:
            assert table[sid]["status"] == "skipped" and "no carried server" in table[sid]["note"], table[sid]
    for sid in ("memcheck-base-long", "racecheck-base-long"):
        assert table[sid]["status"] == "skipped" and "--gtest_filter=*BaseLong*" in table[sid]["what"], table[sid]
    # Issue 48: the opt-in parity stages wait for a build (none here); bench-opt-in alternates the
    # build dir's fastformer-bench (which lists --cuda-opt-in) with and without it: 6 runs a shape
    # (default, all, cutlass-gelu, fused-key-pool, gemm-timing, default), each 2 s plus 4 of
    # start-up.
    for sid in ("ctest-gpu-opt-in", "parity-base-long-opt-in"):
        assert table[sid]["status"] == "skipped" and "FASTFORMER_CUDA_OPT_IN=all" in table[sid]["what"], table[sid]
    assert table["bench-opt-in"]["status"] == "ok" and table["bench-opt-in"]["limit (s)"] == str(6 * 2 * 6), \
        table["bench-opt-in"]
    run = next((tmp_path / "work").glob("run-*"))
    runs = json.loads((run / "bench-opt-in.json").read_text())["runs"]
    assert [(r["lengths"], r["arm"]) for r in runs][:6] == [("fixed:512", a) for a in (
        "default", "all", "cutlass-gelu", "fused-key-pool", "gemm-timing", "default")]
    assert runs[1]["command"].endswith("--cuda-opt-in all") and len(runs) == 12
    # bench-old-new runs the carried baseline of this checkout's .deps: none in a fresh clone.
    if (ROOT / ".deps" / "baseline" / "bin" / "fastformer-bench").exists():
        assert table["bench-old-new"]["status"] != "skipped" and table["bench-old-new"]["limit (s)"] == "48", \
            table["bench-old-new"]
    else:
        assert table["bench-old-new"]["status"] == "skipped" and "no baseline carried" in table["bench-old-new"]["note"]
    assert "--gtest_filter=*Small*" in table["memcheck"]["what"]
    assert table["torch-eager"]["limit (s)"] == "30" and table["sdpa-8192"]["limit (s)"] == "20"
    assert table["torch-compile"]["limit (s)"] == "180"
    assert table["model-base-long"]["note"].startswith("reused") and table["model-official"]["status"] == "ok"
    assert table["memcheck"]["status"] == "skipped" and "CUDA_MODULE_LOADING=LAZY" in table["memcheck"]["what"]
    # racecheck runs every kernel without lazy loading (the 2026-12-04 lease: the exclusion and
    # lazy loading made the sanitizer fail on a hardware exception).
    assert table["racecheck"]["status"] == "skipped" and "every kernel" in table["racecheck"]["what"]
    assert "LAZY" not in table["racecheck"]["what"]
    # Starts in order, each after the one before it ended.
    ats = [int(table[sid]["at (s)"]) for sid in STAGE_ORDER[1:]]
    assert ats == sorted(ats)
    assert header_line(md, "time").startswith("- time: ")
    assert "time: " in p.stdout and "probes " in p.stdout  # the summary gives the stages' times too


def test_gpu_check_skips_torch_compile_when_the_budget_is_spent(tmp_path):
    """torch.compile runs last and needs 30 of its 180 s: with less left it is skipped, with
    the reason, and the stages before it still ran."""
    env, _ = fake_gpu_machine(tmp_path)
    env = fake_torch_machine(tmp_path, env)
    rep = tmp_path / "report.md"
    budget = 39  # 29 s for the stages, the report's 10 s apart
    p, seconds = run_check(env, rep, budget)
    assert p.returncode == 0, p.stdout + p.stderr
    assert seconds <= budget, p.stdout
    table = {r["stage"]: r for r in stage_table(rep.read_text())}
    compile_row = table["torch-compile"]
    assert compile_row["status"] == "skipped", compile_row
    assert compile_row["note"].startswith(f"time budget spent (GPU_CHECK_BUDGET_S={budget})"), compile_row
    assert "needs at least 30 s of its 180 s cap" in compile_row["note"]
    for sid in ("torch-eager", "sdpa-8192", "sdpa-512"):
        assert table[sid]["status"] == "ok" and int(table[sid]["limit (s)"]) <= 29, table[sid]


@pytest.mark.parametrize("wheel", ["nvidia/cu13/bin", "nvidia/cuda_nvcc/bin"])
def test_gpu_check_finds_nvcc_in_the_wheels(tmp_path, wheel):
    """No nvcc on PATH, no CUDACXX, no toolkit root: the nvcc of a wheel in site-packages, named
    in the report's header with its version; GPU_CHECK_STOP_AFTER ends the run after a stage."""
    env, _ = fake_gpu_machine(tmp_path, nvcc=False)
    site = tmp_path / "site-packages"
    nvcc = write_script(site / wheel / "nvcc", '#!/bin/sh\necho "Cuda compilation tools, release 13.0, V13.0.48"\n')
    env.update(GPU_CHECK_SITE_PACKAGES=str(site), GPU_CHECK_STOP_AFTER="nvidia-smi")
    assert shutil.which("nvcc", path=env["PATH"]) is None
    rep = tmp_path / "report.md"
    p, seconds = run_check(env, rep, budget=60)
    assert p.returncode == 0, p.stdout + p.stderr
    md = rep.read_text()
    assert header_line(md, "nvcc") == f"- nvcc: {nvcc} (release 13.0, V13.0.48, Python wheel)"
    assert header_line(md, "driver") == "- driver: 580.00 (nvidia-smi)"
    assert "**stopped after stage nvidia-smi** (GPU_CHECK_STOP_AFTER)" in md
    assert [r["stage"] for r in stage_table(md)] == ["cublaslt", "probes", "nvidia-smi"]
    # The wheel's cuBLAS dirs are searched too.
    section = md.split("## cuBLASLt")[1].split("\n## ")[0]
    assert f"`{site}/nvidia/cu13/include`" in section
    assert "nvcc: " + str(nvcc) in p.stdout


def test_gpu_check_without_any_nvcc_says_where_it_looked(tmp_path):
    env, empty = fake_gpu_machine(tmp_path, nvcc=False)
    env.update(GPU_CHECK_STOP_AFTER="deps")
    inc = tmp_path / "cublas" / "include"
    inc.mkdir(parents=True)
    (inc / "cublasLt.h").write_text("/* fake */\n")
    env.update(FASTFORMER_CUBLASLT_INCLUDE_DIR=str(inc))
    rep = tmp_path / "report.md"
    p, _ = run_check(env, rep, budget=60)
    assert p.returncode == 0, p.stdout + p.stderr
    md = rep.read_text()
    line = header_line(md, "nvcc")
    assert line.startswith("- nvcc: **not found** (looked at ") and f"{empty}/bin/nvcc" in line
    assert f"{empty}/nvidia/cu13/bin/nvcc" in line
    assert [r["stage"] for r in stage_table(md)][-1] == "deps"


def test_gpu_check_stop_after_build_with_extra_cmake_args(tmp_path):
    """GPU_CHECK_CMAKE_ARGS is appended to the configure line, one argument per word;
    GPU_CHECK_STOP_AFTER=build writes the report after the build (carry-gpu-deps.sh --check)."""
    env, _ = fake_gpu_machine(tmp_path)
    calls = tmp_path / "cmake-calls.txt"
    write_script(tmp_path / "bin" / "cmake", '#!/bin/sh\n'
                 'if [ "$1" = --version ]; then echo "cmake version 3.25.1"; exit 0; fi\n'
                 f'for a in "$@"; do echo "$a"; done >>{calls}\n'
                 f'echo ---- >>{calls}\n')
    inc = tmp_path / "cublas" / "include"
    inc.mkdir(parents=True)
    (inc / "cublasLt.h").write_text("/* fake */\n")
    env.update(FASTFORMER_CUBLASLT_INCLUDE_DIR=str(inc), GPU_CHECK_STOP_AFTER="build",
               GPU_CHECK_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr  -DFOO=bar")
    rep = tmp_path / "report.md"
    p, seconds = run_check(env, rep, budget=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert seconds < 30, p.stdout
    md = rep.read_text()
    table = stage_table(md)
    assert [r["stage"] for r in table if not r["stage"].startswith("model")] == STAGE_ORDER[:6]
    rows = {r["stage"]: r for r in table}
    assert rows["configure"]["status"] == "ok" and rows["build"]["status"] == "ok", rows
    assert "-DCMAKE_IGNORE_PREFIX_PATH=/usr -DFOO=bar" in rows["configure"]["what"]
    configure, build = calls.read_text().split("----\n")[:2]
    configure, build = configure.splitlines(), build.splitlines()
    assert configure[-2:] == ["-DCMAKE_IGNORE_PREFIX_PATH=/usr", "-DFOO=bar"]
    assert "-DFASTFORMER_CUDA=ON" in configure and "-DFASTFORMER_SERVER=OFF" in configure
    assert f"-DFASTFORMER_CUBLASLT_INCLUDE_DIR={inc}" in configure
    assert not any(a.startswith("-DFASTFORMER_TESTS") for a in configure)  # its default: ON
    # CUTLASS's headers (issue 48) when this checkout's .deps carries them (its deps stage unpacked them).
    cutlass = ROOT / ".deps" / "cutlass" / "include"
    if (cutlass / "cutlass" / "version.h").exists():
        assert f"-DFASTFORMER_CUTLASS_DIR={cutlass}" in configure
        assert re.search(r"- build: CUTLASS \d+\.\d+\.\d+\.\d+ headers: carried", md)
    else:
        assert not any(a.startswith("-DFASTFORMER_CUTLASS_DIR") for a in configure)
        assert "- build: CUTLASS headers absent: the CUTLASS kernel is not built" in md
    assert build[:2] == ["--build", str(tmp_path / "build")]
    assert build[-3:] == ["fastformer_gpu_tests", "fastformer-bench", "fastformer_cuda_engine"]
    assert "**stopped after stage build** (GPU_CHECK_STOP_AFTER)" in md
    meta = report.load_meta(str(next((tmp_path / "work").glob("run-*"))))
    assert meta["stopped"] == "1" and meta["stop_after"] == "build"


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

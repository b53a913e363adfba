"""The GPU check's dress rehearsal (issue 21): what a lent GPU machine does with its one lease,
done here first with what that machine lacks hidden, so that the next dependency that slips
into the engine fails CI, not a lease.

The lent machine has the CUDA toolkit, CMake, a compiler and PyTorch, and no Debian -dev
packages: it builds from the tree and what deploy/carry-gpu-deps.sh packs into .deps. So:

1. `deploy/carry-gpu-deps.sh` packs .deps, as a developer does before the device call.
2. `deploy/carry-gpu-deps.sh --check` copies the tree (what the device tool carries) and .deps,
   configures and builds the GPU check's targets there with gpu-check.sh's own configure line
   and the system prefix /usr hidden, and fails on any shared library those targets load from
   outside .deps, the CUDA toolkit and the C/C++ runtime.
3. `tests/gpu/gpu-check.sh` runs whole in that copy, with a fake nvidia-smi (a GPU "present")
   and GPU_CHECK_BUILD=1: its configure and build stages must pass, it must end within its
   budget with a report, and the GPU tests, which find no GPU, must fail their stage rather than
   pass as skipped.

Negative cases check the rehearsal can fail: with an ICU find_package added to the engine core
of a copy, gpu-check.sh's configure (system prefix hidden) must fail naming ICU; and with a
header of a Debian -dev package included by the engine (zlib.h: found by the compiler in
/usr/include though CMake's prefix is hidden, and linked nowhere), the gate
(`carry-gpu-deps.sh --gate`) must fail naming the package.

    make test-gpu-rehearsal     (part of make test)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / "deploy" / "carry-gpu-deps.sh"
BUDGET_S = 420  # gpu-check.sh's default budget, which the lease is planned around


def nvcc():
    for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and os.access(c, os.X_OK):
            return c
    return None


def why_not_here():
    if shutil.which("dpkg-query") is None:
        return "not a Debian/Ubuntu machine: carry-gpu-deps.sh packs Debian packages"
    if nvcc() is None:
        return "no nvcc: the rehearsal builds the CUDA engine"
    inc = Path(nvcc()).resolve().parents[1] / "include" / "cublasLt.h"
    if not inc.exists() and not Path("/usr/local/cuda/include/cublasLt.h").exists():
        return "no cublasLt.h in the CUDA toolkit"
    if shutil.which("xz") is None:
        return "no xz to pack .deps (apt-get install xz-utils)"
    return None


pytestmark = pytest.mark.skipif(why_not_here() is not None, reason=str(why_not_here()))


def stages_of(work: Path) -> dict[str, tuple[str, str, str]]:
    """The last record of each stage of the one run under `work`: id -> (status, seconds, note)."""
    runs = sorted(work.glob("run-*/stages.tsv"))
    assert len(runs) == 1, f"expected one run under {work}, found {runs}"
    out = {}
    for line in runs[0].read_text().splitlines():
        f = line.split("\t")
        if len(f) >= 6:
            out[f[0]] = (f[2], f[4], f[5])
    return out


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    """.deps packed, then the --check build in a kept copy of the tree."""
    base = tmp_path_factory.mktemp("rehearsal")
    t0 = time.monotonic()
    pack = subprocess.run(["bash", str(CARRY)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert pack.returncode == 0, pack.stdout + pack.stderr
    print(f"\ncarry-gpu-deps.sh: {time.monotonic() - t0:.0f} s")
    print("\n".join(ln for ln in pack.stdout.splitlines() if "total .deps size" in ln))
    t1 = time.monotonic()
    check = subprocess.run(["bash", str(CARRY), "--check"], cwd=ROOT, capture_output=True, text=True,
                           timeout=900, env=dict(os.environ, CARRY_CHECK_DIR=str(base)))
    print(f"carry-gpu-deps.sh --check: {time.monotonic() - t1:.0f} s")
    print(check.stdout[-3000:])
    return base, pack, check


def test_carry_check_builds_the_tree_from_deps_alone(rehearsal):
    base, pack, check = rehearsal
    assert check.returncode == 0, check.stdout[-4000:] + check.stderr[-4000:]
    assert "configure: ok" in check.stdout and "build: ok" in check.stdout, check.stdout
    assert "resolves to .deps, the CUDA toolkit or the C/C++ runtime" in check.stdout, check.stdout
    stages = stages_of(base / "work")
    assert stages["configure"][0] == "ok" and stages["build"][0] == "ok", stages
    # GPU_CHECK_STOP_AFTER=build: nothing after the build ran.
    assert "ctest-gpu" not in stages, stages
    # What the device tool carries must fit its 64 MiB (the tree and .deps together).
    line = next(ln for ln in pack.stdout.splitlines() if "total .deps size" in ln)
    total_mib = float(line.split(" MiB of the device tool")[0].rsplit(" ", 1)[1])
    assert total_mib < 64, line


def test_gpu_check_in_the_copy_passes_configure_and_build_within_its_budget(rehearsal, tmp_path):
    base, _, check = rehearsal
    assert check.returncode == 0, "the --check build failed (previous test)"
    tree = base / "tree"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   'case "$1" in\n'
                   '  -L) echo "GPU 0: NVIDIA H200 (UUID: GPU-00000000-rehearsal)" ;;\n'
                   '  --query-gpu*) echo "name, driver_version"; echo "NVIDIA H200, 580.00" ;;\n'
                   '  *) echo "fake nvidia-smi: NVIDIA H200 (rehearsal)" ;;\n'
                   "esac\n")
    smi.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    # No PyTorch stages: with no GPU they could only fail, and base-long alone is 640 MB to
    # generate (tests/gpu/test_gpu_check.py runs them on the CPU).
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}", OUT=str(out),
               GPU_CHECK_BUILD="1", GPU_CHECK_WORK=str(tmp_path / "work"), GPU_CHECK_PYTHON="none",
               GPU_CHECK_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr", GPU_CHECK_BUDGET_S=str(BUDGET_S),
               GPU_CHECK_BENCH_SECONDS="1", GPU_CHECK_COMMIT="rehearsal")
    for k in ("GPU_CHECK_STOP_AFTER", "GPU_CHECK_BUILD_DIR", "FASTFORMER_CUBLASLT_LIBRARY"):
        env.pop(k, None)
    t = time.monotonic()
    p = subprocess.run(["bash", "tests/gpu/gpu-check.sh"], cwd=tree, env=env, capture_output=True, text=True,
                       timeout=BUDGET_S + 60)
    elapsed = time.monotonic() - t
    print(f"\ngpu-check.sh with a fake GPU: {elapsed:.0f} s\n{p.stdout[-2500:]}")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert elapsed <= BUDGET_S, f"gpu-check.sh took {elapsed:.0f} s of its {BUDGET_S} s budget"
    report = (out / "gpu-report.md").read_text()
    assert (out / "gpu-check-logs.tar.gz").exists()
    stages = stages_of(tmp_path / "work")
    table = report.split("## Stages")[1].split("\n## ")[0]
    for sid in ("configure", "build"):
        assert stages[sid][0] == "ok", (sid, stages[sid])
        row = [ln for ln in table.splitlines() if ln.startswith(f"| {sid} |")]
        assert row and "| ok |" in row[0], (sid, row)
    assert "rehearsal (GPU_CHECK_COMMIT)" in report, "the report names the commit it ran"
    # The GPU tests built and ran, found no usable GPU and skipped: with a GPU "present" that
    # fails their stage (a skip is never a pass).
    status, _, note = stages["ctest-gpu"]
    assert status == "failed", stages["ctest-gpu"]
    assert "skipped" in note, note


def test_an_icu_dependency_in_the_engine_core_fails_the_rehearsal_at_configure(rehearsal, tmp_path):
    base, _, check = rehearsal
    assert check.returncode == 0, "the --check build failed (first test)"
    tree = tmp_path / "tree"
    # A copy of the copy (no build dirs), with the engine core asking for ICU as the tokenizer
    # once did.
    shutil.copytree(base / "tree", tree, symlinks=True, ignore=shutil.ignore_patterns("build-gpu"))
    cml = tree / "server" / "engine" / "CMakeLists.txt"
    cml.write_text(cml.read_text() + "\nfind_package(ICU REQUIRED COMPONENTS uc)\n"
                   "target_link_libraries(fastformer_engine_core PUBLIC ICU::uc)\n")
    env = dict(os.environ, GPU_CHECK_BUILD="1", GPU_CHECK_STOP_AFTER="build", GPU_CHECK_PYTHON="none",
               GPU_CHECK_WORK=str(tmp_path / "work"), GPU_CHECK_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr")
    subprocess.run(["bash", "tests/gpu/gpu-check.sh", str(tmp_path / "report.md")], cwd=tree, env=env,
                   capture_output=True, text=True, timeout=300)  # the stages it records are checked
    stages = stages_of(tmp_path / "work")
    assert stages["configure"][0] == "failed", stages
    run = next((tmp_path / "work").glob("run-*"))
    log = (run / "configure.out").read_text() + (run / "configure.err").read_text()
    assert "ICU" in log, log[-2000:]
    assert stages.get("build", ("skipped",))[0] == "skipped", stages


def test_a_system_header_in_the_engine_fails_the_gate(rehearsal):
    """Runs last: it changes the kept copy. A header-only use of a -dev package (zlib.h) builds
    here, links nothing (ldd sees no difference) and would not build on the GPU machine."""
    base, _, check = rehearsal
    assert check.returncode == 0, "the --check build failed (first test)"
    tree = base / "tree"
    src = tree / "server" / "engine" / "forward.cc"
    src.write_text("#include <zlib.h>  // rehearsal: a header of zlib1g-dev\n" + src.read_text())
    build = subprocess.run(["cmake", "--build", "build-gpu", "--target", "fastformer-bench", "fastformer_gpu_tests",
                            "fastformer_cuda_engine"], cwd=tree, capture_output=True, text=True, timeout=600,
                           env=dict(os.environ, LD_LIBRARY_PATH=str(tree / ".deps" / "lib")))
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    gate = subprocess.run(["bash", str(CARRY), "--gate", str(tree / "build-gpu"), str(tree / ".deps")],
                          capture_output=True, text=True, timeout=120)
    assert gate.returncode != 0, gate.stdout + gate.stderr
    assert "/usr/include/zlib.h, of zlib1g-dev" in gate.stderr, gate.stderr
    assert "loads" not in gate.stderr, gate.stderr  # header only: the libraries still pass

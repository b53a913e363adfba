"""tools/torch_blas.py (issue 21, item 7): which BLAS PyTorch runs on, and the warning when it is
netlib's reference BLAS, OpenBLAS on a core below the CPU's, or slow; tools/train_demo_model.py's
progress lines.

The real checks run in this process (the conftest preset OPENBLAS_CORETYPE before torch loaded)
and in child processes: one with the reference BLAS put first by LD_LIBRARY_PATH, one with the
preset, one with OPENBLAS_CORETYPE set by the user. The verdict's rules are checked with the maps
text, core name, CPU flags and speed passed in.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

import torch_blas as tb
import train_demo_model as tdm

AVX512 = {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
AVX2 = {"avx", "avx2", "fma"}
OPENBLAS_MAPS = ("7f1c2a000000-7f1c2a400000 r-xp 00000000 08:01 1234  "
                 "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so\n")
REFERENCE_MAPS = ("7f1c2a000000-7f1c2a040000 r-xp 00000000 08:01 1234  "
                  "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0\n"
                  "7f1c2b000000-7f1c2b400000 r-xp 00000000 08:01 1235  "
                  "/usr/lib/x86_64-linux-gnu/lapack/liblapack.so.3.11.0\n")
DEBIAN_TORCH = os.path.isdir("/usr/lib/python3/dist-packages/torch")
REFERENCE_DIR = "/usr/lib/x86_64-linux-gnu/blas"

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch_blas
note = torch_blas.preset_openblas_coretype() if sys.argv[2] == "preset" else None
import torch
r = torch_blas.check()
print(json.dumps({"note": note, "kind": r.kind, "library": r.library, "corename": r.corename,
                  "gflops": r.gflops, "warning": r.warning, "verdict": r.verdict}))
"""


def run_child(golden, mode, **env_changes):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "LD_LIBRARY_PATH")}
    env.update(env_changes)
    r = subprocess.run([golden.PYTHON, "-c", _CHILD, str(golden.TOOLS), mode], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_check_names_the_library_torch_loaded():
    import torch  # noqa: F401
    r = tb.check()
    with open("/proc/self/maps") as f:
        maps = f.read()
    if DEBIAN_TORCH:  # pip's torch links its BLAS (MKL) in: no BLAS library of its own is mapped
        assert r.library and r.library in maps and os.path.exists(r.library), r
    assert r.gflops > 0.5, r
    assert r.verdict.startswith("torch BLAS: ") and f"{r.gflops:.1f} GFLOP/s" in r.verdict
    if DEBIAN_TORCH:  # Debian's python3-torch runs on libblas.so.3: install-deps makes it OpenBLAS
        assert r.kind == "openblas", (f"{r.verdict}: deploy/install-deps.sh installs "
                                      f"libopenblas0-pthread and points libblas.so.3 at it")
        assert "OpenBLAS" in r.verdict and r.library in r.verdict


def test_this_process_runs_openblas_on_the_cpus_kernels():
    """The conftest's preset worked: OpenBLAS here runs no core below what the CPU can run."""
    r = tb.check(gflops=100.0)
    if r.kind != "openblas":
        pytest.skip(f"torch does not run on OpenBLAS here: {r.verdict}")
    asked = os.environ.get("OPENBLAS_CORETYPE")
    if asked and tb.recommended_coretype(asked, tb.cpu_flags()):  # the preset never asks for less
        pytest.skip(f"OPENBLAS_CORETYPE={asked} was set by hand (the warning says what to set)")
    assert r.corename, r
    assert tb.recommended_coretype(r.corename, tb.cpu_flags()) is None, (
        f"{r.verdict}: OpenBLAS runs {r.corename} on a CPU that runs "
        f"{tb.recommended_coretype(r.corename, tb.cpu_flags())}")


@pytest.mark.skipif(not os.path.exists(os.path.join(REFERENCE_DIR, "libblas.so.3")),
                    reason="netlib's reference BLAS (libblas3) is not installed")
def test_reference_blas_in_a_real_process_is_named_with_the_fix(golden):
    c = run_child(golden, "plain", LD_LIBRARY_PATH=f"{REFERENCE_DIR}:/usr/lib/x86_64-linux-gnu/lapack")
    assert c["kind"] == "reference" and c["library"].startswith(REFERENCE_DIR + "/"), c
    assert c["warning"] and tb.INSTALL_HINT in c["warning"], c
    assert "netlib reference BLAS" in c["verdict"] and c["verdict"].endswith("SLOW"), c
    assert c["gflops"] < tb.DEFAULT_THRESHOLD_GFLOPS, c  # measured: ~2-6 GFLOP/s


def test_preset_in_a_fresh_process(golden):
    plain = run_child(golden, "plain")
    preset = run_child(golden, "preset")
    if preset["kind"] != "openblas":
        pytest.skip(f"torch does not run on OpenBLAS here: {preset['verdict']}")
    flags = tb.cpu_flags()
    assert tb.recommended_coretype(preset["corename"], flags) is None, preset
    want = tb.recommended_coretype(plain["corename"], flags)
    if want:  # this OpenBLAS does not know the CPU (Debian 12 on Sapphire Rapids: Prescott)
        assert plain["warning"] and f"OPENBLAS_CORETYPE={want}" in plain["warning"], plain
        assert preset["note"] and f"OPENBLAS_CORETYPE={want}" in preset["note"], preset
        assert preset["corename"].lower() == want.lower(), preset
    else:
        assert preset["note"] is None and preset["corename"] == plain["corename"], (plain, preset)


def test_preset_leaves_the_users_coretype(golden):
    c = run_child(golden, "preset", OPENBLAS_CORETYPE="Haswell")
    if c["kind"] != "openblas":
        pytest.skip(f"torch does not run on OpenBLAS here: {c['verdict']}")
    assert c["note"] is None and c["corename"] == "Haswell", c
    assert "OPENBLAS_CORETYPE=Haswell" in c["verdict"], c


def test_preset_rules():
    calls = []

    def probe(core):
        def f(env):
            calls.append(core)
            return core
        return f

    env = {}
    note = tb.preset_openblas_coretype(environ=env, flags=AVX512, probe=probe("Prescott"))
    assert env == {"OPENBLAS_CORETYPE": "SkylakeX"} and "Prescott" in note and "SkylakeX" in note
    env = {}
    assert tb.preset_openblas_coretype(environ=env, flags=AVX2, probe=probe("Nehalem")) is not None
    assert env == {"OPENBLAS_CORETYPE": "Haswell"}
    for core in ("SkylakeX", "Cooperlake", None):  # a right core, or libblas.so.3 not OpenBLAS
        env = {}
        assert tb.preset_openblas_coretype(environ=env, flags=AVX512, probe=probe(core)) is None
        assert env == {}
    calls.clear()
    env = {"OPENBLAS_CORETYPE": "Prescott"}  # the user's choice: not even probed
    assert tb.preset_openblas_coretype(environ=env, flags=AVX512, probe=probe("Prescott")) is None
    assert env == {"OPENBLAS_CORETYPE": "Prescott"} and calls == []


def test_warning_rules():
    ref = tb.check(gflops=5.0, maps_text=REFERENCE_MAPS, corename=None, flags=AVX512, environ={})
    assert ref.kind == "reference" and ref.library.endswith("/blas/libblas.so.3.11.0")
    assert tb.INSTALL_HINT in ref.warning and "5.0 GFLOP/s" in ref.warning
    assert "netlib reference BLAS" in ref.verdict and ref.verdict.endswith("SLOW")
    # the reference BLAS is named whatever its speed
    assert tb.INSTALL_HINT in tb.check(gflops=50.0, maps_text=REFERENCE_MAPS, corename=None,
                                       flags=AVX512, environ={}).warning

    good = tb.check(gflops=80.0, maps_text=OPENBLAS_MAPS, corename="SkylakeX", flags=AVX512, environ={})
    assert good.kind == "openblas" and good.warning is None and good.verdict.endswith(": ok")
    assert "libopenblasp-r0.3.21.so" in good.verdict and "core SkylakeX" in good.verdict

    # the threshold decides: the same 80 GFLOP/s is slow against 100
    slow = tb.check(threshold_gflops=100.0, gflops=80.0, maps_text=OPENBLAS_MAPS, corename="SkylakeX",
                    flags=AVX512, environ={})
    assert slow.warning and "80.0 GFLOP/s" in slow.warning and "expected at least 100" in slow.warning
    assert slow.verdict.endswith("SLOW")

    generic = tb.check(gflops=20.0, maps_text=OPENBLAS_MAPS, corename="Prescott", flags=AVX512, environ={})
    assert "OPENBLAS_CORETYPE=SkylakeX" in generic.warning and "Prescott" in generic.warning
    assert "does not know the CPU model" in generic.warning
    asked = tb.check(gflops=20.0, maps_text=OPENBLAS_MAPS, corename="Prescott", flags=AVX512,
                     environ={"OPENBLAS_CORETYPE": "Prescott"})
    assert "OPENBLAS_CORETYPE=Prescott in the environment" in asked.warning
    assert "OPENBLAS_CORETYPE=Haswell" in tb.check(gflops=20.0, maps_text=OPENBLAS_MAPS, corename="Core2",
                                                    flags=AVX2, environ={}).warning
    # an SSE-only CPU has nothing better to ask for
    assert tb.check(gflops=20.0, maps_text=OPENBLAS_MAPS, corename="Prescott", flags={"sse3"},
                    environ={}).warning is None

    none = tb.check(gflops=3.0, maps_text="", corename=None, flags=AVX512, environ={})
    assert none.kind == "none" and none.library is None and tb.INSTALL_HINT in none.warning


def test_blas_libraries_from_maps():
    maps = OPENBLAS_MAPS * 2 + ("7f1c2c000000-7f1c2c100000 r-xp 00000000 08:01 99  "
                                "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3\n"
                                "7f1c2d000000-7f1c2d100000 r-xp 00000000 08:01 98  "
                                "/usr/lib/x86_64-linux-gnu/libgomp.so.1\n[heap]\n")
    libs = tb.blas_libraries(maps)
    assert libs == ["/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblasp-r0.3.21.so",
                    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"]
    assert tb.classify(libs)[0] == "openblas"
    assert tb.classify(tb.blas_libraries(REFERENCE_MAPS)) == (
        "reference", "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3.11.0")


def test_time_matmul_is_quick_and_restores_threads():
    import time

    import torch
    before = torch.get_num_threads()
    t = time.perf_counter()
    g = tb.time_matmul()
    assert time.perf_counter() - t < 1.5 and g > 0.5
    assert torch.get_num_threads() == before


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now


@pytest.mark.parametrize("step_seconds", [0.5, 4.0, 9.0, 20.0])
def test_training_progress_at_least_every_15_seconds(monkeypatch, step_seconds):
    import io
    clock = FakeClock()
    monkeypatch.setattr(tdm, "time", clock)
    out = io.StringIO()
    epochs, steps = 2, 20
    p = tdm.Progress(epochs, steps, batch_size=16, test_pages=64, interval=10.0, t0=clock.now, out=out)
    printed = []
    for e in range(epochs):
        for s in range(steps):
            clock.now += step_seconds
            before = out.tell()
            p.step(e, loss=1.0 / (s + 1), epoch_mean=0.5)
            if out.tell() != before:
                printed.append(clock.now)
        p.eval_start()
        for b in range(4):  # the test split's batches: forward only, a third of a step per page batch
            clock.now += step_seconds
            before = out.tell()
            p.eval_batch((b + 1) * 16, 64)
            if out.tell() != before:
                printed.append(clock.now)
        p.eval_end()
        printed.append(clock.now)  # main() prints "epoch N: ..." here
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"step 1/{epochs * steps} (epoch 1/{epochs}): loss 1.0000")
    gaps = [b - a for a, b in zip([1000.0] + printed, printed)]
    assert max(gaps) <= max(15.0, step_seconds), gaps  # a step longer than 15 s: every step
    for line in lines:
        assert " elapsed, ~" in line and line.endswith(" left"), line
    assert all(line.startswith(("step ", "evaluating the test split: ")) for line in lines)
    # the estimate after the first epoch's evaluation: the second epoch and two evaluations
    second = [line for line in lines if "(epoch 2/2)" in line][0]
    assert "loss" in second and "epoch mean 0.5000" in second


def test_duration_format():
    assert tdm._duration(42.4) == "42 s"
    assert tdm._duration(119.6) == "2 min 00 s"
    assert tdm._duration(483) == "8 min 03 s"

"""Shared fixtures for the golden tests (run: /usr/bin/python3 -m pytest tests/golden).

Test modules get the helpers through the `golden` fixture (not `from conftest
import ...`, which breaks when several test directories with a conftest.py are
collected together); importing this conftest puts tools/ (with fastformer_testing) on sys.path.

The C++ binaries are looked up in $FASTFORMER_BIN_DIR (default <repo>/build/bin) by
tools/fastformer_testing. A test that needs `fastformer-encode` FAILS when it is
missing (set FASTFORMER_ALLOW_MISSING_BINARIES=1 to skip those tests instead, while developing).

PyTorch's BLAS (tools/torch_blas.py): before numpy or torch is loaded, OPENBLAS_CORETYPE
is set when OpenBLAS would run a core below the CPU's (Debian 12's OpenBLAS runs its
generic Prescott core on Sapphire/Emerald Rapids; the tests' children inherit it); once
per session one timed matmul names the BLAS torch runs on. The verdict is a line of
the report header, and a warning section of the terminal summary when it is the
reference BLAS or slow (naming what to install or set); it never fails a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

if str(Path(__file__).resolve().parents[2] / "tools") not in sys.path:  # tools/: fastformer_testing, the tools
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from fastformer_testing.binaries import REPO, TOOLS, bin_dir  # noqa: E402  (no numpy, no torch)
from fastformer_testing.binaries import binary as require_binary  # noqa: E402

import torch_blas  # noqa: E402  (standard library only)

BLAS_PRESET_NOTE = torch_blas.preset_openblas_coretype()  # before numpy/torch load libblas.so.3

import numpy as np  # noqa: E402
import pytest  # noqa: E402

_blas_check = []


def blas_check():
    """The session's torch_blas.check() (run once), or the exception text if it could not run."""
    if not _blas_check:
        try:
            _blas_check.append(torch_blas.check())
        except Exception as e:  # noqa: BLE001  (a report, never a failure)
            _blas_check.append(f"torch BLAS: the check could not run: {type(e).__name__}: {e}")
    return _blas_check[0]


def pytest_report_header(config):
    r = blas_check()
    lines = [BLAS_PRESET_NOTE] if BLAS_PRESET_NOTE else []
    lines.append(r if isinstance(r, str) else r.verdict)
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    r = blas_check()
    if isinstance(r, str) or not r.warning:
        return
    terminalreporter.write_sep("=", "PyTorch BLAS warning (tools/torch_blas.py)", yellow=True)
    terminalreporter.write_line(r.verdict)
    terminalreporter.write_line(r.warning)

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def encode_binary() -> Path:
    """Call inside a test body (so a missing binary is a test FAILURE, not a setup error)."""
    return require_binary("fastformer-encode")


class EncodeRun:
    def __init__(self, proc, outputs):
        self.returncode = proc.returncode
        self.stderr = proc.stderr
        self.stdout = proc.stdout
        self.outputs = outputs


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(it if isinstance(it, str) else json.dumps(it))
            f.write("\n")


def run_encode(encode_bin, model_dir, items, tmp_path, *flags, name="in", timeout=300,
               use_stdio=False, check=True, env=None) -> EncodeRun:
    """Run fastformer-encode on `items` (dicts, or raw strings written verbatim as lines), on the
    CPU in float32 unless `flags` name a --dtype; `env` (a dict) is added to the environment."""
    env = dict(os.environ, **env) if env else None
    inp = Path(tmp_path) / f"{name}.jsonl"
    out = Path(tmp_path) / f"{name}.out.jsonl"
    write_jsonl(inp, items)
    cmd = [str(encode_bin), "--model-dir", str(model_dir), "--backend", "cpu"]
    if "--dtype" not in flags:
        # float32 unless a test names its dtype: the parity tolerance (1e-4) is float32's, and
        # the default, auto, is bfloat16 on a CPU with AVX512_BF16 or AMX.
        cmd += ["--dtype", "float32"]
    if use_stdio:
        cmd += ["--input", "-", "--output", "-"]
        with open(inp, "rb") as fin:
            proc = subprocess.run(cmd + list(flags), stdin=fin, capture_output=True, timeout=timeout, env=env)
        text = proc.stdout.decode("utf-8", "replace")
    else:
        if out.exists():
            out.unlink()
        cmd += ["--input", str(inp), "--output", str(out)]
        proc = subprocess.run(cmd + list(flags), capture_output=True, timeout=timeout, env=env)
        text = out.read_text(encoding="utf-8") if out.exists() else ""
    proc.stderr = proc.stderr.decode("utf-8", "replace")
    if check and proc.returncode != 0:
        pytest.fail(f"fastformer-encode failed (exit {proc.returncode}): {' '.join(cmd + list(flags))}\n"
                    f"stderr:\n{proc.stderr[-4000:]}", pytrace=False)
    outputs = [json.loads(line) for line in text.splitlines() if line.strip()] if proc.returncode == 0 else []
    return EncodeRun(proc, outputs)


def assert_close(name, ours, ref, tol=1e-4):
    """|ours - ref| <= tol * max(1, |ref|) elementwise; prints the worst error."""
    ours = np.asarray(ours, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, f"{name}: shape {ours.shape} != reference {ref.shape}"
    assert np.all(np.isfinite(ours)), f"{name}: non-finite values"
    err = np.abs(ours - ref)
    scaled = err / np.maximum(1.0, np.abs(ref))
    worst = float(scaled.max()) if scaled.size else 0.0
    print(f"  {name}: worst scaled error {worst:.3e} (max abs {float(err.max()) if err.size else 0:.3e})")
    if worst > tol:
        idx = np.unravel_index(int(np.argmax(scaled)), scaled.shape)
        raise AssertionError(f"{name}: |ours - ref| = {err[idx]:.3e} at {idx} exceeds {tol} * max(1, |ref|) "
                             f"(ours {ours[idx]!r}, ref {ref[idx]!r})")
    return worst


def check_outputs(outputs, refs, lengths, want_tokens=True, want_logits=True, label="", tol=1e-4):
    """Compare fastformer-encode output lines with reference_encode results."""
    assert len(outputs) == len(refs), f"{label}: {len(outputs)} output lines for {len(refs)} inputs"
    worst = {}
    for i, (o, r, n) in enumerate(zip(outputs, refs, lengths)):
        assert o.get("num_tokens") == n, f"{label}: line {i + 1}: num_tokens {o.get('num_tokens')} != {n}"
        worst.setdefault("embedding", []).append(
            assert_close(f"{label} seq {i} (n={n}) embedding", o["embedding"], r.embedding, tol))
        if want_tokens:
            assert "token_embeddings" in o, f"{label}: line {i + 1} lacks token_embeddings"
            worst.setdefault("token_embeddings", []).append(
                assert_close(f"{label} seq {i} (n={n}) token_embeddings", o["token_embeddings"],
                             r.token_embeddings, tol))
        if want_logits and r.logits is not None:
            assert "logits" in o, f"{label}: line {i + 1} lacks logits"
            worst.setdefault("logits", []).append(
                assert_close(f"{label} seq {i} (n={n}) logits", o["logits"], r.logits, tol))
    print(f"{label}: worst scaled errors " + ", ".join(f"{k} {max(v):.2e}" for k, v in worst.items()))
    return worst


# What every timed mode of a peer tool's JSON (bench_onnxruntime.py, bench_openvino.py) has.
MODE_FIELDS = ("tokens_per_second", "sequences_per_second", "batches", "tokens", "sequences", "seconds",
               "batch_latency_p50_ms", "batch_latency_p99_ms", "peak_rss_bytes", "padded_tokens")


def check_peer_modes(r, backend, pool, threads, lengths, batch_tokens, seed):
    """A peer tool's padded and sorted modes: every figure present and positive, the run's
    settings echoed, padded timing our batches of `pool` in order after its 2 warm-up batches,
    sorted padding less than padded's."""
    assert set(r["modes"]) == {"padded", "sorted"}
    for mode, m in r["modes"].items():
        for k in MODE_FIELDS:
            assert isinstance(m[k], (int, float)) and m[k] > 0, (mode, k)
        assert (m["backend"], m["mode"], m["threads"], m["lengths"], m["batch_tokens"], m["seed"]) == \
            (backend, mode, threads, lengths, batch_tokens, seed)
        assert m["seconds"] >= 0.5 and m["batches"] >= m["mode_batches"]
        assert m["padded_tokens"] >= m["tokens"]
    pad = r["modes"]["padded"]
    order = [(2 + i) % len(pool) for i in range(pad["batches"])]
    assert pad["tokens"] == sum(sum(len(s) for s in pool[i]) for i in order)
    assert r["modes"]["sorted"]["padded_tokens"] / r["modes"]["sorted"]["tokens"] < \
        pad["padded_tokens"] / pad["tokens"]


class _Golden:
    """What the `golden` fixture hands to the tests."""
    REPO = REPO
    TOOLS = TOOLS
    PYTHON = PYTHON
    bin_dir = staticmethod(bin_dir)
    require_binary = staticmethod(require_binary)
    encode_binary = staticmethod(encode_binary)
    run_encode = staticmethod(run_encode)
    write_jsonl = staticmethod(write_jsonl)
    assert_close = staticmethod(assert_close)
    check_outputs = staticmethod(check_outputs)
    check_peer_modes = staticmethod(check_peer_modes)


@pytest.fixture(scope="session")
def golden():
    return _Golden

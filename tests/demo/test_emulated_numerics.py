"""Issue 15, point 5: the CUDA engine's reduced-precision numerics on trained weights.

The demo model's whole held-out split (206 man pages, up to 512 tokens each) is encoded by
the CPU engine (fastformer-encode, float32) and by the CUDA engine on the host emulation
(tests/tools/emulated_encode.cc) in bfloat16 and float16. Random-weight models keep
activations small; trained weights are where float16 overflows and bfloat16 rounding
would show. Every page must get the PyTorch model's predicted label (test_logits.jsonl),
and its pooled embedding a cosine of at least 0.999 with the CPU engine's.
"""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest

MIN_COSINE = 0.999
CPU_RTOL = 1e-4  # the engine's float32 rule: logits within 1e-4 of the page's largest |logit|
# The emulation runs every GPU thread on the CPU, one core: about 30 s per dtype for the split
# (88,590 tokens; the report line has the time), ten times that is a hang.
EMULATION_TIMEOUT_S = 600


def _encode(cmd, out_path, timeout):
    start = time.monotonic()
    proc = subprocess.run([str(c) for c in cmd] + ["--output", str(out_path)],
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}",
                    pytrace=False)
    with open(out_path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    embeddings = np.array([r["embedding"] for r in lines], dtype=np.float64)
    logits = np.array([r["logits"] for r in lines], dtype=np.float64)
    return embeddings, logits, time.monotonic() - start


def _relative_logit_error(logits, ref):
    """Per page: the largest |logit - ref| over the page's largest |ref|."""
    return np.abs(logits - ref).max(1) / np.maximum(np.abs(ref).max(1), 1e-30)


def _label_mismatches(pred, want):
    return [int(i) for i in np.nonzero(pred != want)[0]]


@pytest.fixture(scope="module")
def cpu_engine(demo_split, require_binary, tmp_path_factory):
    """The CPU engine's float32 (embeddings, logits) of every page."""
    encode = require_binary("fastformer-encode")
    out = tmp_path_factory.mktemp("cpu") / "out.jsonl"
    embeddings, logits, _ = _encode([encode, "--model-dir", demo_split.model_dir, "--backend", "cpu",
                                     "--dtype", "float32", "--return-logits", "--input", demo_split.ids_path],
                                    out, timeout=600)
    assert len(logits) == len(demo_split.torch_logits), "fastformer-encode: one output line per page"
    return embeddings, logits


def test_cpu_engine_matches_pytorch(demo_split, cpu_engine, demo_report):
    _, logits = cpu_engine
    pred = logits.argmax(1)
    rel = _relative_logit_error(logits, demo_split.torch_logits)
    accuracy = float((pred == demo_split.labels).mean())
    top2 = np.sort(demo_split.torch_logits, 1)[:, -2:]
    demo_report(f"cpu float32: labels equal to PyTorch's on {int((pred == demo_split.torch_labels).sum())}/"
                f"{len(pred)} pages, largest logit difference {rel.max():.2e} of the page's largest |logit|, "
                f"accuracy {accuracy:.4f}; PyTorch's smallest top-two logit margin "
                f"{float((top2[:, 1] - top2[:, 0]).min()):.3f}")
    assert _label_mismatches(pred, demo_split.torch_labels) == [], "pages whose label differs from PyTorch's"
    assert rel.max() <= CPU_RTOL, f"page {int(rel.argmax())}: logits differ from PyTorch's by {rel.max():.3e}"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_emulated_cuda_engine_agrees(dtype, demo_split, cpu_engine, require_binary, demo_report, tmp_path):
    encode = require_binary("fastformer_emulated_encode")
    embeddings, logits, seconds = _encode(
        [encode, "--model-dir", demo_split.model_dir, "--dtype", dtype, "--return-logits",
         "--input", demo_split.ids_path], tmp_path / "out.jsonl", timeout=EMULATION_TIMEOUT_S)
    cpu_embeddings, cpu_logits = cpu_engine
    assert embeddings.shape == cpu_embeddings.shape and logits.shape == cpu_logits.shape
    assert np.isfinite(embeddings).all() and np.isfinite(logits).all(), f"{dtype}: non-finite outputs"

    pred = logits.argmax(1)
    cosine = (embeddings * cpu_embeddings).sum(1) / (
        np.linalg.norm(embeddings, axis=1) * np.linalg.norm(cpu_embeddings, axis=1))
    rel = _relative_logit_error(logits, demo_split.torch_logits)
    abs_diff = np.abs(logits - demo_split.torch_logits).max()
    demo_report(f"emulated cuda {dtype}: labels equal to PyTorch's on "
                f"{int((pred == demo_split.torch_labels).sum())}/{len(pred)} pages, worst cosine to the CPU "
                f"engine {cosine.min():.6f} (page {int(cosine.argmin())}), largest logit difference to "
                f"PyTorch {abs_diff:.3e} ({rel.max():.2e} of the page's largest |logit|), accuracy "
                f"{float((pred == demo_split.labels).mean()):.4f}; {seconds:.0f} s")

    assert _label_mismatches(pred, demo_split.torch_labels) == [], \
        f"{dtype}: pages whose label differs from PyTorch's"
    assert _label_mismatches(pred, cpu_logits.argmax(1)) == [], \
        f"{dtype}: pages whose label differs from the CPU engine's"
    low = [(int(i), float(cosine[i])) for i in np.nonzero(cosine < MIN_COSINE)[0]]
    assert low == [], f"{dtype}: pages whose pooled embedding has a cosine below {MIN_COSINE} (page, cosine)"

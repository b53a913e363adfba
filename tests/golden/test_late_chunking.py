"""Late chunking in the engine (issue 35): a document's spans pooled from its one pass, against
the PyTorch reference computed from the reference model's token states of the whole document
(tools/reference.py, reference_span_pool), through fastformer-encode's "spans" (the CPU engine)
and fastformer_emulated_encode (the CUDA engine on the host emulation).

- float32 within 1e-4 of the float64 reference, both modes (`model`: the pooler's softmax over
  the span; `mean`), for documents of 512, 8,192 and 65,536 tokens, with spans of 1 token, of
  256 tokens (consecutive and overlapping) and the whole document;
- in `model` mode the whole-document span equals the pooled embedding bit for bit;
- bfloat16 (where the CPU has it, and the emulated bfloat16 elsewhere): cosine >= 0.999;
- the emulated CUDA engine on a few hundred tokens, float32 and bfloat16.
"""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from fastformer_testing.cpu_features import has_bf16_gemms
import make_demo_model as mdm
import reference as ref

TOL = 1e-4
VOCAB = 211
PAD = 0


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A small model with 65,536 positions (the demo model has 512)."""
    d = tmp_path_factory.mktemp("late_chunking")
    mdm.make_demo_model(d, preset="tiny", seed=21, hidden=64, heads=4, layers=2, intermediate=96,
                        max_positions=65536, vocab=VOCAB, num_labels=0, pad_token_id=PAD,
                        log=lambda *a: None)
    model, _ = ref.load_model_dir(d)
    return d, model


def document(n, seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, n)
    ids[rng.random(n) < 0.02] = PAD  # a few pads inside: masked in every span that holds them
    ids[0] = 1
    return [int(x) for x in ids]


def spans_for(n):
    """1-token spans, consecutive 256-token chunks, overlapping 256-token windows, the whole."""
    spans = [[0, 1], [n // 2, n // 2 + 1], [n - 1, n]]
    spans += [[b, min(b + 256, n)] for b in range(0, n, 256)]
    spans += [[b, min(b + 256, n)] for b in range(128, n - 128, 1024)]
    spans.append([0, n])
    return spans


def real(ids, span):
    return any(t != PAD for t in ids[span[0]:span[1]])


@pytest.mark.parametrize("n", [512, 8192, 65536])
def test_cpu_float32_both_modes_against_the_reference(golden, long_model, tmp_path, n):
    model_dir, model = long_model
    ids = document(n, seed=n)
    spans = [s for s in spans_for(n) if real(ids, s)]
    want_states = ref.reference_encode(model, [ids])[0]
    mask = np.asarray([t != PAD for t in ids], dtype=np.float64)
    encode = golden.encode_binary()
    for mode in ("model", "mean"):
        run = golden.run_encode(encode, model_dir, [{"token_ids": ids, "spans": spans}], tmp_path,
                                "--span-pooling", mode, "--max-batch-tokens", str(max(n, 512)),
                                name=f"{mode}{n}")
        (out,) = run.outputs
        got = np.asarray(out["span_embeddings"], dtype=np.float64)
        want = ref.reference_span_pool(model, want_states.token_embeddings, mask, spans, mode)
        golden.assert_close(f"{mode} spans of a {n}-token document", got, want, TOL)
        if mode == "model":
            # The whole-document span is the sequence's pooling, bit for bit.
            assert out["span_embeddings"][-1] == out["embedding"]
        else:
            # The mean of one real token is its state.
            golden.assert_close("a 1-token mean", got[0], want_states.token_embeddings[0], TOL)


@pytest.mark.parametrize("mode", ["hardware", "emulated"])
def test_cpu_bfloat16_spans_cosine(golden, long_model, tmp_path, mode):
    model_dir, model = long_model
    n = 8192
    ids = document(n, seed=5)
    spans = [s for s in spans_for(n) if real(ids, s)]
    states = ref.reference_encode(model, [ids])[0].token_embeddings
    mask = np.asarray([t != PAD for t in ids], dtype=np.float64)
    env = {"FASTFORMER_CPU_BFLOAT16": "emulate"} if mode == "emulated" else None
    encode = golden.encode_binary()
    for pooling in ("model", "mean"):
        run = golden.run_encode(encode, model_dir, [{"token_ids": ids, "spans": spans}], tmp_path,
                                "--dtype", "bfloat16", "--span-pooling", pooling,
                                "--max-batch-tokens", str(n), name=f"bf16{pooling}", check=False,
                                env=env)
        if run.returncode != 0 and mode == "hardware":
            assert "needs AVX512_BF16 or AMX" in run.stderr, run.stderr
            assert not has_bf16_gemms(), run.stderr
            pytest.skip("this CPU has no AVX512_BF16 or AMX: bfloat16 runs in the emulated case")
        assert run.returncode == 0, run.stderr
        got = np.asarray(run.outputs[0]["span_embeddings"], dtype=np.float64)
        want = ref.reference_span_pool(model, states, mask, spans, pooling)
        cosine = np.sum(got * want, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
        assert cosine.min() >= 0.999, f"{pooling}: worst span cosine {cosine.min():.6f}"
        if pooling == "model":
            assert run.outputs[0]["span_embeddings"][-1] == run.outputs[0]["embedding"]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_emulated_cuda_engine_spans(golden, long_model, tmp_path, dtype):
    """The CUDA engine's span pooling (its pooling kernels over the spans' chunks), on the
    host emulation: two documents of a few hundred tokens in one batch, both modes."""
    model_dir, model = long_model
    encode = golden.require_binary("fastformer_emulated_encode")
    docs = [document(300, seed=1), document(517, seed=2)]
    spans = [[[0, 1], [0, 256], [256, 300], [10, 290], [0, 300]],
             [[5, 6], [0, 256], [256, 512], [512, 517], [100, 400], [0, 517]]]
    spans = [[s for s in ss if real(d, s)] for d, ss in zip(docs, spans)]
    refs = ref.reference_encode(model, docs)
    for pooling in ("model", "mean"):
        items = [{"token_ids": d, "spans": s} for d, s in zip(docs, spans)]
        inp = tmp_path / f"emu_{dtype}_{pooling}.jsonl"
        outp = tmp_path / f"emu_{dtype}_{pooling}.out.jsonl"
        golden.write_jsonl(inp, items)
        proc = subprocess.run([str(encode), "--model-dir", str(model_dir), "--dtype", dtype,
                               "--span-pooling", pooling, "--input", str(inp), "--output", str(outp),
                               "--max-batch-tokens", "1024"], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outs = [json.loads(line) for line in outp.read_text().splitlines()]
        for d, s, r, o in zip(docs, spans, refs, outs):
            mask = np.asarray([t != PAD for t in d], dtype=np.float64)
            got = np.asarray(o["span_embeddings"], dtype=np.float64)
            want = ref.reference_span_pool(model, r.token_embeddings, mask, s, pooling)
            if dtype == "float32":
                golden.assert_close(f"emulated CUDA {pooling} spans", got, want, TOL)
            else:
                cosine = np.sum(got * want, 1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
                assert cosine.min() >= 0.999, f"{pooling}: worst span cosine {cosine.min():.6f}"
            if pooling == "model":
                assert o["span_embeddings"][-1] == o["embedding"]

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


def small_model(tmp_path_factory, name, seed, max_positions):
    """(directory, reference model) of a small model with `max_positions` positions."""
    d = tmp_path_factory.mktemp(name)
    mdm.make_demo_model(d, preset="tiny", seed=seed, hidden=64, heads=4, layers=2, intermediate=96,
                        max_positions=max_positions, vocab=VOCAB, num_labels=0, pad_token_id=PAD,
                        log=lambda *a: None)
    model, _ = ref.load_model_dir(d)
    return d, model


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """A small model with 65,536 positions (the demo model has 512)."""
    return small_model(tmp_path_factory, "late_chunking", 21, 65536)


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


# ---------------------------------------------------------------------------- macro-chunks
# A document longer than the model's positions with macro_overlap_tokens (fastformer-encode's
# --macro-overlap-tokens): passes of P tokens, each P - overlap after the last and the last
# ending at the document's end; each span pooled from the pass that holds it with the most
# context on both sides (the earlier on a tie); the document's embedding the mean of its passes'.
# The expectation below is computed independently: the reference model run on each pass's ids.

def passes_of(n, P, overlap):
    starts, s = [], 0
    while s + P < n:
        starts.append(s)
        s += P - overlap
    starts.append(n - P)
    return starts


def pass_for(span, starts, P):
    best, most = None, -1
    for w, a in enumerate(starts):
        if span[0] >= a and span[1] <= a + P and min(span[0] - a, a + P - span[1]) > most:
            best, most = w, min(span[0] - a, a + P - span[1])
    return best


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """A small model with 512 positions, for documents over them."""
    return small_model(tmp_path_factory, "macro_chunks", 22, 512)


@pytest.mark.parametrize("mode", ["model", "mean"])
def test_macro_chunks_against_each_pass_of_the_reference(golden, short_model, tmp_path, mode):
    model_dir, model = short_model
    n, P, overlap = 2000, 512, 128
    ids = document(n, seed=33)
    starts = passes_of(n, P, overlap)
    assert starts == [0, 384, 768, 1152, 1488]
    spans = [[0, 1], [500, 501], [n - 1, n]] + [[b, min(b + 100, n)] for b in range(0, n, 100)]
    spans += [[380, 509], [1488, 2000]]  # 129 tokens across a boundary; the last pass whole
    spans = [s for s in spans if real(ids, s)]
    refs = ref.reference_encode(model, [ids[a:a + P] for a in starts])
    run = golden.run_encode(golden.encode_binary(), model_dir, [{"token_ids": ids, "spans": spans}],
                            tmp_path, "--span-pooling", mode, "--macro-overlap-tokens", str(overlap),
                            "--return-token-embeddings", "--max-batch-tokens", "1024",
                            name=f"macro{mode}")
    (out,) = run.outputs
    got = np.asarray(out["span_embeddings"], dtype=np.float64)
    want = []
    for s in spans:
        w = pass_for(s, starts, P)
        a = starts[w]
        pass_ids = ids[a:a + P]
        mask = np.asarray([t != PAD for t in pass_ids], dtype=np.float64)
        want.append(ref.reference_span_pool(model, refs[w].token_embeddings, mask,
                                            [[s[0] - a, s[1] - a]], mode)[0])
    golden.assert_close(f"macro-chunk {mode} spans", got, np.asarray(want), TOL)
    # The document's embedding: the mean of its passes' pooled embeddings.
    golden.assert_close("the mean of the passes' embeddings",
                        np.asarray(out["embedding"], dtype=np.float64),
                        np.mean([r.embedding for r in refs], axis=0), TOL)
    # Each token's state from the pass that holds it with the most context.
    tokens = np.asarray(out["token_embeddings"], dtype=np.float64).reshape(n, -1)
    for t in (0, 383, 448, 449, 1000, 1487, 1999):
        w = pass_for([t, t + 1], starts, P)
        golden.assert_close(f"token {t}", tokens[t], refs[w].token_embeddings[t - starts[w]], TOL)


def test_macro_chunks_refusals(golden, short_model, tmp_path):
    model_dir, _ = short_model
    ids = document(1000, seed=34)
    encode = golden.encode_binary()
    # Without macro-chunks a document over the positions is refused, naming the limit.
    run = golden.run_encode(encode, model_dir, [{"token_ids": ids, "spans": [[0, 10]]}], tmp_path,
                            name="nomacro", check=False)
    assert run.returncode == 2, run.stderr
    assert "1000 tokens exceed max_position_embeddings 512" in run.stderr, run.stderr
    # A span that fits no single pass is refused with the rule.
    run = golden.run_encode(encode, model_dir, [{"token_ids": ids, "spans": [[400, 520]]}], tmp_path,
                            "--macro-overlap-tokens", "64", name="crossing", check=False)
    assert run.returncode == 2, run.stderr
    assert "span 0 [400, 520) lies in no single macro-chunk" in run.stderr, run.stderr
    assert "a chunk of at most 65 tokens always fits one" in run.stderr, run.stderr
    # An overlap that leaves a pass no room to move.
    run = golden.run_encode(encode, model_dir, [{"token_ids": ids}], tmp_path,
                            "--macro-overlap-tokens", "512", name="overlap", check=False)
    assert run.returncode == 2, run.stderr
    assert "macro_overlap_tokens: 512 must be in [0, max_position_embeddings 512)" in run.stderr

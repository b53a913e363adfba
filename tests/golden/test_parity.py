"""Golden parity: `fastformer-encode --backend cpu` against the float64 reference.

Contract under test:
  fastformer-encode --model-dir DIR --backend cpu --input FILE.jsonl|- --output FILE.jsonl|-
                    [--return-token-embeddings] [--return-logits] [--normalize]
                    [--max-batch-tokens N] [--threads N]
  input lines {"token_ids": [...]} or {"input_embeddings": [[...], ...]};
  output lines, in input order, {"embedding": [...], "num_tokens": n}
  (+ "token_embeddings", "logits" when asked);
  a bad line -> exit 2, stderr names "line N" (1-based) and the field.
Tolerance: |ours - ref| <= 1e-4 * max(1, |ref|) elementwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import zlib
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import export_fastformer as ex
from fastformer_testing.cpu_features import has_bf16_gemms
import make_demo_model as mdm
import reference as ref

TOL = 1e-4
LENGTHS = [7, 2048, 1, 300, 2, 64]  # one batch, deliberately not sorted


@dataclass(frozen=True)
class Case:
    name: str
    hidden: int
    heads: int
    layers: int
    intermediate: int
    act: str
    num_labels: int
    share: bool
    pad: int = 0
    max_positions: int = 2048
    word_embedding: bool = True
    vocab: int = 503


CASES = [
    Case("d16_1layer_gelu_head", 64, 4, 1, 128, "gelu", 3, False),
    Case("d32_2layers_gelunew_shared", 64, 2, 2, 96, "gelu_new", 0, True),
    Case("d64_3layers_relu_head", 128, 2, 3, 256, "relu", 5, False, max_positions=4096),
    Case("d16_4layers_silu_shared_pad7", 64, 4, 4, 64, "silu", 0, True, pad=7),
    Case("d64_2layers_tanhgelu_head_shared", 128, 2, 2, 160, "gelu_pytorch_tanh", 2, True),
    Case("d32_2layers_swish_head_pad3", 64, 2, 2, 128, "swish", 4, False, pad=3),
    Case("d16_2layers_gelu_no_word_embedding", 64, 4, 2, 128, "gelu", 3, False, word_embedding=False),
    # 16 heads (the official preset's): the CPU's pooling token-major and key scores over heads
    Case("d16_16heads_1layer_gelu_head", 256, 16, 1, 128, "gelu", 3, False),
    # 12 heads (base-long's): the CPU's key scores run padded to 16 heads (zero weights)
    Case("d16_12heads_2layers_gelu_head_pad5", 192, 12, 2, 128, "gelu", 3, False, pad=5),
]


def make_model(case: Case, out_dir, seed=11, dtype="float32"):
    mdm.make_demo_model(out_dir, preset="tiny", seed=seed, dtype=dtype, hidden=case.hidden, heads=case.heads,
                        layers=case.layers, intermediate=case.intermediate, max_positions=case.max_positions,
                        vocab=case.vocab, act=case.act, num_labels=case.num_labels, share_layers=case.share,
                        pad_token_id=case.pad, word_embedding=case.word_embedding, log=lambda *a: None)
    model, cfg = ref.load_model_dir(out_dir)  # float64, from the written file
    return model, cfg


def make_ids(rng, lengths, vocab, pad):
    """Token ids with pad tokens inside the sequences (none in length-1 ones; none all pad)."""
    seqs = []
    for n in lengths:
        ids = rng.integers(0, vocab - 1, n)
        ids = np.where(ids >= pad, ids + 1, ids)  # never pad, in [0, vocab)
        if n == 2:
            ids[0] = pad                          # a leading pad
        elif n >= 3:
            ids[rng.random(n) < 0.15] = pad       # scattered pads
            ids[n // 3: n // 3 + max(1, n // 10)] = pad  # a run of pads
            ids[-1] = pad                         # a pad in the last position
            ids[1] = pad if n > 3 else ids[1]
            ids[0] = (pad + 1) % vocab if ids[0] == pad else ids[0]
        assert np.any(ids != pad)
        seqs.append([int(x) for x in ids])
    return seqs


def make_embeddings(rng, lengths, hidden):
    # float32-representable values, so both sides start from the same numbers
    return [rng.standard_normal((n, hidden)).astype(np.float32).astype(np.float64) for n in lengths]


def items_for(kind, seqs):
    if kind == "ids":
        return [{"token_ids": s} for s in seqs]
    return [{"input_embeddings": e.tolist()} for e in seqs]


def case_model(tmp_path_factory, case: Case, seed):
    """(directory, reference model, config) of `case`'s model."""
    d = tmp_path_factory.mktemp(case.name)
    model, cfg = make_model(case, d, seed=seed)
    return d, model, cfg


@pytest.fixture(scope="module")
def parity_model(request, tmp_path_factory):
    case = request.param
    return (case, *case_model(tmp_path_factory, case, 11))


# token ids for every model with a word embedding; input embeddings for all
# (the first configuration also runs against the sanitizer build: make test-asan)
PARITY_PARAMS = [pytest.param(c, k, id=f"{c.name}-{k}", marks=[pytest.mark.asan] if c is CASES[0] else [])
                 for c in CASES for k in ("ids", "embeddings") if k == "embeddings" or c.word_embedding]


@pytest.mark.parametrize("parity_model,kind", PARITY_PARAMS, indirect=["parity_model"])
def test_parity_mixed_lengths(golden, parity_model, kind, tmp_path):
    case, model_dir, model, cfg = parity_model
    encode = golden.encode_binary()
    rng = np.random.default_rng(zlib.crc32(f"{case.name}/{kind}".encode()))
    seqs = (make_ids(rng, LENGTHS, case.vocab, case.pad) if kind == "ids"
            else make_embeddings(rng, LENGTHS, case.hidden))
    refs = ref.reference_encode(model, seqs, kind=kind)
    flags = ["--return-token-embeddings"] + (["--return-logits"] if case.num_labels else [])
    run = golden.run_encode(encode, model_dir, items_for(kind, seqs), tmp_path, *flags, "--threads", "2")
    golden.check_outputs(run.outputs, refs, LENGTHS, want_tokens=True, want_logits=bool(case.num_labels),
                  label=f"{case.name}/{kind}")
    if not case.num_labels:
        assert all("logits" not in o for o in run.outputs)


# ----------------------------------------------------------------------------- smaller checks on one model

BASIC = Case("basic", 64, 4, 2, 128, "gelu", 3, False, max_positions=512, vocab=211)


@pytest.fixture(scope="module")
def basic_model(tmp_path_factory):
    return case_model(tmp_path_factory, BASIC, 5)


@pytest.mark.asan
def test_normalize(golden, basic_model, tmp_path):
    model_dir, model, cfg = basic_model
    encode = golden.encode_binary()
    rng = np.random.default_rng(1)
    lengths = [1, 5, 40, 200]
    seqs = make_ids(rng, lengths, BASIC.vocab, 0)
    refs = ref.reference_encode(model, seqs)
    run = golden.run_encode(encode, model_dir, items_for("ids", seqs), tmp_path, "--normalize")
    assert len(run.outputs) == len(seqs)
    for i, (o, r) in enumerate(zip(run.outputs, refs)):
        want = r.embedding / np.linalg.norm(r.embedding)
        golden.assert_close(f"normalized seq {i}", o["embedding"], want, TOL)
        assert abs(np.linalg.norm(o["embedding"]) - 1.0) < 1e-5
        assert "token_embeddings" not in o and "logits" not in o


# 16 heads of 16, as the official preset: the CPU's bfloat16 key scores then run on VDPBF16PS
# (its model in the emulated mode) and the pooling token-major over heads.
HEADS16 = Case("heads16", 256, 16, 1, 128, "gelu", 3, False, max_positions=512, vocab=211)


@pytest.fixture(scope="module")
def heads16_model(tmp_path_factory):
    return case_model(tmp_path_factory, HEADS16, 6)


# 12 heads, as base-long: the key scores padded to 16 heads (bfloat16: on VDPBF16PS).
HEADS12 = Case("heads12", 192, 12, 1, 128, "gelu", 3, False, max_positions=512, vocab=211)


@pytest.fixture(scope="module")
def heads12_model(tmp_path_factory):
    return case_model(tmp_path_factory, HEADS12, 7)


@pytest.mark.parametrize("mode", ["hardware", "emulated"])
@pytest.mark.parametrize("which", ["basic", "heads16", "heads12"])
def test_cpu_bfloat16_against_float64_reference(golden, request, tmp_path, mode, which):
    """--dtype bfloat16 on the CPU: pooled-embedding cosine >= 0.999 to the float64
    reference and the same logits argmax (the GPU's reduced-precision rule); on a CPU
    without AVX512_BF16 or AMX, a start-up refusal that says so. "emulated"
    (FASTFORMER_CPU_BFLOAT16=emulate) runs the same bfloat16 buffers, packed weights and row
    pieces over float32 GEMMs, on every CPU."""
    model_dir, model, cfg = request.getfixturevalue(f"{which}_model")
    case = {"basic": BASIC, "heads16": HEADS16, "heads12": HEADS12}[which]
    encode = golden.encode_binary()
    rng = np.random.default_rng(3)
    lengths = [1, 9, 300, 2, 511]
    seqs = make_ids(rng, lengths, case.vocab, 0)
    env = {"FASTFORMER_CPU_BFLOAT16": "emulate"} if mode == "emulated" else None
    run = golden.run_encode(encode, model_dir, items_for("ids", seqs), tmp_path, "--dtype", "bfloat16",
                            "--return-logits", "--threads", "2", check=False, env=env)
    if run.returncode != 0 and mode == "hardware":
        err = run.stderr.decode("utf-8", "replace") if isinstance(run.stderr, bytes) else run.stderr
        assert "needs AVX512_BF16 or AMX" in err, err
        assert not has_bf16_gemms(), \
            f"refused bfloat16 on a CPU whose flags have avx512_bf16/amx_bf16: {err}"
        pytest.skip("this CPU has no AVX512_BF16 or AMX: the refusal was checked, bfloat16 parity not run")
    refs = ref.reference_encode(model, seqs)
    assert len(run.outputs) == len(seqs)
    for i, (o, r) in enumerate(zip(run.outputs, refs)):
        assert o["num_tokens"] == lengths[i]
        e, want = np.asarray(o["embedding"], dtype=np.float64), np.asarray(r.embedding, dtype=np.float64)
        cosine = float(e @ want / (np.linalg.norm(e) * np.linalg.norm(want)))
        assert cosine >= 0.999, f"seq {i} (n={lengths[i]}): cosine {cosine:.6f} to the float64 reference"
        assert int(np.argmax(o["logits"])) == int(np.argmax(r.logits)), f"seq {i}: logits argmax differs"
        # bfloat16 GEMM inputs: not the float32 result (the flag took effect)
        assert np.max(np.abs(e - want)) > 1e-6, f"seq {i}: bfloat16 output equals float64 to 1e-6"


def test_cpu_bfloat16_refused_without_the_instructions(golden, basic_model, tmp_path):
    """ONEDNN_MAX_CPU_ISA=AVX2 stands in for a CPU without AVX512_BF16: a clear refusal,
    exit code 1, naming what is missing and what oneDNN found."""
    model_dir, _, _ = basic_model
    encode = golden.encode_binary()
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    proc = subprocess.run([str(encode), "--model-dir", str(model_dir), "--backend", "cpu", "--dtype", "bfloat16",
                           "--input", "-", "--output", "-"], input=b'{"token_ids": [1, 2]}\n',
                          capture_output=True, env=env, timeout=60)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 1, (proc.returncode, err)
    assert "dtype bfloat16 on the CPU needs AVX512_BF16 or AMX" in err, err
    assert "finds only avx2" in err and "ONEDNN_MAX_CPU_ISA is set" in err, err
    # The default, auto, serves float32 under the same limit (never the emulated bfloat16, even
    # with FASTFORMER_CPU_BFLOAT16=emulate), and says why.
    proc = subprocess.run([str(encode), "--model-dir", str(model_dir), "--backend", "cpu", "--input", "-",
                           "--output", "-"], input=b'{"token_ids": [1, 2]}\n', capture_output=True,
                          env=dict(env, FASTFORMER_CPU_BFLOAT16="emulate"), timeout=60)
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 0, err
    assert json.loads(proc.stdout.decode().splitlines()[0])["num_tokens"] == 2
    assert re.search(r"dtype auto: float32 \(oneDNN [0-9.]+ finds avx2: no AVX512_BF16 or AMX on this CPU "
                     r"\(ONEDNN_MAX_CPU_ISA is set\)\)", err), err


@pytest.mark.asan
def test_small_max_batch_tokens_and_stdio(golden, basic_model, tmp_path):
    """Many sequences split over many small batches, via stdin/stdout; order is kept."""
    model_dir, model, cfg = basic_model
    encode = golden.encode_binary()
    rng = np.random.default_rng(2)
    lengths = [int(x) for x in rng.integers(1, 60, 40)]
    seqs = make_ids(rng, lengths, BASIC.vocab, 0)
    refs = ref.reference_encode(model, seqs)
    run = golden.run_encode(encode, model_dir, items_for("ids", seqs), tmp_path, "--max-batch-tokens", "64",
                     "--threads", "2", "--return-logits", "--return-token-embeddings", use_stdio=True)
    golden.check_outputs(run.outputs, refs, lengths, label="max-batch-tokens 64 via stdio")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_export_round_trip_per_dtype(golden, tmp_path, dtype):
    """reference Model -> export_model(dtype) -> fastformer-encode == reference on the
    dtype-rounded weights (read back from the exported file, upcast to float64)."""
    encode = golden.encode_binary()
    cfg = dict(mdm.OFFICIAL_CONFIG, hidden_size=64, num_attention_heads=4, num_hidden_layers=2,
               intermediate_size=96, max_position_embeddings=1024, hidden_act="gelu_new")
    sd = mdm.random_state_dict(cfg, seed=21, num_labels=3, word_embedding=True)
    source = ref.model_from_state_dict(cfg, sd)  # the "trained" reference model, float64
    out = tmp_path / f"m_{dtype}"
    ex.export_model(source.state_dict(), cfg, out, dtype=dtype, log=lambda *a: None)
    rounded, _ = ref.load_model_dir(out)
    for k, v in rounded.state_dict().items():
        assert torch.equal(v, source.state_dict()[k].to(ex.DTYPES[dtype]).double()), k
    rng = np.random.default_rng(3)
    lengths = [3, 50, 700, 1]
    seqs = make_ids(rng, lengths, cfg["vocab_size"], 0)
    refs = ref.reference_encode(rounded, seqs)
    run = golden.run_encode(encode, out, items_for("ids", seqs), tmp_path, "--return-logits", "--return-token-embeddings")
    golden.check_outputs(run.outputs, refs, lengths, label=f"round trip {dtype}")


# ----------------------------------------------------------------------------- bad input

BAD_MODEL = Case("bad", 32, 4, 1, 64, "gelu", 2, False, max_positions=64, vocab=100)
NOEMB_MODEL = Case("noemb", 32, 4, 1, 64, "gelu", 2, False, max_positions=64, word_embedding=False)

_good_ids = {"token_ids": [5, 6, 7]}
_good_emb = {"input_embeddings": [[0.25] * 32, [-0.5] * 32]}
_nan_row = "[" + ", ".join(["0.1"] * 31 + ["NaN"]) + "]"

# name -> (model, bad line (dict or raw string), field the message must name or None, extra needle)
BAD_CASES = {
    "empty_token_ids": ("bad", {"token_ids": []}, "token_ids", None),
    "all_pad": ("bad", {"token_ids": [0, 0, 0]}, "token_ids", None),
    "negative_id": ("bad", {"token_ids": [5, -1, 3]}, "token_ids", None),
    "id_equal_vocab_size": ("bad", {"token_ids": [5, 100]}, "token_ids", "vocab_size"),
    "too_many_tokens": ("bad", {"token_ids": [1] * 65}, "token_ids", None),
    "embeddings_wrong_width": ("bad", {"input_embeddings": [[0.1] * 33]}, "input_embeddings", None),
    "embeddings_ragged_width": ("bad", {"input_embeddings": [[0.1] * 32, [0.1] * 31]}, "input_embeddings", None),
    "embeddings_empty": ("bad", {"input_embeddings": []}, "input_embeddings", None),
    "embeddings_overflow_to_inf": ("bad", {"input_embeddings": [[0.1] * 31 + [1e39]]}, "input_embeddings", None),
    "embeddings_nan_literal": ("bad", '{"input_embeddings": [' + _nan_row + ']}', None, None),
    "token_ids_without_word_embedding": ("noemb", {"token_ids": [1, 2, 3]}, "token_ids", None),
    "invalid_json": ("bad", '{"token_ids": [1, 2', None, None),
}


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory):
    out = {}
    for case in (BAD_MODEL, NOEMB_MODEL):
        d = tmp_path_factory.mktemp(case.name)
        make_model(case, d, seed=9)
        out[case.name] = d
    return out


@pytest.mark.asan
@pytest.mark.parametrize("case_name", list(BAD_CASES))
def test_bad_input(golden, bad_models, tmp_path, case_name):
    encode = golden.encode_binary()
    model, bad_line, field, needle = BAD_CASES[case_name]
    good = _good_ids if model == "bad" else _good_emb
    run = golden.run_encode(encode, bad_models[model], [good, good, bad_line, good], tmp_path, check=False)
    msg = run.stderr
    assert run.returncode == 2, f"{case_name}: exit {run.returncode}, expected 2; stderr: {msg[-2000:]}"
    assert re.search(r"\bline 3\b", msg), f"{case_name}: stderr does not name 'line 3': {msg[-2000:]}"
    if field:
        assert field in msg, f"{case_name}: stderr does not name the field {field!r}: {msg[-2000:]}"
    if needle:
        assert needle in msg, f"{case_name}: stderr does not mention {needle!r}: {msg[-2000:]}"
    print(f"{case_name}: {msg.strip().splitlines()[-1] if msg.strip() else ''}")


@pytest.mark.asan
def test_good_input_for_bad_models(golden, bad_models, tmp_path):
    """The good lines used above are accepted (so the failures above are the bad line's)."""
    encode = golden.encode_binary()
    run = golden.run_encode(encode, bad_models["bad"], [_good_ids, {"token_ids": [1] * 64}], tmp_path)
    assert [o["num_tokens"] for o in run.outputs] == [3, 64]
    run = golden.run_encode(encode, bad_models["noemb"], [_good_emb], tmp_path, name="emb")
    assert [o["num_tokens"] for o in run.outputs] == [2]


# ----------------------------------------------------------------------------- shared benchmark workload


@pytest.mark.parametrize("lengths,batch_tokens,seed,pool", [("uniform:3:40", 100, 7, 5), ("fixed:150", 100, 2, 3),
                                                            ("uniform:16:256", 8192, 1, 8)])
def test_bench_workload_matches_python(golden, tmp_path, lengths, batch_tokens, seed, pool):
    """fastformer-bench --print-workload generates exactly tools/workload.py's pool."""

    import workload as wl

    bench = golden.require_binary("fastformer-bench")
    d = tmp_path / "m"
    mdm.make_demo_model(d, preset="tiny", seed=1, vocab=50, pad_token_id=5, log=lambda *a: None)
    p = subprocess.run([str(bench), "--model-dir", str(d), "--lengths", lengths, "--seed", str(seed),
                        "--batch-tokens", str(batch_tokens), "--pool-batches", str(pool), "--print-workload"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    if isinstance(got, dict):
        got = got.get("batches", got)
    want = wl.make_pool(seed, lengths, 50, 5, batch_tokens, pool)
    assert got == want

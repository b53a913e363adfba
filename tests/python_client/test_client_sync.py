"""fastformer_client.Client against a real fastformer-server: shapes, dtypes, parity with the float64
reference, options, model_info, health, deadlines, connection errors."""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest


def test_encode_ids_default_returns_float32_matrix(ffc, models, client, pyc):
    model = models.get("head")
    rng = np.random.default_rng(1)
    seqs = [pyc.make_ids(rng, n, model.vocab) for n in (1, 2, 7, 64, 300, 512)]
    emb = client.encode(seqs)
    assert isinstance(emb, np.ndarray) and emb.dtype == np.float32 and emb.shape == (len(seqs), model.hidden)
    assert emb.flags.writeable and emb.flags.c_contiguous
    pyc.check("ids", model, seqs, "ids", emb)


def test_encode_numpy_inputs_and_mixed_kinds(ffc, models, client, pyc):
    """1-D int32/int64/uint16 arrays, python lists, 2-D float32/float64 arrays and the dict form,
    mixed in one request (each sequence is one kind or the other)."""
    model = models.get("head")
    rng = np.random.default_rng(2)
    ids = pyc.make_ids(rng, 40, model.vocab)
    e1 = pyc.make_embeddings(rng, 17, model.hidden)
    e2 = pyc.make_embeddings(rng, 3, model.hidden)
    seqs = [np.asarray(ids, dtype=np.int32), np.asarray(ids, dtype=np.int64), np.asarray(ids, dtype=np.uint16),
            e1.astype(np.float32), e1, {"input_embeddings": e2.ravel()}, {"token_ids": ids}, list(ids)]
    res = client.encode(seqs, return_token_embeddings=True)
    kinds = ["ids"] * 3 + ["embeddings"] * 3 + ["ids"] * 2
    ref_seqs = [ids, ids, ids, e1, e1, e2, ids, ids]
    pyc.check("mixed", model, ref_seqs, kinds, res.embeddings, token_embeddings=res.token_embeddings)
    assert res.num_tokens == [40, 40, 40, 17, 17, 3, 40, 40]


def test_encode_result_with_token_embeddings_and_logits(ffc, models, client, pyc):
    model = models.get("head")
    rng = np.random.default_rng(3)
    seqs = [pyc.make_ids(rng, n, model.vocab) for n in (5, 130, 1)]
    res = client.encode(seqs, return_token_embeddings=True, return_logits=True, request_id="r-1")
    assert isinstance(res, ffc.EncodeResult)
    assert res.request_id == "r-1" and len(res) == 3
    assert res.num_tokens == [5, 130, 1]
    assert isinstance(res.token_embeddings, list) and len(res.token_embeddings) == 3
    assert res.logits.shape == (3, 3) and res.logits.dtype == np.float32
    assert isinstance(res.queue_time_us, int) and isinstance(res.compute_time_us, int) and res.compute_time_us > 0
    pyc.check("tokens+logits", model, seqs, "ids", res.embeddings, res.token_embeddings, res.logits)

    only_logits = client.encode(seqs, return_logits=True)
    assert only_logits.token_embeddings is None and only_logits.logits.shape == (3, 3)
    only_tokens = client.encode(seqs, return_token_embeddings=True)
    assert only_tokens.logits is None and [t.shape for t in only_tokens.token_embeddings] == \
        [(5, 64), (130, 64), (1, 64)]
    full = client.encode(seqs, return_result=True)
    assert isinstance(full, ffc.EncodeResult) and full.token_embeddings is None and full.logits is None
    np.testing.assert_array_equal(full.embeddings, res.embeddings)


def test_normalize(ffc, models, client, pyc):
    model = models.get("head")
    rng = np.random.default_rng(4)
    seqs = [pyc.make_ids(rng, n, model.vocab) for n in (9, 200)]
    emb = client.encode(seqs, normalize=True)
    np.testing.assert_allclose(np.linalg.norm(emb.astype(np.float64), axis=1), 1.0, atol=1e-5)
    pyc.check("normalize", model, seqs, "ids", emb, normalize=True)


@pytest.mark.parametrize("truncation,code", [("right", 1), ("left", 2), ("RIGHT", 1), (2, 2)])
def test_truncation(ffc, models, client, pyc, truncation, code):
    model = models.get("head")
    rng = np.random.default_rng(5)
    seqs = [pyc.make_ids(rng, 600, model.vocab), pyc.make_ids(rng, 20, model.vocab)]
    res = client.encode(seqs, truncation=truncation, return_result=True)
    assert res.num_tokens == [512, 20]
    pyc.check(f"truncation {truncation}", model, [pyc.truncate(s, 512, code) for s in seqs], "ids", res.embeddings)


def test_truncation_none_rejects_long_sequence(ffc, client):
    with pytest.raises(ffc.InvalidArgument) as ei:
        client.encode([[1] * 10, [1] * 513])
    assert "sequence 1" in ei.value.details and "max_position_embeddings 512" in ei.value.details


def test_embeddings_only_model(ffc, models, noemb, pyc):
    model = models.get("noemb")
    rng = np.random.default_rng(6)
    seqs = [pyc.make_embeddings(rng, n, model.hidden) for n in (1, 33, 512)]
    with ffc.Client(noemb.target) as c:
        res = c.encode(seqs, return_token_embeddings=True)
        info = c.model_info()
    pyc.check("noemb", model, seqs, "embeddings", res.embeddings, res.token_embeddings)
    assert info["accepts_token_ids"] is False and info["num_labels"] == 0


def test_model_info(ffc, models, client, head):
    model = models.get("head")
    info = client.model_info()
    assert isinstance(info, dict)
    assert info["model_name"] == "e2e-head"
    assert (info["hidden_size"], info["num_hidden_layers"], info["num_attention_heads"]) == (64, 2, 4)
    assert (info["intermediate_size"], info["max_position_embeddings"], info["vocab_size"]) == (128, 512, 1000)
    assert info["num_labels"] == model.num_labels == 3 and info["accepts_token_ids"] is True
    assert info["max_request_tokens"] == 2048 and info["backend"] == "cpu"
    assert info["dtype"] and info["server_version"]
    assert set(info) >= {"device", "max_batch_tokens"}


def test_health(ffc, client, head):
    assert client.health() == "SERVING"
    assert client.health("fastformer.v1.Encoder") == "SERVING"
    assert client.health("no.such.Service") == "SERVICE_UNKNOWN"
    client.wait_for_serving(5.0)


def test_context_manager_closes_channel(ffc, head):
    with ffc.Client(head.target) as c:
        assert c.health() == "SERVING"
    with pytest.raises((ValueError, ffc.FastformerError, RuntimeError)):
        c.health()


def test_deadline(ffc, client, head):
    seqs = [[5] * 512] * 4
    with pytest.raises(ffc.DeadlineExceeded) as ei:
        client.encode(seqs, deadline_s=1e-6)
    assert ei.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    with ffc.Client(head.target, deadline_s=1e-6) as c:  # the client's default
        with pytest.raises(ffc.DeadlineExceeded):
            c.encode(seqs)
        assert c.encode(seqs, deadline_s=math.inf).shape == (4, 64)  # per call: none
    with pytest.raises(ValueError):
        client.encode(seqs, deadline_s=0)


def test_unreachable_server_is_unavailable(ffc, pyc):
    with pyc.held_port() as port, ffc.Client(f"127.0.0.1:{port}", deadline_s=5.0) as c:  # nothing listens
        with pytest.raises(ffc.Unavailable) as ei:
            c.encode([[1, 2, 3]])
        assert ei.value.code == grpc.StatusCode.UNAVAILABLE and isinstance(ei.value, ffc.FastformerError)
        with pytest.raises(ffc.Unavailable):
            c.health()
        with pytest.raises(ffc.DeadlineExceeded):
            c.wait_for_serving(0.3)


def test_client_side_argument_errors(ffc, client):
    """Arguments that are not sequences at all fail in the client, before any call."""
    with pytest.raises(TypeError, match="list of sequences"):
        client.encode([1, 2, 3])  # one sequence not wrapped in a list
    with pytest.raises(TypeError, match="sequence 1: a 1-D float array"):
        client.encode([[1, 2], np.zeros(4, dtype=np.float32)])
    with pytest.raises(TypeError, match="sequence 0: a 2-D integer array"):
        client.encode([np.zeros((2, 64), dtype=np.int64)])
    with pytest.raises(TypeError, match="sequence 0"):
        client.encode([[1, [2, 3]]])
    with pytest.raises(TypeError, match="list of sequences"):
        client.encode("hello")
    with pytest.raises(ValueError, match="truncation"):
        client.encode([[1]], truncation="middle")
    with pytest.raises(TypeError, match="unknown keys"):
        client.encode([{"ids": [1, 2]}])
    # ids that int32 (the wire type) cannot carry: the typed error, naming sequence and token
    with pytest.raises(ffc.InvalidArgument, match=r"sequence 1: token_ids: token 2 has id 2147483648"):
        client.encode([[1], np.array([1, 2, 2**31], dtype=np.int64)])


def test_large_request_and_response(ffc, models, head, pyc):
    """A 256 KiB-limited server still answers a response of 2048 x 64 token embeddings (the
    response limit is the client's: 256 MiB by default)."""
    model = models.get("head")
    rng = np.random.default_rng(8)
    seqs = [pyc.make_ids(rng, 512, model.vocab) for _ in range(4)]
    with ffc.Client(head.target, max_message_bytes=1 << 20) as c:
        res = c.encode(seqs, return_token_embeddings=True)
    assert sum(t.nbytes for t in res.token_embeddings) == 2048 * 64 * 4
    pyc.check("2048 tokens", model, seqs, "ids", res.embeddings, res.token_embeddings)

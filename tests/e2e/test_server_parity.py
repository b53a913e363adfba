"""Parity through the server: Encode and EncodeStream against the float64 PyTorch reference.

Same tolerance as the engine: |ours - ref| <= 1e-4 * max(1, |ref|) elementwise. Mixed lengths
(1 .. max_position_embeddings, not sorted) with interior, leading-run and trailing pad tokens,
both input kinds, with and without token embeddings / logits / normalize, truncation both ways
(compared against the reference on the truncated sequence), and a server with tiny batches so
that one request's sequences span several batches and a sequence exceeds the token budget.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

LENGTHS = [7, 300, 1, 2, 64, 512]  # 512 = max_position_embeddings; 2: a trailing pad

OPTIONS = {
    "plain": dict(),
    "tokens_logits": dict(tokens=True, logits=True),
    "normalize_tokens_logits": dict(normalize=True, tokens=True, logits=True),
}


def _inputs(e2e, model, kind, lengths, seed_text):
    rng = np.random.default_rng(zlib.crc32(seed_text.encode()))
    if kind == "ids":
        return [e2e.make_ids(rng, n, model.vocab) for n in lengths]
    return [e2e.make_embeddings(rng, n, model.hidden) for n in lengths]


def _stream_all(e2e, srv, reqs):
    """Send every request on one stream; the responses by request_id (each exactly once)."""
    resps = list(srv.stub.EncodeStream(iter(reqs), timeout=e2e.RPC_TIMEOUT_S))
    ids = [r.request_id for r in resps]
    assert sorted(ids) == sorted(q.request_id for q in reqs), f"stream answered request_ids {ids}"
    return {r.request_id: r for r in resps}


@pytest.mark.parametrize("opts", list(OPTIONS))
@pytest.mark.parametrize("kind", ["ids", "embeddings"])
@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_parity(e2e, models, servers, mode, kind, opts):
    model = models.get("head")
    srv = servers.shared("head")
    o = OPTIONS[opts]
    seqs = _inputs(e2e, model, kind, LENGTHS, f"{kind}/{opts}")
    label = f"{mode}/{kind}/{opts}"
    if mode == "unary":
        req = e2e.make_request(seqs, kind, request_id=f"parity-{label}", **o)
        resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
        e2e.check_response(label, resp, model, seqs, kind, request_id=req.request_id, **o)
        assert resp.compute_time_us > 0, f"{label}: compute_time_us not set"
    else:
        # one message with every sequence, and one message per sequence
        reqs = [e2e.make_request(seqs, kind, request_id="all", **o)]
        reqs += [e2e.make_request([s], kind, request_id=f"seq{i}", **o) for i, s in enumerate(seqs)]
        by_id = _stream_all(e2e, srv, reqs)
        e2e.check_response(f"{label} all", by_id["all"], model, seqs, kind, **o)
        assert by_id["all"].compute_time_us > 0, f"{label}: compute_time_us not set"
        for i, s in enumerate(seqs):
            e2e.check_response(f"{label} seq{i}", by_id[f"seq{i}"], model, [s], kind, **o)


TRUNC_LENGTHS = [700, 5, 513, 512, 1000]


@pytest.mark.parametrize("mode", ["unary", "stream"])
@pytest.mark.parametrize("kind", ["ids", "embeddings"])
@pytest.mark.parametrize("truncation", ["RIGHT", "LEFT"])
def test_truncation(e2e, models, servers, truncation, kind, mode):
    """RIGHT keeps the first max_position_embeddings tokens (or rows), LEFT the last;
    num_tokens is the count after truncation."""
    model = models.get("head")
    srv = servers.shared("head")
    t = e2e.pb.Truncation.Value(f"TRUNCATION_{truncation}")
    seqs = _inputs(e2e, model, kind, TRUNC_LENGTHS, f"trunc/{kind}/{truncation}")
    req = e2e.make_request(seqs, kind, request_id=f"trunc-{truncation}", tokens=True, logits=True,
                           truncation=t)
    label = f"{mode}/{kind}/TRUNCATION_{truncation}"
    resp = (srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S) if mode == "unary"
            else _stream_all(e2e, srv, [req])[req.request_id])
    e2e.check_response(label, resp, model, seqs, kind, tokens=True, logits=True, truncation=t,
                       request_id=req.request_id)
    assert [enc.num_tokens for enc in resp.encodings] == [min(n, model.max_positions) for n in TRUNC_LENGTHS]


def test_requests_spanning_batches(e2e, models, servers):
    """Tiny batches: a request's sequences span batches, a sequence longer than the token budget
    runs alone; the answers are unchanged and in request order."""
    model = models.get("head")
    srv = servers.start("head", max_batch_tokens=100, max_batch_sequences=2, max_request_tokens=4096)
    seqs = _inputs(e2e, model, "ids", [3, 250, 1, 99, 100, 101, 512, 40, 2, 60], "spanning")
    req = e2e.make_request(seqs, "ids", request_id="span", tokens=True, logits=True)
    before = srv.metrics()
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("max_batch_tokens 100", resp, model, seqs, "ids", tokens=True, logits=True,
                       request_id="span")
    seqs_before = before.value("fastformer_batch_sequences_sum")
    m = srv.metrics_when(lambda m: m.value("fastformer_batch_sequences_sum") - seqs_before >= len(seqs))
    count = m.value("fastformer_batch_sequences_count") - before.value("fastformer_batch_sequences_count")
    # FIFO under 100 tokens / 2 sequences: {3} {250} {1, 99} {100} {101} {512} {40, 2} {60}
    assert count >= 8, f"10 sequences under a budget of 100 tokens / 2 sequences ran in only {count:.0f} batches"


def test_model_info(e2e, models, servers):
    model = models.get("head")
    srv = servers.start("head", max_batch_tokens=1024, max_request_tokens=3000)
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    c = model.config
    want = dict(hidden_size=c.hidden_size, num_hidden_layers=c.num_hidden_layers,
                num_attention_heads=c.num_attention_heads, intermediate_size=c.intermediate_size,
                max_position_embeddings=c.max_position_embeddings, vocab_size=c.vocab_size, num_labels=3,
                accepts_token_ids=True, dtype="float32", backend="cpu", max_batch_tokens=1024,
                max_request_tokens=3000)
    got = {k: getattr(info, k) for k in want}
    assert got == want, f"GetModelInfo: {info}"
    assert info.server_version, f"GetModelInfo: empty server_version: {info}"
    assert info.model_name, f"GetModelInfo: empty model_name: {info}"
    print(f"model_name {info.model_name!r}, server_version {info.server_version!r}, device {info.device!r}")


def test_model_info_without_head_and_word_embedding(e2e, models, servers):
    srv = servers.shared("noemb")
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    assert info.num_labels == 0 and not info.accepts_token_ids, f"GetModelInfo: {info}"
    assert info.hidden_size == 64 and info.max_position_embeddings == 512, f"GetModelInfo: {info}"


def test_embeddings_model_parity(e2e, models, servers):
    """The model without word embedding and head, through the server (input embeddings only)."""
    model = models.get("noemb")
    srv = servers.shared("noemb")
    seqs = _inputs(e2e, model, "embeddings", [9, 1, 120], "noemb")
    req = e2e.make_request(seqs, "embeddings", request_id="noemb", tokens=True, normalize=True)
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("noemb", resp, model, seqs, "embeddings", tokens=True, normalize=True, request_id="noemb")

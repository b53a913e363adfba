"""Bad input through the server: every case gets the expected status code and a message naming
the sequence index ("sequence <i>"), the field and the limit; the server stays SERVING and
answers correctly afterwards. Unary calls get the status; EncodeStream answers the bad message
in-band (EncodeResponse.error, code = the gRPC status code) and the stream goes on.

Each bad request holds good sequences at 0, 1 and 3 and the bad one at index 2.
"""

from __future__ import annotations

import math

import grpc
import numpy as np
import pytest

MAX_REQUEST_TOKENS = 2048
MAX_MESSAGE_BYTES = 256 * 1024
HEAD_FLAGS = dict(max_request_tokens=MAX_REQUEST_TOKENS, max_message_bytes=MAX_MESSAGE_BYTES)
D = 64

GOOD_IDS = [5, 6, 0, 7]
GOOD_EMB = (np.arange(2 * D, dtype=np.float64).reshape(2, D) % 7 - 3) / 4


def _emb_row(last):
    return [0.1] * (D - 1) + [last]


# name -> (model, bad Sequence as a dict of fields, code, needles that must all be in the message,
#          alternatives of which one must be in it)
INVALID = grpc.StatusCode.INVALID_ARGUMENT
SEQUENCE_CASES = {
    "empty_sequence": ("head", {}, INVALID, ["sequence 2"], ["token_ids", "input_embeddings"]),
    "all_pad": ("head", {"token_ids": [0, 0, 0]}, INVALID, ["sequence 2", "token_ids"], None),
    "negative_id": ("head", {"token_ids": [5, -1, 3]}, INVALID, ["sequence 2", "token_ids"], None),
    "id_equal_vocab_size": ("head", {"token_ids": [5, 1000]}, INVALID,
                            ["sequence 2", "token_ids", "vocab_size 1000"], None),
    "id_int32_max": ("head", {"token_ids": [2**31 - 1]}, INVALID, ["sequence 2", "token_ids", "vocab_size 1000"],
                     None),
    "too_many_tokens": ("head", {"token_ids": [1] * 513}, INVALID,
                        ["sequence 2", "token_ids", "max_position_embeddings 512"], None),
    "too_many_embedding_rows": ("head", {"input_embeddings": [0.5] * (513 * D)}, INVALID,
                                ["sequence 2", "input_embeddings", "max_position_embeddings 512"], None),
    "embeddings_wrong_width": ("head", {"input_embeddings": [0.1] * (D + 1)}, INVALID,
                               ["sequence 2", "input_embeddings"], None),
    "embeddings_partial_row": ("head", {"input_embeddings": [0.1] * (3 * D - 5)}, INVALID,
                               ["sequence 2", "input_embeddings"], None),
    "embeddings_nan": ("head", {"input_embeddings": _emb_row(math.nan)}, INVALID,
                       ["sequence 2", "input_embeddings"], None),
    "embeddings_inf": ("head", {"input_embeddings": _emb_row(math.inf)}, INVALID,
                       ["sequence 2", "input_embeddings"], None),
    "embeddings_minus_inf": ("head", {"input_embeddings": _emb_row(-math.inf) * 2}, INVALID,
                             ["sequence 2", "input_embeddings"], None),
    "both_input_kinds": ("head", {"token_ids": [1, 2], "input_embeddings": [0.25] * (2 * D)}, INVALID,
                         ["sequence 2"], ["token_ids", "input_embeddings"]),
    "token_ids_without_word_embedding": ("noemb", {"token_ids": [1, 2, 3]}, INVALID,
                                         ["sequence 2", "token_ids"], None),
}

# name -> (model, request builder(e2e) -> EncodeRequest, code, needles, alternatives)
REQUEST_CASES = {
    "no_sequences": ("head", lambda e2e: e2e.pb.EncodeRequest(request_id="none"), INVALID, ["sequences"], None),
    "over_max_request_tokens": ("head", lambda e2e: e2e.make_request([[3] * 500] * 5, "ids"), INVALID,
                                ["max_request_tokens"], None),
    "return_logits_without_head": ("noemb", lambda e2e: e2e.make_request([GOOD_EMB], "embeddings", logits=True),
                                   INVALID, ["return_logits"], None),
    "unknown_truncation": ("head", lambda e2e: e2e.make_request([GOOD_IDS], "ids", truncation=7), INVALID,
                           ["truncation"], None),
}


def _good_seq(e2e, model_key):
    return GOOD_IDS if model_key == "head" else GOOD_EMB


def _kind(model_key):
    return "ids" if model_key == "head" else "embeddings"


def _server(servers, model_key):
    return servers.shared(model_key, **(HEAD_FLAGS if model_key == "head" else {}))


def _bad_request(e2e, name, request_id=""):
    if name in REQUEST_CASES:
        model_key, build, code, needles, alts = REQUEST_CASES[name]
        req = build(e2e)
        req.request_id = request_id
        return model_key, req, code, needles, alts
    model_key, fields, code, needles, alts = SEQUENCE_CASES[name]
    good = _good_seq(e2e, model_key)
    req = e2e.make_request([good, good, good, good], _kind(model_key), request_id=request_id)
    bad = req.sequences[2]
    bad.Clear()
    if "token_ids" in fields:
        bad.token_ids.extend(fields["token_ids"])
    if "input_embeddings" in fields:
        bad.input_embeddings.extend(fields["input_embeddings"])
    return model_key, req, code, needles, alts


CODE_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def _check_message(name, code, msg, want_code, needles, alts):
    """code: a grpc.StatusCode, or the int of an in-band EncodeResponse.error."""
    code = CODE_BY_NUMBER.get(code, code) if isinstance(code, int) else code
    assert code == want_code, f"{name}: got {getattr(code, 'name', code)} ({msg!r}), expected {want_code.name}"
    for n in needles:
        assert n in msg, f"{name}: message {msg!r} does not name {n!r}"
    if alts:
        assert any(a in msg for a in alts), f"{name}: message {msg!r} names none of {alts}"


def _still_serving_and_correct(e2e, models, srv, model_key):
    assert srv.health_status("") == "SERVING", f"health after the bad request: {srv.health_status('')}"
    assert srv.health_status("fastformer.v1.Encoder") == "SERVING"
    model = models.get(model_key)
    good = [_good_seq(e2e, model_key), _good_seq(e2e, model_key)[:1]]
    req = e2e.make_request(good, _kind(model_key), request_id="after", tokens=True)
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("good request after the bad one", resp, model, good, _kind(model_key), tokens=True,
                       request_id="after")


ALL_CASES = list(SEQUENCE_CASES) + list(REQUEST_CASES)


@pytest.mark.parametrize("name", ALL_CASES)
def test_bad_input_unary(e2e, models, servers, name):
    model_key, req, code, needles, alts = _bad_request(e2e, name, request_id=f"bad-{name}")
    srv = _server(servers, model_key)
    got, msg, resp = e2e.rpc_code(srv.stub.Encode, req, timeout=e2e.RPC_TIMEOUT_S)
    print(f"{name}: {got.name}: {msg}")
    _check_message(name, got, msg, code, needles, alts)
    _still_serving_and_correct(e2e, models, srv, model_key)


@pytest.mark.parametrize("name", ALL_CASES)
def test_bad_input_stream_in_band(e2e, models, servers, name):
    """EncodeStream: good, bad, good -> the bad one gets EncodeResponse.error, the others their answers."""
    model_key, bad, code, needles, alts = _bad_request(e2e, name, request_id="bad")
    srv = _server(servers, model_key)
    model = models.get(model_key)
    kind = _kind(model_key)
    good = [_good_seq(e2e, model_key)]
    reqs = [e2e.make_request(good, kind, request_id="before"), bad, e2e.make_request(good, kind, request_id="after")]
    code_, msg_, resps = e2e.rpc_code(lambda: list(srv.stub.EncodeStream(iter(reqs), timeout=e2e.RPC_TIMEOUT_S)))
    assert code_ == grpc.StatusCode.OK, f"{name}: the stream failed with {code_.name}: {msg_!r} " \
                                        f"(a bad message must be answered in-band and the stream go on)"
    by_id = {r.request_id: r for r in resps}
    assert sorted(by_id) == ["after", "bad", "before"] and len(resps) == 3, \
        f"{name}: stream answered {[r.request_id for r in resps]}"
    err = by_id["bad"]
    assert err.HasField("error"), f"{name}: no in-band error for the bad message: {err}"
    print(f"{name}: in-band error {err.error.code}: {err.error.message}")
    assert len(err.encodings) == 0, f"{name}: the failed message also carries encodings"
    _check_message(name, err.error.code, err.error.message, code, needles, alts)
    for rid in ("before", "after"):
        e2e.check_response(f"{name} stream {rid}", by_id[rid], model, good, kind)


def test_oversize_message(e2e, models, servers):
    """A message over --max-message-bytes: RESOURCE_EXHAUSTED (gRPC's own limit); still serving."""
    srv = _server(servers, "head")
    rows = MAX_MESSAGE_BYTES // (4 * D) + 64  # float32 payload alone is over the limit
    req = e2e.make_request([np.full((rows, D), 0.5)], "embeddings", request_id="oversize",
                           truncation=e2e.pb.TRUNCATION_RIGHT)
    assert req.ByteSize() > MAX_MESSAGE_BYTES
    got, msg, _ = e2e.rpc_code(srv.stub.Encode, req, timeout=e2e.RPC_TIMEOUT_S)
    print(f"oversize ({req.ByteSize()} bytes): {got.name}: {msg}")
    assert got == grpc.StatusCode.RESOURCE_EXHAUSTED, f"oversize message: {got.name} ({msg!r})"
    _still_serving_and_correct(e2e, models, srv, "head")


def test_limits_are_inclusive(e2e, models, servers):
    """The good side of the limits: exactly max_request_tokens in a request, exactly
    max_position_embeddings in a sequence, the largest token id, a message just under the size limit."""
    model = models.get("head")
    srv = _server(servers, "head")
    seqs = [[999] + [1] * 511, [2] * 512, [3] * 512, [998] * 512]
    assert sum(map(len, seqs)) == MAX_REQUEST_TOKENS
    resp = srv.stub.Encode(e2e.make_request(seqs, "ids", request_id="limits"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("at the limits", resp, model, seqs, "ids", request_id="limits")
    emb = [np.full((512, D), 0.25)]
    req = e2e.make_request(emb, "embeddings", request_id="big")
    assert req.ByteSize() < MAX_MESSAGE_BYTES
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("512 embedding rows", resp, model, emb, "embeddings", request_id="big")


def test_max_request_tokens_counts_kept_tokens(e2e, models, servers):
    """With truncation, the request's token total is what is kept: 3 x 700 tokens cut to 3 x 512 = 1536
    fit max_request_tokens 2048."""
    model = models.get("head")
    srv = _server(servers, "head")
    rng = np.random.default_rng(700)
    seqs = [e2e.make_ids(rng, 700, model.vocab) for _ in range(3)]
    req = e2e.make_request(seqs, "ids", request_id="kept", truncation=e2e.pb.TRUNCATION_LEFT)
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("3 x 700 tokens, LEFT", resp, model, seqs, "ids", truncation=e2e.pb.TRUNCATION_LEFT,
                       request_id="kept")


def test_bad_requests_counted_and_not_computed(e2e, models, servers):
    """Rejected requests: counted with their code, nothing of them queued or computed."""
    srv = servers.start("head", **HEAD_FLAGS)
    before = srv.metrics()
    names = ["negative_id", "too_many_tokens", "no_sequences", "over_max_request_tokens", "embeddings_nan"]
    for name in names:
        _, req, *_ = _bad_request(e2e, name)
        got, msg, _ = e2e.rpc_code(srv.stub.Encode, req, timeout=e2e.RPC_TIMEOUT_S)
        assert got == grpc.StatusCode.INVALID_ARGUMENT, f"{name}: {got.name} {msg!r}"
    after = srv.metrics()
    delta = lambda n, **l: after.value(n, **l) - before.value(n, **l)  # noqa: E731
    assert delta("fastformer_requests_total", method="Encode", code="INVALID_ARGUMENT") == len(names)
    assert delta("fastformer_requests_total", method="Encode", code="OK") == 0
    assert delta("fastformer_tokens_total") == 0 and delta("fastformer_sequences_total") == 0, \
        "a rejected request was computed (tokens_total/sequences_total rose)"
    assert after.value("fastformer_queue_tokens") == 0 and after.value("fastformer_queue_sequences") == 0

"""Text input through the real server: Sequence.text tokenized by the model's tokenizer.json.

The model "text" carries make_demo_model's WordPiece tokenizer (BertNormalizer, BertPreTokenizer,
BertProcessing over DEMO_WORDS, where a token's id is its position), so the expected ids below
are worked out by hand from that word list; the embeddings are then checked against the float64
reference on those ids, and against the same ids sent as token_ids.
"""

from __future__ import annotations

import concurrent.futures as cf

import grpc
import numpy as np
import pytest

from make_demo_model import DEMO_WORDS

V = {w: i for i, w in enumerate(DEMO_WORDS)}


def ids(*tokens):
    return [V[t] for t in tokens]


# text -> its ids, by hand: lower-cased, accents stripped, punctuation split, ## continuations
TEXTS = {
    "The quick brown foxes jumped.": ids("[CLS]", "the", "quick", "brown", "fox", "##es", "jump", "##ed", ".", "[SEP]"),
    "Café, HELLO world!": ids("[CLS]", "cafe", ",", "hello", "world", "!", "[SEP]"),
    "zebra": ids("[CLS]", "[UNK]", "[SEP]"),
    "  a\tlong\n\ndocument  ": ids("[CLS]", "a", "long", "document", "[SEP]"),
    "Über (dog)": ids("[CLS]", "[UNK]", "(", "dog", ")", "[SEP]"),
}


def _text_request(pb, texts, **kw):
    req = pb.EncodeRequest(**kw)
    for t in texts:
        req.sequences.add().text = t
    return req


def _code(e2e, srv, req):
    try:
        srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    except grpc.RpcError as err:
        return err.code(), err.details()
    return grpc.StatusCode.OK, ""


def test_model_info_says_whether_text_is_accepted(e2e, servers):
    info = servers.shared("text").stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    assert info.accepts_text and info.accepts_token_ids
    assert info.tokenizer == "WordPiece (BertNormalizer, BertPreTokenizer, BertProcessing)", info.tokenizer
    plain = servers.shared("head").stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    assert not plain.accepts_text and plain.tokenizer == ""


@pytest.mark.parametrize("mode", ["unary", "stream"])
def test_text_is_the_reference_on_the_hand_tokenized_ids(e2e, models, servers, mode):
    model = models.get("text")
    srv = servers.shared("text")
    texts = list(TEXTS)
    req = _text_request(e2e.pb, texts, request_id="text", return_logits=True, return_token_embeddings=True)
    if mode == "unary":
        resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    else:
        (resp,) = list(srv.stub.EncodeStream(iter([req]), timeout=e2e.RPC_TIMEOUT_S))
        assert not resp.HasField("error"), resp.error.message
    assert len(resp.encodings) == len(texts)
    for enc, text in zip(resp.encodings, texts):
        want = TEXTS[text]
        e2e.check_encoding(f"{mode} {text!r}", enc, model.reference(want), len(want), model.hidden,
                           tokens=True, logits=True)


def test_text_ids_and_embeddings_mix_in_one_request(e2e, models, servers):
    """A request may mix the three kinds; text gives what its ids give, to float32 rounding."""
    model = models.get("text")
    srv = servers.shared("text")
    rng = np.random.default_rng(5)
    emb = e2e.make_embeddings(rng, 6, model.hidden)
    text, want_ids = "The quick brown foxes jumped.", TEXTS["The quick brown foxes jumped."]
    req = e2e.pb.EncodeRequest(return_logits=True)
    req.sequences.add().text = text
    req.sequences.add().token_ids.extend(want_ids)
    req.sequences.add().input_embeddings.extend(emb.astype(np.float32).ravel().tolist())
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    by_text, by_ids, by_emb = resp.encodings
    assert by_text.num_tokens == by_ids.num_tokens == len(want_ids)
    np.testing.assert_allclose(by_text.embedding, by_ids.embedding, rtol=0, atol=1e-6)
    np.testing.assert_allclose(by_text.logits, by_ids.logits, rtol=0, atol=1e-6)
    e2e.check_encoding("embeddings beside text", by_emb, model.reference(emb, "embeddings"), 6, model.hidden,
                       logits=True)


@pytest.mark.parametrize("truncation,keep", [(1, "first"), (2, "last")])
def test_long_text_follows_the_request_truncation(e2e, models, servers, truncation, keep):
    model = models.get("text")
    srv = servers.shared("text")
    text = "the " + "dog " * 600 + "cat"  # 602 words + [CLS] [SEP] > 512 positions
    code, msg = _code(e2e, srv, _text_request(e2e.pb, [text]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert "sequence 0: text:" in msg and "604 tokens" in msg and "max_position_embeddings 512" in msg, msg
    resp = srv.stub.Encode(_text_request(e2e.pb, [text], truncation=truncation), timeout=e2e.RPC_TIMEOUT_S)
    # the tokenizer keeps room for its special tokens: [CLS] + 510 words + [SEP]
    words = ids("the") + ids("dog") * 600 + ids("cat")
    body = words[:510] if keep == "first" else words[-510:]
    want = ids("[CLS]") + body + ids("[SEP]")
    e2e.check_encoding(f"truncation {keep}", resp.encodings[0], model.reference(want), 512, model.hidden)


BAD = {
    "empty": ("", "empty sequence"),
    "whitespace only": (" \t\n ", "tokenizes to no tokens"),
    "control characters only": ("\x01\x02\x7f", "tokenizes to no tokens"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_text_is_invalid_argument_and_costs_no_other_request(e2e, servers, name):
    srv = servers.shared("text")
    text, reason = BAD[name]
    good = _text_request(e2e.pb, ["hello world"] * 3, request_id="good")
    bad = _text_request(e2e.pb, ["hello", text], request_id="bad")
    with cf.ThreadPoolExecutor(4) as pool:
        goods = [pool.submit(srv.stub.Encode, good, timeout=e2e.RPC_TIMEOUT_S) for _ in range(4)]
        code, msg = _code(e2e, srv, bad)
        answers = [f.result() for f in goods]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("sequence 1: ") and reason in msg, (code, msg)
    assert all(len(a.encodings) == 3 and a.encodings[0].num_tokens == 4 for a in answers)


def test_text_with_ids_in_one_sequence_is_refused(e2e, servers):
    srv = servers.shared("text")
    req = e2e.pb.EncodeRequest()
    q = req.sequences.add()
    q.text = "hello"
    q.token_ids.extend([5, 6])
    code, msg = _code(e2e, srv, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert msg == ("sequence 0: text: the sequence also has token_ids; send exactly one of token_ids, "
                   "input_embeddings and text"), msg


def test_model_without_tokenizer_refuses_text(e2e, servers):
    srv = servers.shared("head")
    code, msg = _code(e2e, srv, _text_request(e2e.pb, ["hello world"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert "sequence 0: text: this model takes no text" in msg and "tokenizer.json" in msg, msg


def test_text_counts_against_max_request_tokens(e2e, servers):
    srv = servers.start("text", max_request_tokens=64)
    ok = srv.stub.Encode(_text_request(e2e.pb, ["dog " * 62]), timeout=e2e.RPC_TIMEOUT_S)
    assert ok.encodings[0].num_tokens == 64
    code, msg = _code(e2e, srv, _text_request(e2e.pb, ["dog " * 40, "dog " * 40, "dog " * 40]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert "at least 84 tokens, over max_request_tokens 64" in msg, msg


def test_tokenize_time_is_a_metric(e2e, servers):
    srv = servers.start("text")
    before = srv.metrics()
    n0 = before.value("fastformer_tokenize_duration_seconds_count")
    t0 = before.value("fastformer_texts_total")
    for k in range(1, 4):
        srv.stub.Encode(_text_request(e2e.pb, ["hello world"] * k), timeout=e2e.RPC_TIMEOUT_S)
    srv.stub.Encode(e2e.make_request([[5, 6, 7]]), timeout=e2e.RPC_TIMEOUT_S)  # ids: not counted
    after = srv.metrics()
    assert after.value("fastformer_tokenize_duration_seconds_count") - n0 == 3
    assert after.value("fastformer_texts_total") - t0 == 1 + 2 + 3
    assert after.value("fastformer_tokenize_duration_seconds_sum") > 0


def test_text_that_is_not_utf8_is_named(e2e, servers):
    """proto3 refuses a string that is not UTF-8 when parsing; the server says which one (grpcio
    will not send such a string, so the request is written as bytes)."""
    srv = servers.shared("text")
    raw = srv.channel.unary_unary("/fastformer.v1.Encoder/Encode", request_serializer=lambda b: b,
                                  response_deserializer=e2e.pb.EncodeResponse.FromString)
    good = _text_request(e2e.pb, ["hello", "world"], request_id="utf8").SerializeToString()
    assert [e.num_tokens for e in raw(good, timeout=e2e.RPC_TIMEOUT_S).encodings] == [3, 3]
    bad_text = b"\x1a\x05ab\xc3\x28c"  # Sequence.text = 'ab', a broken 2-byte sequence, 'c'
    cases = {
        "third sequence": (good + b"\x12" + bytes([len(bad_text)]) + bad_text,
                           "sequence 2: text: text is not valid UTF-8 (invalid byte sequence at byte 2)"),
        "request_id": (b"\x0a\x01\xff", "request_id: text is not valid UTF-8 (invalid byte sequence at byte 0)"),
        "not protobuf": (b"\xff\xff\xff", "the request is not a fastformer.v1.EncodeRequest"),
    }
    for name, (payload, message) in cases.items():
        try:
            raw(payload, timeout=e2e.RPC_TIMEOUT_S)
            code, msg = grpc.StatusCode.OK, ""
        except grpc.RpcError as err:
            code, msg = err.code(), err.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and msg.startswith(message), (name, code, msg)


def test_stream_answers_a_message_that_is_not_utf8_in_band_and_goes_on(e2e, servers):
    srv = servers.shared("text")
    raw = srv.channel.stream_stream("/fastformer.v1.Encoder/EncodeStream", request_serializer=lambda b: b,
                                    response_deserializer=e2e.pb.EncodeResponse.FromString)
    good = [_text_request(e2e.pb, ["hello"], request_id=f"good{i}").SerializeToString() for i in range(2)]
    bad = b"\x12\x05\x1a\x03a\xffb"  # one sequence whose text is 'a', 0xff, 'b'
    answers = list(raw(iter([good[0], bad, good[1]]), timeout=e2e.RPC_TIMEOUT_S))
    assert len(answers) == 3, [a.request_id for a in answers]
    by_id = {a.request_id: a for a in answers}
    assert by_id["good0"].encodings[0].num_tokens == by_id["good1"].encodings[0].num_tokens == 3
    err = by_id[""].error
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], err
    assert err.message == "sequence 0: text: text is not valid UTF-8 (invalid byte sequence at byte 1)", err.message

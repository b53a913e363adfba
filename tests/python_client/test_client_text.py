"""Text input through the Python client: encode(["some text", ...]) sends Sequence.text, and the
server's tokenization (the "wordlevel" model's hand-written WordLevel tokenizer.json, tests/client/
text_model.py) gives the ids worked out by hand: the same results as sending those ids, and
num_tokens counts them. A model without tokenizer.json answers text with INVALID_ARGUMENT."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

SAME = 1e-6  # text vs its ids on the same server: the same computation

TEXTS = ["The quick brown fox.", "A cat sat, the dog sat!", "Zebras and the lazy dog", "fox"]


def _long_text(n_words: int) -> str:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", ".", "unknown"]
    return " ".join(words[i % len(words)] + ("" if i % 7 else ",") for i in range(n_words))


def _same(label, got, want):
    assert got.shape == want.shape, f"{label}: {got.shape} vs {want.shape}"
    np.testing.assert_allclose(got, want, rtol=0, atol=SAME, err_msg=label)


# ----------------------------------------------------------------------------- request building


def test_build_request_text_and_mixed_kinds(ffc):
    from fastformer_client._common import build_request
    e = np.ones((2, 8), dtype=np.float32)
    req = build_request(["héllo wörld", [1, 2], e, {"text": "x"}, np.str_("numpy str")])
    assert req.sequences[0].text == "héllo wörld" and not req.sequences[0].token_ids
    assert list(req.sequences[1].token_ids) == [1, 2] and req.sequences[1].text == ""
    assert len(req.sequences[2].input_embeddings) == 16 and req.sequences[2].text == ""
    assert req.sequences[3].text == "x" and req.sequences[4].text == "numpy str"
    # the UTF-8 bytes on the wire
    assert req.sequences[0].SerializeToString() == b"\x1a\x0d" + "héllo wörld".encode("utf-8")


@pytest.mark.parametrize("seqs,needle", [
    ([b"bytes"], "got bytes (decode text to str first)"),
    ([3], "expected text (a str), token ids"),
    ([None], "got NoneType"),
    ([["two", "words"]], "a list of strings; a text is one str"),
    ([{"text": 3}], "sequence 0: text: expected a str, got int"),
    ([{"text": b"x"}], "decode bytes to str first"),
    ([{"txt": "x"}], "unknown keys ['txt'] (token_ids, input_embeddings, text)"),
])
def test_other_element_types_are_type_errors(ffc, seqs, needle):
    from fastformer_client._common import build_request
    with pytest.raises(TypeError) as ei:
        build_request(seqs)
    assert needle in str(ei.value)


def test_text_that_utf8_cannot_carry(ffc):
    from fastformer_client._common import build_request
    with pytest.raises(ffc.InvalidArgument, match=r"sequence 1: text: not valid UTF-8 \(surrogates not allowed at "
                                                  r"character 4\)"):
        build_request(["fine", "bad \udcff"])


def test_a_bare_string_is_not_a_list_of_texts(ffc):
    from fastformer_client._common import build_request
    with pytest.raises(TypeError, match=r"pass a list of texts: encode\(\[\"some text\"\]\)"):
        build_request("some text")


# ----------------------------------------------------------------------------- against the server


def test_text_equals_its_ids(ffc, models, wordlevel, tok, pyc):
    """Each text gives what its hand-worked ids give: embeddings, token embeddings, logits,
    num_tokens; and those agree with the float64 reference."""
    model = models.get("wordlevel")
    ids = [tok.expected_ids(t) for t in TEXTS]
    assert ids[0] == [2, 4, 5, 6, 7, 12, 3]  # [CLS] the quick brown fox . [SEP]
    assert ids[1] == [2, 15, 16, 17, 13, 4, 11, 17, 14, 3]  # "," and "!" are words of their own
    assert ids[2] == [2, 1, 1, 4, 10, 11, 3]  # zebras, and: [UNK]
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        by_text = c.encode(TEXTS, return_token_embeddings=True, return_logits=True)
        by_ids = c.encode(ids, return_token_embeddings=True, return_logits=True)
        plain = c.encode(TEXTS)
    assert by_text.num_tokens == [len(s) for s in ids] == [7, 10, 7, 3]
    _same("embeddings", by_text.embeddings, by_ids.embeddings)
    _same("plain embeddings", plain, by_ids.embeddings)
    _same("logits", by_text.logits, by_ids.logits)
    for i in range(len(TEXTS)):
        _same(f"token_embeddings {i}", by_text.token_embeddings[i], by_ids.token_embeddings[i])
    pyc.check("text", model, ids, "ids", by_text.embeddings, by_text.token_embeddings, by_text.logits)


def test_kinds_mixed_in_one_call(ffc, models, wordlevel, tok, pyc):
    model = models.get("wordlevel")
    rng = np.random.default_rng(21)
    emb = pyc.make_embeddings(rng, 5, model.hidden)
    ids = pyc.make_ids(rng, 30, model.vocab)
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        res = c.encode([TEXTS[1], ids, emb, {"text": TEXTS[0]}, {"token_ids": tok.expected_ids(TEXTS[0])}],
                       return_result=True)
    assert res.num_tokens == [10, 30, 5, 7, 7]
    pyc.check("mixed", model, [tok.expected_ids(TEXTS[1]), ids, emb, tok.expected_ids(TEXTS[0])],
              ["ids", "ids", "embeddings", "ids"], res.embeddings[:4])
    _same("text vs ids in one request", res.embeddings[3], res.embeddings[4])


@pytest.mark.parametrize("truncation,keep_last", [("right", False), ("left", True)])
def test_text_truncation_keeps_special_tokens(ffc, models, wordlevel, tok, truncation, keep_last):
    model = models.get("wordlevel")
    long = _long_text(700)  # about 800 tokens
    assert len(tok.expected_ids(long)) > model.max_positions
    want_ids = tok.expected_ids(long, model.max_positions, keep_last)
    assert len(want_ids) == 512 and want_ids[0] == tok.CLS and want_ids[-1] == tok.SEP
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        res = c.encode([long, "fox"], truncation=truncation, return_result=True)
        want = c.encode([want_ids, tok.expected_ids("fox")], return_result=True)
    assert res.num_tokens == [512, 3]
    _same(f"truncation {truncation}", res.embeddings, want.embeddings)


def test_text_over_max_positions_without_truncation(ffc, wordlevel):
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        with pytest.raises(ffc.InvalidArgument) as ei:
            c.encode(["fox", _long_text(700)])
    assert "sequence 1: text: the text is 793 tokens, over max_position_embeddings 512" in ei.value.details, \
        ei.value.details


def test_bad_text_is_invalid_argument(ffc, wordlevel):
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        for seqs, needle in (([""], "sequence 0: token_ids: empty sequence"),  # "" is no field on the wire
                             (["fox", " \t "], "sequence 1: text: the text tokenizes to no tokens")):
            with pytest.raises(ffc.InvalidArgument) as ei:
                c.encode(seqs)
            assert needle in ei.value.details, ei.value.details


def test_model_without_tokenizer_rejects_text(ffc, head):
    with ffc.Client(head.target, deadline_s=60.0) as c:
        with pytest.raises(ffc.InvalidArgument) as ei:
            c.encode([[5, 6, 7], "some text"])
        info = c.model_info()
    assert "sequence 1: text: this model takes no text: its model directory has no tokenizer.json" in \
        ei.value.details, ei.value.details
    assert info["accepts_text"] is False and info["tokenizer"] == ""


def test_model_info_says_text_is_accepted(ffc, wordlevel, tok):
    with ffc.Client(wordlevel.target) as c:
        info = c.model_info()
    assert info["accepts_text"] is True and info["tokenizer"] == tok.DESCRIPTION
    assert info["accepts_token_ids"] is True


def test_text_in_streams_and_async(ffc, wordlevel, tok):
    reqs = [{"sequences": [TEXTS[0], TEXTS[1]], "request_id": "t"}, {"sequences": [tok.expected_ids(TEXTS[0])]}]
    with ffc.Client(wordlevel.target, deadline_s=60.0) as c:
        by_id = {r.request_id: r for r in c.encode_stream(reqs)}
        want = c.encode([tok.expected_ids(t) for t in TEXTS[:2]])
    assert by_id["t"].num_tokens == [7, 10] and by_id["1"].num_tokens == [7]
    _same("stream", by_id["t"].embeddings, want)

    async def main():
        async with ffc.AsyncClient(wordlevel.target, deadline_s=60.0) as ac:
            res = await ac.encode(TEXTS[:2], return_result=True)
            streamed = [r async for r in ac.encode_stream([[TEXTS[1]]])]
            return res, streamed

    res, streamed = asyncio.run(main())
    assert res.num_tokens == [7, 10] and streamed[0].num_tokens == [10]
    _same("async", res.embeddings, want)
    _same("async stream", streamed[0].embeddings, want[1:])

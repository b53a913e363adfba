"""Late chunking on POST /v1/embeddings (issue 35), Jina's form, through OpenAI's own SDK
(`extra_body={"late_chunking": True}`): the `input` list is one document's consecutive chunks
(texts joined with one space and tokenized once; token ids concatenated as they are), one
embedding per element, each the model's pooler over the element's tokens of the one pass:
checked against the float64 reference pooled from the whole document's token states
(tools/reference.py, reference_span_pool), with the document's ids worked out by hand from the
demo tokenizer's vocabulary."""
from __future__ import annotations

import numpy as np
import openai
import pytest

import make_demo_model as mdm
import reference as ref
from conftest import Server, assert_close, unit

VOCAB = {w: i for i, w in enumerate(mdm.DEMO_WORDS)}
CLS, SEP = VOCAB["[CLS]"], VOCAB["[SEP]"]


@pytest.fixture(scope="module")
def long_server(long_model, logs):
    srv = Server(long_model.dir, logs, "shared-long").wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(long_server):
    c = openai.OpenAI(base_url=f"{long_server.base}/v1", api_key="dummy", max_retries=0, timeout=60)
    yield c
    c.close()


def words(text):  # the demo tokenizer on text of whole vocabulary words: lower-cased, split
    return [VOCAB[w] for w in text.lower().replace(".", " .").split()]


def expected(model, chunks_ids, special=True):
    """Per chunk: the unit reference embedding pooled (the model's pooler) over its tokens of the
    one document the chunks make (between [CLS] and [SEP] when `special`)."""
    doc = [t for c in chunks_ids for t in c]
    if special:
        doc = [CLS] + doc + [SEP]
    spans, at = [], 1 if special else 0
    for c in chunks_ids:
        spans.append((at, at + len(c)))
        at += len(c)
    states = model.reference([doc])[0].token_embeddings
    pooled = ref.reference_span_pool(model.ref_model, states, np.ones(len(doc)), spans, "model")
    return [unit(p) for p in pooled]


def test_texts_are_one_document_with_an_embedding_per_chunk(client, long_model):
    sentence = "The quick brown fox jump over the lazy dog. "
    texts = [(sentence * 30).strip(), "The server has a fast model.", (sentence * 200).strip()]
    r = client.embeddings.create(model=long_model.name, input=texts, extra_body={"late_chunking": True})
    assert [d.index for d in r.data] == [0, 1, 2]
    want = expected(long_model, [words(t) for t in texts])
    for d, w in zip(r.data, want):
        assert_close(np.asarray(d.embedding), w)
    # The same texts without late chunking: each embedded alone, a different vector.
    alone = client.embeddings.create(model=long_model.name, input=texts)
    assert not np.allclose(np.asarray(alone.data[1].embedding), np.asarray(r.data[1].embedding), atol=1e-3)
    n = 2 + sum(len(words(t)) for t in texts)
    assert r.usage.prompt_tokens == n


def test_token_ids_are_concatenated_as_they_are(client, long_model):
    rng = np.random.default_rng(5)
    chunks = [[int(x) for x in rng.integers(4, long_model.vocab, k)] for k in (300, 1, 2000)]
    r = client.embeddings.create(model=long_model.name, input=chunks, extra_body={"late_chunking": True},
                                 encoding_format="float")
    for d, w in zip(r.data, expected(long_model, chunks, special=False)):
        assert_close(np.asarray(d.embedding), w)


@pytest.mark.parametrize("value", ["yes", 1, [True], {"on": True}])
def test_a_late_chunking_that_is_not_a_boolean_is_a_400(client, long_model, value):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=long_model.name, input=["a b", "c"], extra_body={"late_chunking": value})
    assert e.value.status_code == 400
    body = e.value.body if isinstance(e.value.body, dict) else {}
    assert "late_chunking: expected true or false" in str(e.value)
    assert body.get("param") == "late_chunking", body


def test_a_document_over_the_positions_is_refused_naming_the_limit(client, long_model):
    chunks = [[5] * 5000, [6] * 5000]
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=long_model.name, input=chunks, extra_body={"late_chunking": True})
    assert "the document is 10000 tokens, over max_position_embeddings 8192" in str(e.value)


# ----------------------------------------------------------------------------- macro-chunks
# A document over the long model's 8,192 positions with macro_overlap_tokens: passes of 8,192
# tokens every 8,192 - overlap, the last ending at the document's end; each chunk pooled from the
# pass that holds it with the most context (docs/api.md, "Macro-chunks"). The expectation: the
# reference model run on each pass's ids alone, the pass chosen by the rule written out here.

MACRO_DOC = [int(x) for x in np.random.default_rng(11).integers(4, 200, 10000)]
MACRO_P, MACRO_OVERLAP = 8192, 4096
MACRO_STARTS = [0, 10000 - 8192]  # 0 + 8192 < 10000; the next would pass the end: the last ends there


@pytest.fixture(scope="module")
def macro_passes(long_model):
    assert long_model.config.max_position_embeddings == MACRO_P
    return [long_model.reference([MACRO_DOC[a:a + MACRO_P]])[0].token_embeddings for a in MACRO_STARTS]


def macro_expected(model, passes, spans, pooling="model"):
    out = []
    for b, e in spans:
        best, most = None, -1
        for w, a in enumerate(MACRO_STARTS):
            if b >= a and e <= a + MACRO_P and min(b - a, a + MACRO_P - e) > most:
                best, most = w, min(b - a, a + MACRO_P - e)
        a = MACRO_STARTS[best]
        out.append(unit(ref.reference_span_pool(model.ref_model, passes[best], np.ones(MACRO_P),
                                                [(b - a, e - a)], pooling)[0]))
    return out


def test_late_chunking_over_the_positions_with_macro_chunks(client, long_model, macro_passes):
    chunks = [MACRO_DOC[:5000], MACRO_DOC[5000:]]
    r = client.embeddings.create(model=long_model.name, input=chunks,
                                 extra_body={"late_chunking": True, "macro_overlap_tokens": MACRO_OVERLAP})
    # [0, 5000) lies only in pass 0; [5000, 10000) only in pass 1 ([1808, 10000)).
    for d, w in zip(r.data, macro_expected(long_model, macro_passes, [(0, 5000), (5000, 10000)])):
        assert_close(np.asarray(d.embedding), w)


def test_embed_chunks_over_the_positions_with_macro_chunks_by_curl(curl, long_server, long_model,
                                                                    macro_passes):
    r = curl(long_server, "POST", "/embed_chunks",
             {"inputs": MACRO_DOC, "chunking": {"window_tokens": 256, "spans": [[1700, 2000], [9000, 9001]]},
              "macro_overlap_tokens": MACRO_OVERLAP})
    assert r.status == 200, r.body[:300]
    got = r.json()
    want_ranges = [(1700, 2000), (9000, 9001)] + [(b, min(b + 256, 10000)) for b in range(0, 10000, 256)]
    assert [tuple(c["tokens"]) for c in got] == want_ranges
    for c, w in zip(got, macro_expected(long_model, macro_passes, want_ranges)):
        assert_close(np.asarray(c["embedding"]), w)


@pytest.mark.parametrize("value, message", [
    ("x", 'macro_overlap_tokens: expected a non-negative integer, got "x"'),
    (-1, "macro_overlap_tokens: expected a non-negative integer, got -1"),
    (8192, "macro_overlap_tokens: 8192 must be in [0, max_position_embeddings 8192)"),
])
def test_a_bad_macro_overlap_is_a_400_naming_it(client, long_model, value, message):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=long_model.name, input=[[5] * 9000],
                                 extra_body={"macro_overlap_tokens": value})
    assert message in str(e.value), str(e.value)


def test_a_chunk_across_passes_is_refused_by_curl(curl, long_server):
    r = curl(long_server, "POST", "/embed_chunks",
             {"inputs": MACRO_DOC, "chunking": {"spans": [[1000, 9000]]}, "macro_overlap_tokens": 16})
    assert r.status in (400, 422), (r.status, r.body[:300])
    assert "span 0 [1000, 9000) lies in no single macro-chunk" in r.json()["error"], r.json()


# ----------------------------------------------------------------------------- POST /embed_chunks


@pytest.mark.parametrize("pooling", ["model", "mean"])
def test_embed_chunks_by_curl_windows_and_spans(curl, long_server, long_model, pooling):
    """One text, the server's 64-token windows (over its tokens, [CLS] and [SEP] in none) after the
    caller's spans; each chunk normalised, against the reference pooled from the text's one pass."""
    sentence = "The quick brown fox jump over the lazy dog. "
    text = (sentence * 20).strip()
    doc = [CLS] + words(text) + [SEP]
    r = curl(long_server, "POST", "/embed_chunks",
             {"inputs": text, "chunking": {"spans": [[0, len(doc)], [1, 2]], "window_tokens": 64, "overlap_tokens": 8},
              "pooling": pooling})
    assert r.status == 200, r.body[:300]
    got = r.json()
    content = list(range(1, len(doc) - 1))
    windows, s = [], 0
    while s < len(content):
        e = min(s + 64, len(content))
        windows.append((content[s], content[e - 1] + 1))
        if e == len(content):
            break
        s += 56
    want_ranges = [(0, len(doc)), (1, 2)] + windows
    assert [tuple(c["tokens"]) for c in got] == want_ranges
    states = long_model.reference([doc])[0].token_embeddings
    want = ref.reference_span_pool(long_model.ref_model, states, np.ones(len(doc)), want_ranges, pooling)
    for c, w in zip(got, want):
        assert_close(np.asarray(c["embedding"]), unit(w))


@pytest.mark.parametrize("body, message", [
    ({"inputs": ["a", "b"], "chunking": {"window_tokens": 4}}, "inputs: one document"),
    ({"inputs": "the dog", "chunking": {}}, "chunking: give spans, char_spans, sentences or window_tokens"),
    ({"inputs": "the dog", "chunking": {"spans": [[0, 99]]}}, "span 0 [0, 99) is outside"),
    ({"inputs": "the dog", "chunking": {"window_tokens": 2, "overlap_tokens": 2}},
     "overlap_tokens 2 must be in [0, window_tokens 2)"),
    ({"inputs": "the dog", "chunking": {"windows": 2}}, "chunking: unknown field \"windows\""),
    ({"inputs": "the dog", "chunking": {"window_tokens": 2}, "pooling": "max"}, "pooling: expected"),
])
def test_embed_chunks_refusals_by_curl(curl, long_server, body, message):
    r = curl(long_server, "POST", "/embed_chunks", body)
    assert r.status in (400, 413, 422), (r.status, r.body[:300])
    assert message in r.json()["error"], r.json()


def test_hostile_chunks_among_good_requests_cost_no_answer(long_server, long_model):
    """Bad chunking requests, concurrent with good ones on every door, are each refused with
    their message; every good request gets its answer."""
    import concurrent.futures as cf
    text = "The quick brown fox jump over the lazy dog. " * 20
    good = [("/embed_chunks", {"inputs": text, "chunking": {"window_tokens": 32}}),
            ("/v1/embeddings", {"input": ["the dog", "the fox"], "late_chunking": True}),
            ("/embed_chunks", {"inputs": text, "chunking": {"sentences": True}, "pooling": "mean"})] * 6
    bad = [("/embed_chunks", {"inputs": text, "chunking": {"char_spans": [[5, 2]]}}, "is reversed"),
           ("/embed_chunks", {"inputs": text, "chunking": {"char_spans": [[3, 4]]}}, "holds no token's first character"),
           ("/embed_chunks", {"inputs": [1] * 9000, "chunking": {"window_tokens": 8}}, "max_position_embeddings 8192"),
           ("/v1/embeddings", {"input": ["the dog", ""], "late_chunking": True}, "input"),
           ("/v1/embeddings", {"input": ["a"], "late_chunking": "true"}, "late_chunking: expected true or false")] * 3

    def call(item):
        return item, long_server.call("POST", item[0], item[1], timeout=60)

    with cf.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, good + bad))
    for item, r in answers:
        if len(item) == 2:
            assert r.status == 200, (item[0], r.status, r.body[:300])
        else:
            assert r.status in (400, 413, 422), (item, r.status)
            assert item[2] in r.body.decode(), (item, r.body[:300])

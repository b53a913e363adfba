"""Late chunking over gRPC fastformer.v1 through the Python client (issue 35): a sequence's
chunks (the caller's token spans, the server's token windows) pooled from its one pass, against
the PyTorch reference computed from the reference model's token states of the whole sequence
(tools/reference.py, reference_span_pool), on a small model with a tokenizer and 8,192
positions; and the refusals that name the field and the limit, among good requests."""
from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest

import reference as ref

TOL = 1e-4


@pytest.fixture
def long_server(servers):
    return servers.shared("long", max_request_spans=64, max_batch_tokens=8192, max_request_tokens=16384)


@pytest.fixture
def long_model(models):
    return models.get("long")


def windows(positions, w, overlap):
    out, s = [], 0
    while s < len(positions):
        e = min(s + w, len(positions))
        out.append((positions[s], positions[e - 1] + 1))
        if e == len(positions):
            break
        s += w - overlap
    return out


@pytest.mark.parametrize("pooling", ["model", "mean"])
def test_spans_and_windows_of_token_ids_match_the_reference(ffc, long_server, long_model, pooling):
    rng = np.random.default_rng(3)
    n = 5000
    ids = [int(x) for x in rng.integers(4, long_model.vocab, n)]
    spans = [(0, 1), (0, 256), (1000, 1300), (0, n)]
    with ffc.Client(long_server.target, deadline_s=120.0) as client:
        res = client.encode([{"token_ids": ids, "spans": spans, "window_tokens": 1024, "overlap_tokens": 24}],
                            chunk_pooling=pooling)
    want_ranges = spans + windows(list(range(n)), 1024, 24)
    rows, ranges, chars = res.chunks[0]
    assert chars is None  # token ids: no characters
    assert ranges.tolist() == [list(r) for r in want_ranges]
    states = long_model.reference(ids).token_embeddings
    want = ref.reference_span_pool(long_model.model, states, np.ones(n), want_ranges, pooling)
    pyc_close(f"{pooling} chunks", rows, want)
    if pooling == "model":  # the whole-sequence span is the sequence's pooling, bit for bit
        assert np.array_equal(rows[3], res.embeddings[0])


def test_text_windows_leave_the_special_tokens_out(ffc, long_server, long_model, tok):
    """A text's [CLS] and [SEP] belong to no window: windows start at token 1 and end before the
    last; the chunks are pooled from the whole text's one pass."""
    text = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
    with ffc.Client(long_server.target, deadline_s=60.0) as client:
        res = client.encode([{"text": text, "window_tokens": 64, "overlap_tokens": 0}], normalize=True)
        ids = client.encode([text], return_result=True).num_tokens[0]
    n = ids
    rows, ranges, chars = res.chunks[0]
    assert ranges[0][0] == 1 and ranges[-1][1] == n - 1, ranges
    assert all(int(e - b) <= 64 for b, e in ranges)
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_bad_chunks_are_refused_with_the_field_and_the_limit_among_good_requests(ffc, long_server):
    ids = list(range(4, 104))
    bad = {
        "span past the end": ({"token_ids": ids, "spans": [(0, 101)]},
                              "spans: span 0 [0, 101) is outside the sequence's 100 tokens"),
        "reversed": ({"token_ids": ids, "spans": [(5, 2)]}, "spans: span 0 [5, 2) is reversed"),
        "empty": ({"token_ids": ids, "spans": [(5, 5)]}, "spans: span 0 [5, 5) is empty"),
        "too many": ({"token_ids": ids, "spans": [(i, i + 1) for i in range(65)]},
                     "65 chunks, over max_request_spans 64"),
        "windows over the limit": ({"token_ids": ids, "window_tokens": 1},
                                   "100 chunks, over max_request_spans 64"),
        "overlap": ({"token_ids": ids, "window_tokens": 8, "overlap_tokens": 8},
                    "overlap_tokens 8 must be in [0, window_tokens 8)"),
    }

    def call(item):
        name, seq = item
        with ffc.Client(long_server.target, deadline_s=60.0) as client:
            try:
                client.encode([seq] if isinstance(seq, dict) else seq)
                return name, None
            except ffc.InvalidArgument as e:
                return name, str(e)

    goods = [("good", {"token_ids": ids, "spans": [(0, 10)]})] * 8
    work = [(name, seq) for name, (seq, _) in bad.items()] + goods
    with cf.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(call, work))
    for name, message in outcomes:
        if name == "good":
            assert message is None, message
        else:
            assert message is not None and bad[name][1] in message, (name, message)
    with ffc.Client(long_server.target) as client:
        with pytest.raises(ValueError, match="chunk_pooling"):
            client.encode([ids], chunk_pooling="max")


def pyc_close(label, got, want):
    got = np.asarray(got, dtype=np.float64)
    err = np.abs(got - want) / np.maximum(1.0, np.abs(want))
    assert err.max() <= TOL, f"{label}: worst scaled error {err.max():.3e}"


def test_text_chunks_by_characters_and_sentences_with_their_character_ranges(ffc, long_server, long_model):
    """Character spans and sentences of a text: each chunk the tokens whose first character it
    holds (the tokenizer's offsets), its character range answered; pooled from the text's pass."""
    import make_demo_model as mdm
    vocab = {w: i for i, w in enumerate(mdm.DEMO_WORDS)}
    text = "The quick brown fox.  The lazy dog!  Hello world?"
    #       0         1         2         3         4
    with ffc.Client(long_server.target, deadline_s=60.0) as client:
        res = client.encode([{"text": text, "char_spans": [(4, 15), (0, 3)], "sentences": True}])
    rows, ranges, chars = res.chunks[0]
    words = text.lower().replace(".", " .").replace("!", " !").replace("?", " ?").split()
    doc = [vocab["[CLS]"]] + [vocab[w] for w in words] + [vocab["[SEP]"]]
    # "quick brown" = tokens 2..4, "The" = 1..2; sentences: "The quick brown fox." = 1..6,
    # "The lazy dog!" = 6..10, "Hello world?" = 10..13
    assert ranges.tolist() == [[2, 4], [1, 2], [1, 6], [6, 10], [10, 13]]
    assert chars.tolist() == [[4, 15], [0, 3], [0, 20], [22, 35], [37, 49]]
    states = long_model.reference(doc).token_embeddings
    want = ref.reference_span_pool(long_model.model, states, np.ones(len(doc)), ranges.tolist(), "model")
    pyc_close("character chunks", rows, want)


def test_macro_chunks_over_the_positions_through_grpc(ffc, long_server, long_model):
    """A 9,000-token sequence over the 8,192 positions with macro_overlap_tokens=2048: passes
    [0, 8192) and [808, 9000) (the last ends at the sequence's end); each chunk from the pass that
    holds it with the most context, the sequence's embedding the mean of its passes' (normalize
    off), against the reference run on each pass alone. Without the option it is refused."""
    rng = np.random.default_rng(8)
    n, P = 9000, 8192
    ids = [int(x) for x in rng.integers(4, long_model.vocab, n)]
    spans = [(0, 1), (500, 756), (4000, 4256), (8500, 9000)]
    with ffc.Client(long_server.target, deadline_s=300.0) as client:
        with pytest.raises(ffc.InvalidArgument) as e:
            client.encode([{"token_ids": ids, "spans": spans}])
        assert "9000 tokens exceed max_position_embeddings 8192" in str(e.value)
        res = client.encode([{"token_ids": ids, "spans": spans}], macro_overlap_tokens=2048)
    starts = [0, n - P]
    passes = [long_model.reference(ids[a:a + P]) for a in starts]
    # (0,1) and (500,756): pass 0 only; (4000,4256): pass 0 (context 4000 / 3936) over pass 1
    # (3192 / 4744); (8500,9000): pass 1 only.
    chosen = [0, 0, 0, 1]
    want = [ref.reference_span_pool(long_model.model, passes[w].token_embeddings, np.ones(P),
                                    [(b - starts[w], e - starts[w])], "model")[0]
            for (b, e), w in zip(spans, chosen)]
    rows, ranges, _ = res.chunks[0]
    assert ranges.tolist() == [list(s) for s in spans]
    pyc_close("macro-chunk spans", rows, np.asarray(want))
    pyc_close("the mean of the passes' embeddings", res.embeddings[0],
              np.mean([p.embedding for p in passes], axis=0))

"""Late chunking over KServe v2 gRPC through tritonclient (issue 35): the optional `spans`
input, INT64 [chunks, 3] of (row, begin, end) over any rows of the batch in any order, and the
`span_embeddings` output, FP32 [chunks, D] in the spans' order; `parameters.span_pooling`
"model" (default) or "mean". Each chunk against the float64 reference pooled from its row's
token states of one pass (tools/reference.py, reference_span_pool), and the refusals."""
from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import reference as ref
from conftest import Server, close


@pytest.fixture(scope="module")
def long_client(long_model, logs):
    """tritonclient on a server of the 8,192-position model."""
    srv = Server(long_model.dir, logs, "late-chunking-long").wait_ready()
    c = grpcclient.InferenceServerClient(srv.url)
    yield c
    c.close()
    srv.stop()


def infer(client, model, ids, spans, pooling=None, outputs=("embedding", "span_embeddings")):
    inputs = [grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
              grpcclient.InferInput("spans", list(spans.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(spans)
    params = {} if pooling is None else {"span_pooling": pooling}
    return client.infer(model.name, inputs, outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                        parameters=params)


@pytest.mark.parametrize("pooling", [None, "mean"], ids=["model-by-default", "mean"])
def test_spans_over_two_rows_in_any_order_match_the_reference(long_client, long_model, pooling):
    client, model, n = long_client, long_model, 5000
    rng = np.random.default_rng(7)
    ids = rng.integers(1, model.vocab, (2, n)).astype(np.int64)
    spans = np.array([[1, 0, 256], [0, 10, 11], [0, 0, n], [1, 256, n], [0, 100, 4000]], dtype=np.int64)
    result = infer(client, model, ids, spans, pooling)
    got = result.as_numpy("span_embeddings")
    assert got.shape == (len(spans), model.hidden)
    refs = model.reference([list(r) for r in ids])
    mode = pooling or "model"
    for k, (row, b, e) in enumerate(spans):
        want = ref.reference_span_pool(model.ref_model, refs[row].token_embeddings, np.ones(n), [(b, e)], mode)[0]
        ok, worst = close(got[k], want)
        assert ok, f"chunk {k} {tuple(spans[k])}: differs from the reference by {worst:.2e}"
    if mode == "model":  # row 0's whole span is its pooled embedding, bit for bit
        assert np.array_equal(got[2], result.as_numpy("embedding")[0])


@pytest.mark.parametrize("spans, message", [
    (np.array([[0, 0, 501]]), "spans: row 0: span 0 [0, 501) is outside the sequence's 500 tokens"),
    (np.array([[2, 0, 5]]), "spans: a chunk names row 2, but the request has 2 rows"),
    (np.array([[0, 5, 5]]), "spans: row 0: span 0 [5, 5) is empty"),
    (np.array([[0, 0, 5, 1]]), "spans: shape [1, 4] must be [chunks, 3]"),
])
def test_bad_spans_are_refused_naming_the_tensor(client, model, spans, message):
    ids = np.ones((2, 500), dtype=np.int64)
    with pytest.raises(InferenceServerException) as e:
        infer(client, model, ids, spans.astype(np.int64))
    assert "INVALID_ARGUMENT" in str(e.value.status()) and message in e.value.message(), e.value.message()


def test_span_pooling_must_be_model_or_mean(client, model):
    ids = np.ones((1, 10), dtype=np.int64)
    with pytest.raises(InferenceServerException) as e:
        infer(client, model, ids, np.array([[0, 0, 5]], dtype=np.int64), "max")
    assert "parameters: span_pooling must be the string" in e.value.message()


def test_macro_chunks_parameter_for_a_row_over_the_positions(long_client, long_model):
    """parameters.macro_overlap_tokens (int64): a 9,000-token row over the 8,192 positions runs as
    passes [0, 8192) and [808, 9000); each chunk from the pass that holds it with the most
    context, the row's embedding the mean of its passes', against the reference run on each
    pass alone. Without the parameter the row is refused naming the limit."""
    client, model, n, P = long_client, long_model, 9000, 8192
    ids = np.random.default_rng(9).integers(1, model.vocab, (1, n)).astype(np.int64)
    spans = np.array([[0, 0, 1], [0, 4000, 4256], [0, 8500, 9000]], dtype=np.int64)
    with pytest.raises(InferenceServerException) as e:
        infer(client, model, ids, spans)
    assert "9000 tokens exceed max_position_embeddings 8192" in str(e.value)
    inputs = [grpcclient.InferInput("input_ids", list(ids.shape), "INT64"),
              grpcclient.InferInput("spans", list(spans.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(spans)
    result = client.infer(model.name, inputs, parameters={"macro_overlap_tokens": 2048},
                          outputs=[grpcclient.InferRequestedOutput(o) for o in ("embedding", "span_embeddings")])
    starts = [0, n - P]
    passes = [model.reference([list(ids[0, a:a + P])])[0] for a in starts]
    # (0, 1): pass 0 only; (4000, 4256): context 4000 / 3936 in pass 0 against 3192 / 4744 in
    # pass 1, so pass 0; (8500, 9000): pass 1 only.
    for k, ((_, b, e), w) in enumerate(zip(spans, [0, 0, 1])):
        a = starts[w]
        want = ref.reference_span_pool(model.ref_model, passes[w].token_embeddings, np.ones(P),
                                       [(b - a, e - a)], "model")[0]
        ok, worst = close(result.as_numpy("span_embeddings")[k], want)
        assert ok, f"chunk {k}: differs from the reference by {worst:.2e}"
    ok, worst = close(result.as_numpy("embedding")[0], np.mean([p.embedding for p in passes], axis=0))
    assert ok, f"the row's embedding differs from the mean of its passes' by {worst:.2e}"

"""The TEI routes through the clients that speak them: llama-index's TextEmbeddingsInference
(POST /embed) and huggingface_hub's InferenceClient (POST / for a URL model), each behind a
recording proxy so that what the client actually sends is asserted too."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import GRPC_TOL, TEXT, TEXTS, assert_close


def test_llama_index_text_embeddings_inference(server, text_model, grpc_encode, recorder):
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    proxy = recorder(server.http_port)
    emb = TextEmbeddingsInference(base_url=proxy.base, model_name=text_model.name, timeout=30)
    one = emb.get_text_embedding(TEXT)
    assert_close(one, text_model.unit(TEXTS[TEXT]))
    np.testing.assert_allclose(one, grpc_encode(server, [TEXT], kind="text")[0]["embedding"], rtol=0, atol=GRPC_TOL)
    texts = list(TEXTS)
    many = emb.get_text_embedding_batch(texts)
    for text, e in zip(texts, many):
        assert_close(e, text_model.unit(TEXTS[text]), what=repr(text))
    assert_close(emb.get_query_embedding("the lazy dog"), text_model.unit(TEXTS["the lazy dog"]))

    # What it sends: POST /embed {"inputs": [...], "truncate": true}, no `normalize` (so TEI's
    # default, true, applies) and not the model name.
    assert proxy.requests and all(r.method == "POST" and r.path == "/embed" for r in proxy.requests)
    first = proxy.requests[0].json()
    assert first == {"inputs": [TEXT], "truncate": True}, first
    assert all("normalize" not in r.json() and "model" not in r.json() for r in proxy.requests)


def test_huggingface_hub_feature_extraction(embed_server, embed_model, grpc_encode, recorder):
    from huggingface_hub import InferenceClient

    proxy = recorder(embed_server.http_port)
    client = InferenceClient(model=proxy.base, timeout=30)
    out = np.asarray(client.feature_extraction(TEXT))
    assert out.shape == (1, embed_model.hidden)
    assert_close(out[0], embed_model.unit(TEXTS[TEXT]))
    via_grpc = grpc_encode(embed_server, [TEXT], kind="text")[0]["embedding"]
    np.testing.assert_allclose(out[0], via_grpc, rtol=0, atol=GRPC_TOL)
    # What it sends: POST / with {"inputs": "<text>"} and nothing else.
    sent = proxy.requests[-1]
    assert (sent.method, sent.path) == ("POST", "/"), (sent.method, sent.path)
    assert sent.json() == {"inputs": TEXT}

    # normalize=False is sent as a top-level field: the raw pooled embedding
    raw = np.asarray(client.feature_extraction("the lazy dog", normalize=False))
    assert proxy.requests[-1].json().get("normalize") is False, proxy.requests[-1].body
    want = embed_model.reference([TEXTS["the lazy dog"]])[0].embedding
    assert_close(raw[0], want)


def test_huggingface_hub_on_a_classifier_model_gets_predictions(server, recorder):
    """POST / on a model with a classifier head is /predict (as TEI routes it), which
    feature_extraction cannot read: the client fails; text_classification is the way."""
    from huggingface_hub import InferenceClient

    proxy = recorder(server.http_port)
    client = InferenceClient(model=proxy.base, timeout=30)
    with pytest.raises(Exception):
        client.feature_extraction(TEXT)
    assert proxy.requests[-1].path == "/"
    r = server.call("POST", "/", {"inputs": TEXT})
    assert r.status == 200 and [set(x) for x in r.json()] == [{"score", "label"}] * 3

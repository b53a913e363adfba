"""Prompts (issue 49, docs/api.md "Prompts"): a model that ships sentence-transformers'
config_sentence_transformers.json, and every API's way of naming one of its prompts, each checked
with its own client against the float64 reference run on the ids of prompt + text, worked out
by hand from DEMO_WORDS (never asked of the server):

  TEI        huggingface_hub's InferenceClient.feature_extraction(..., prompt_name=...)
  OpenAI     the openai SDK, extra_body={"prompt_name": ...}
  Cohere     the cohere SDK's input_type (search_query: the "query" prompt; another input_type
             the model has no prompt for: none, never refused)
  KServe v2  tritonclient.http, parameters={"prompt_name": ...}
  gRPC       the Python client (client/python, fastformer_client), encode(..., prompt_name=...)

and late chunking with a prompt keeps the caller's positions.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

import reference as ref
from conftest import REPO, Model, Server, assert_close, ids, unit

PROMPT_SPEC = dict(hidden=64, heads=4, layers=2, intermediate=128, max_positions=512, vocab=1000, act="gelu",
                   seed=15, num_labels=0, model_name="http-prompts", tokenizer=True)
PROMPTS = {"query": "the lazy dog: ", "document": "document: "}
QUERY = ("the", "lazy", "dog", ":")  # "the lazy dog: " by hand
TEXT = "Café, HELLO world!"
TEXT_TOKENS = ("cafe", ",", "hello", "world", "!")


def prompted(*prefix):
    return ids("[CLS]", *prefix, *TEXT_TOKENS, "[SEP]")


@pytest.fixture(scope="module")
def prompt_model(models_root):
    m = Model(models_root, PROMPT_SPEC)
    (m.dir / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": PROMPTS, "default_prompt_name": None, "similarity_fn_name": "cosine"}))
    return m


@pytest.fixture(scope="module")
def srv(prompt_model, logs):
    s = Server(prompt_model.dir, logs, "prompts").wait_ready()
    yield s
    s.stop()


def test_tei_info_lists_the_prompts_and_an_unknown_name_is_refused(srv):
    info = srv.call("GET", "/info").json()
    assert info["prompts"] == PROMPTS
    assert info["default_prompt_name"] is None
    r = srv.call("POST", "/embed", {"inputs": TEXT, "prompt_name": "passage"})
    assert r.status == 422, r.body
    assert r.error_message() == ("prompt_name: 'passage' is not a prompt of this model; its prompts: "
                                 "'document', 'query'")


def test_huggingface_hub_prompt_name(srv, prompt_model):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=srv.base, timeout=30)
    got = np.asarray(client.feature_extraction(TEXT, prompt_name="query"), dtype=np.float64).reshape(-1)
    assert_close(got, prompt_model.unit(prompted(*QUERY)))
    plain = np.asarray(client.feature_extraction(TEXT), dtype=np.float64).reshape(-1)
    assert_close(plain, prompt_model.unit(prompted()))
    assert not np.allclose(got, plain, atol=1e-3)  # the prompt changed the embedding


def test_openai_sdk_extra_body(srv, prompt_model):
    import openai

    client = openai.OpenAI(api_key="any", base_url=srv.base + "/v1", timeout=30, max_retries=0)
    r = client.embeddings.create(input=[TEXT, "the lazy dog"], model="http-prompts", encoding_format="float",
                                 extra_body={"prompt_name": "document"})
    assert_close(r.data[0].embedding, prompt_model.unit(prompted("document", ":")))
    assert_close(r.data[1].embedding,
                 prompt_model.unit(ids("[CLS]", "document", ":", "the", "lazy", "dog", "[SEP]")))
    # usage counts the prompt's tokens: the model ran them
    assert r.usage.prompt_tokens == len(prompted("document", ":")) + 7
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(input=[[5, 6, 7]], model="http-prompts", extra_body={"prompt_name": "query"})
    assert "is put before text, and this row is token ids" in str(e.value)


def test_cohere_input_type(srv, prompt_model):
    import cohere

    client = cohere.ClientV2(api_key="any", base_url=srv.base, timeout=30)
    query = client.embed(texts=[TEXT], model="http-prompts", input_type="search_query", embedding_types=["float"])
    assert_close(query.embeddings.float_[0], prompt_model.unit(prompted(*QUERY)))
    doc = client.embed(texts=[TEXT], model="http-prompts", input_type="search_document", embedding_types=["float"])
    assert_close(doc.embeddings.float_[0], prompt_model.unit(prompted("document", ":")))
    # an input_type the model has no prompt for: no prompt, not a refusal
    other = client.embed(texts=[TEXT], model="http-prompts", input_type="clustering", embedding_types=["float"])
    assert_close(other.embeddings.float_[0], prompt_model.unit(prompted()))


def test_tritonclient_parameter(srv, prompt_model):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{srv.http_port}")
    text = httpclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=object))
    result = client.infer("http-prompts", [text], outputs=[httpclient.InferRequestedOutput("embedding")],
                          parameters={"prompt_name": "query", "normalize": True})
    assert_close(result.as_numpy("embedding")[0], prompt_model.unit(prompted(*QUERY)))
    config = client.get_model_config("http-prompts")
    assert json.loads(config["parameters"]["prompts"]["string_value"]) == {"prompts": PROMPTS,
                                                                           "default_prompt_name": None}


def test_python_grpc_client(srv, prompt_model):
    sys.path.insert(0, str(REPO / "client" / "python"))
    try:
        from fastformer_client import Client
    finally:
        sys.path.pop(0)
    with Client(srv.url) as client:
        assert client.model_info()["prompts"] == PROMPTS
        got = client.encode([TEXT], normalize=True, prompt_name="query")
    assert_close(got[0], prompt_model.unit(prompted(*QUERY)))


def test_late_chunking_keeps_the_callers_positions(srv, prompt_model):
    body = {"inputs": TEXT, "chunking": {"spans": [[1, 3]], "char_spans": [[6, 11]]}}
    plain = srv.call("POST", "/embed_chunks", body).json()
    with_prompt = srv.call("POST", "/embed_chunks", dict(body, prompt_name="query")).json()
    # The same tokens and characters as the caller sent them: "cafe ," and "hello".
    assert [c["tokens"] for c in with_prompt] == [c["tokens"] for c in plain] == [[1, 3], [3, 4]]
    assert [c["text"] for c in with_prompt] == [c["text"] for c in plain] == [[0, 5], [6, 11]]
    # Each chunk pooled from the one pass over prompt + text, its tokens past the prompt's.
    seq = prompted(*QUERY)
    states = prompt_model.reference([seq])[0].token_embeddings
    want = ref.reference_span_pool(prompt_model.ref_model, states, np.ones(len(seq)),
                                   [(1 + len(QUERY), 3 + len(QUERY)), (3 + len(QUERY), 4 + len(QUERY))], "model")
    for chunk, w in zip(with_prompt, want):
        assert_close(chunk["embedding"], unit(w))


def test_the_offline_encoder_reads_the_same_prompts(prompt_model, tmp_path):
    """fastformer-encode (the server's request layer, JSON lines) with --prompt-name."""
    import subprocess

    from conftest import binary

    lines = tmp_path / "in.jsonl"
    lines.write_text(json.dumps({"text": TEXT}) + "\n")
    out = subprocess.run([str(binary("fastformer-encode")), "--model-dir", str(prompt_model.dir), "--backend",
                          "cpu", "--dtype", "float32", "--threads", "1", "--normalize", "--prompt-name", "query",
                          "--input", str(lines)], check=True, capture_output=True, text=True).stdout
    assert_close(json.loads(out.splitlines()[0])["embedding"], prompt_model.unit(prompted(*QUERY)))
    bad = subprocess.run([str(binary("fastformer-encode")), "--model-dir", str(prompt_model.dir), "--backend", "cpu",
                          "--prompt-name", "passage", "--input", str(lines)], capture_output=True, text=True)
    assert bad.returncode != 0
    assert "'passage' is not a prompt of this model; its prompts: 'document', 'query'" in bad.stderr + bad.stdout

"""POST /v1/embeddings and GET /v1/models through OpenAI's own Python SDK (and langchain-openai
over it), unchanged: base64 (the SDK's default) and float, one text, a list, token ids,
`dimensions`, `usage`, aliases, and errors mapped to the SDK's exceptions. Every embedding is the
float64 reference's (normalised) and the gRPC Encoder's for the same input."""

from __future__ import annotations

import numpy as np
import openai
import pytest

from conftest import ALIASES, GRPC_TOL, TEXT, TEXTS, Server, assert_close, unit


def sdk(srv, api_key="dummy", **kw):
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key=api_key, max_retries=0, timeout=30, **kw)


@pytest.fixture(scope="module")
def client(server):
    c = sdk(server)
    yield c
    c.close()


@pytest.mark.parametrize("encoding_format", [None, "float"], ids=["sdk-default-base64", "float"])
def test_one_text_is_the_reference_and_grpc(client, server, text_model, grpc_encode, encoding_format):
    kw = {} if encoding_format is None else {"encoding_format": encoding_format}
    r = client.embeddings.create(model=text_model.name, input=TEXT, **kw)
    assert r.object == "list" and r.model == text_model.name and len(r.data) == 1
    d = r.data[0]
    assert d.object == "embedding" and d.index == 0
    emb = np.asarray(d.embedding, dtype=np.float64)
    assert emb.shape == (text_model.hidden,)
    assert abs(np.linalg.norm(emb) - 1) < 1e-5, "OpenAI embeddings have length 1"
    assert_close(emb, text_model.unit(TEXTS[TEXT]))
    via_grpc = grpc_encode(server, [TEXT], kind="text")[0]["embedding"]
    np.testing.assert_allclose(emb, via_grpc, rtol=0, atol=GRPC_TOL)
    assert r.usage.prompt_tokens == len(TEXTS[TEXT]) == r.usage.total_tokens


def test_the_sdk_asks_for_base64_unless_told(server, text_model, recorder):
    proxy = recorder(server.http_port)
    with openai.OpenAI(base_url=f"{proxy.base}/v1", api_key="dummy", max_retries=0) as c:
        c.embeddings.create(model=text_model.name, input=TEXT)
        c.embeddings.create(model=text_model.name, input=TEXT, encoding_format="float")
    sent = [r.json() for r in proxy.requests]
    assert [r.path for r in proxy.requests] == ["/v1/embeddings"] * 2
    assert sent == [{"model": text_model.name, "input": TEXT, "encoding_format": "base64"},
                    {"model": text_model.name, "input": TEXT, "encoding_format": "float"}], sent
    assert proxy.requests[0].headers["authorization"] == "Bearer dummy"


def test_base64_and_float_are_the_same_floats(client, text_model):
    texts = list(TEXTS)
    b64 = client.embeddings.create(model=text_model.name, input=texts)  # decoded by the SDK
    flt = client.embeddings.create(model=text_model.name, input=texts, encoding_format="float")
    for a, b in zip(b64.data, flt.data):
        # base64 carries the float32 bits; JSON floats are printed to round-trip float32
        np.testing.assert_array_equal(np.asarray(a.embedding, np.float32), np.asarray(b.embedding, np.float32))


@pytest.mark.parametrize("encoding_format", [None, "float"], ids=["sdk-default-base64", "float"])
def test_a_list_of_texts_in_order(client, server, text_model, grpc_encode, encoding_format):
    texts = list(TEXTS)
    kw = {} if encoding_format is None else {"encoding_format": encoding_format}
    r = client.embeddings.create(model=text_model.name, input=texts, **kw)
    assert [d.index for d in r.data] == list(range(len(texts)))
    via_grpc = grpc_encode(server, texts, kind="text")
    for text, d, g in zip(texts, r.data, via_grpc):
        assert_close(d.embedding, text_model.unit(TEXTS[text]), what=repr(text))
        np.testing.assert_allclose(d.embedding, g["embedding"], rtol=0, atol=GRPC_TOL)
    assert r.usage.prompt_tokens == sum(len(v) for v in TEXTS.values())


def test_token_id_inputs(client, server, text_model, grpc_encode):
    one = [5, 17, 200, 999, 42]
    batch = [[7, 8, 9], [300, 301, 302, 303, 304, 305, 306]]
    r = client.embeddings.create(model=text_model.name, input=one, encoding_format="float")
    assert len(r.data) == 1 and r.usage.prompt_tokens == len(one)
    assert_close(r.data[0].embedding, text_model.unit(one))
    r = client.embeddings.create(model=text_model.name, input=batch)
    assert len(r.data) == 2 and r.usage.prompt_tokens == sum(map(len, batch))
    via_grpc = grpc_encode(server, batch)
    for seq, d, g in zip(batch, r.data, via_grpc):
        assert_close(d.embedding, text_model.unit(seq))
        np.testing.assert_allclose(d.embedding, g["embedding"], rtol=0, atol=GRPC_TOL)


@pytest.mark.parametrize("encoding_format", [None, "float"], ids=["sdk-default-base64", "float"])
def test_dimensions_is_the_first_values_renormalised(client, text_model, encoding_format):
    kw = {} if encoding_format is None else {"encoding_format": encoding_format}
    full = client.embeddings.create(model=text_model.name, input=TEXT, encoding_format="float").data[0].embedding
    cut = client.embeddings.create(model=text_model.name, input=TEXT, dimensions=8, **kw).data[0].embedding
    assert len(cut) == 8
    np.testing.assert_allclose(cut, unit(full[:8]), rtol=0, atol=1e-6)
    assert_close(cut, unit(text_model.unit(TEXTS[TEXT])[:8]))
    same = client.embeddings.create(model=text_model.name, input=TEXT, dimensions=text_model.hidden,
                                    encoding_format="float").data[0].embedding
    np.testing.assert_allclose(same, full, rtol=0, atol=1e-6)


def test_user_field_is_accepted(client, text_model):
    r = client.embeddings.create(model=text_model.name, input="the lazy dog", user="user-1234")
    assert_close(r.data[0].embedding, text_model.unit(TEXTS["the lazy dog"]))


def test_models_list_and_alias(client, text_model):
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert ids == [text_model.name] + ALIASES
    for m in listed.data:
        assert m.object == "model" and m.owned_by and m.created > 1_600_000_000
    assert client.models.retrieve(ALIASES[1]).id == ALIASES[1]
    r = client.embeddings.create(model=ALIASES[0], input=TEXT)
    assert r.model == ALIASES[0], "the response names the model as asked"
    assert_close(r.data[0].embedding, text_model.unit(TEXTS[TEXT]))


def test_unknown_model_is_not_found_error(client, text_model):
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="no-such-model", input=TEXT)
    e = err.value
    assert e.status_code == 404 and e.code == "model_not_found" and e.param == "model"
    assert "no-such-model" in e.message and text_model.name in e.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_dimensions_over_hidden_size_is_bad_request(client, text_model):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=text_model.name, input=TEXT, dimensions=text_model.hidden + 1)
    e = err.value
    assert e.status_code == 400 and e.param == "dimensions"
    assert "dimensions" in e.message and str(text_model.hidden) in e.message and "hidden_size" in e.message


def test_bad_input_is_bad_request_naming_the_row(client, text_model):
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=text_model.name, input=["the dog", ""])
    assert "input[1]" in err.value.message and "empty" in err.value.message


@pytest.fixture(scope="module")
def auth_server(text_model, logs, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text("first-token\nsecond-token\n")
    srv = Server(text_model.dir, logs, "openai-auth", auth_token_file=tokens).wait_ready()
    yield srv
    srv.stop()


def test_bearer_tokens(auth_server, text_model):
    for key in ("wrong-token", "first-token-but-longer"):
        with sdk(auth_server, api_key=key) as bad:
            with pytest.raises(openai.AuthenticationError) as err:
                bad.embeddings.create(model=text_model.name, input=TEXT)
            assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
            with pytest.raises(openai.AuthenticationError):
                bad.models.list()
    for key in ("first-token", "second-token"):
        with sdk(auth_server, api_key=key) as good:
            r = good.embeddings.create(model=text_model.name, input=TEXT)
            assert_close(r.data[0].embedding, text_model.unit(TEXTS[TEXT]))
    # health stays open
    assert auth_server.call("GET", "/health").status == 200
    r = auth_server.call("POST", "/v1/embeddings", {"input": TEXT})  # no authorization at all
    assert r.status == 401 and r.headers.get("www-authenticate", "").lower().startswith("bearer")
    assert r.json()["error"]["type"] == "authentication_error"


# ----------------------------------------------------------------------------- langchain-openai


def test_langchain_openai_embeddings(server, text_model):
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(model=text_model.name, base_url=f"{server.base}/v1", api_key="dummy",
                           check_embedding_ctx_length=False, max_retries=0)
    texts = list(TEXTS)
    docs = emb.embed_documents(texts)
    assert len(docs) == len(texts)
    for text, d in zip(texts, docs):
        assert_close(d, text_model.unit(TEXTS[text]), what=repr(text))
    assert_close(emb.embed_query("the lazy dog"), text_model.unit(TEXTS["the lazy dog"]))
    # through an alias, and with dimensions (langchain passes it through)
    cut = OpenAIEmbeddings(model=ALIASES[1], base_url=f"{server.base}/v1", api_key="dummy",
                           check_embedding_ctx_length=False, dimensions=16, max_retries=0)
    assert_close(cut.embed_query(TEXT), unit(text_model.unit(TEXTS[TEXT])[:16]))


# ----------------------------------------------------------------------------- TLS


def test_tls_with_the_sdk(start, text_model, tmp_path):
    """With --tls-cert/--tls-key the HTTP listener speaks HTTPS: the SDK trusting the server's
    certificate gets the embedding; a plaintext request gets no HTTP answer."""
    import http.client
    import shutil
    import ssl
    import subprocess
    import time

    import httpx

    if shutil.which("openssl") is None:
        pytest.fail("openssl not found: it makes the test certificate (apt-get install openssl)", pytrace=False)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "server.key", "-out", "server.pem", "-days", "2", "-subj", "/CN=fastformer http test",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=tmp_path, check=True, capture_output=True)
    pem = str(tmp_path / "server.pem")
    srv = start(text_model, wait=False, tls_cert=pem, tls_key=tmp_path / "server.key")
    ctx = ssl.create_default_context(cafile=pem)
    deadline = time.monotonic() + 30
    while True:
        assert srv.proc.poll() is None, srv.log_tail()
        try:
            c = http.client.HTTPSConnection("127.0.0.1", srv.http_port, context=ctx, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                c.close()
                break
            c.close()
        except OSError:
            pass
        assert time.monotonic() < deadline, f"no HTTPS /health after 30 s\n{srv.log_tail()}"
        time.sleep(0.05)
    with openai.OpenAI(base_url=f"https://127.0.0.1:{srv.http_port}/v1", api_key="dummy", max_retries=0,
                       http_client=httpx.Client(verify=ctx)) as client:
        r = client.embeddings.create(model=text_model.name, input=TEXT)
    assert_close(r.data[0].embedding, text_model.unit(TEXTS[TEXT]))
    with pytest.raises((OSError, http.client.HTTPException)):
        c = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=5)
        try:
            c.request("GET", "/health")
            c.getresponse()
        finally:
            c.close()


def test_pad_ids_are_not_counted_in_usage(client, server, text_model, grpc_encode):
    """pad_token_id (0) in an id input is padding: not in usage, masked as the reference masks it."""
    seqs = [[5, 6, 7, 0, 0], [8, 0, 9, 10]]
    r = client.embeddings.create(model=text_model.name, input=seqs, encoding_format="float")
    assert r.usage.prompt_tokens == 6, r.usage
    via_grpc = grpc_encode(server, seqs)
    for seq, d, g in zip(seqs, r.data, via_grpc):
        assert_close(d.embedding, text_model.unit(seq))
        np.testing.assert_allclose(d.embedding, g["embedding"], rtol=0, atol=GRPC_TOL)


def test_unknown_fields_are_ignored(server, text_model):
    r = server.call("POST", "/v1/embeddings?trace=1", {"input": TEXT, "some_future_field": {"a": [1]}, "model": None})
    assert r.status == 200 and r.json()["model"] == text_model.name
    assert_close(r.json()["data"][0]["embedding"], text_model.unit(TEXTS[TEXT]))

"""Embedding types on POST /v1/embeddings (docs/api.md, "Embedding types"): int8, uint8, binary and
ubinary answered bit for bit as sentence-transformers' own quantize_embeddings gives them for the
server's float answer and the version's calibrated ranges (tools/calibrate_quantization.py),
through the openai SDK (extra_body) and curl; the refusals named; a 768-dimension ubinary
answer in base64 against the float JSON's size; hostile requests among good ones.

The reference: sentence-transformers 6.3.0's util/quantization.py, installed without its
dependencies into the venv (mk/cache.mk) and loaded alone (its package's __init__ needs
transformers), with numpy and Debian's torch.
"""

from __future__ import annotations

import base64
import concurrent.futures as cf
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import openai
import pytest
from conftest import BASE_SPEC, REPO, TEXTS, Model

CORPUS = list(TEXTS) + ["the lazy dog jumped", "hello world", "brown fox", "quick quick quick"]
TYPES = ["int8", "uint8", "binary", "ubinary"]


def st_quantize():
    """sentence_transformers.util.quantization.quantize_embeddings, loaded from its file."""
    spec = importlib.util.find_spec("sentence_transformers")
    assert spec and spec.submodule_search_locations, "sentence-transformers is not installed (mk/cache.mk)"
    util = Path(spec.submodule_search_locations[0]) / "util"
    package = types.ModuleType("st_util")
    package.__path__ = [str(util)]
    sys.modules["st_util"] = package
    for name in ("tensor", "quantization"):
        s = importlib.util.spec_from_file_location(f"st_util.{name}", util / f"{name}.py")
        module = importlib.util.module_from_spec(s)
        sys.modules[f"st_util.{name}"] = module
        s.loader.exec_module(module)
    return sys.modules["st_util.quantization"].quantize_embeddings


@pytest.fixture(scope="module")
def quantize():
    return st_quantize()


def calibrate(model_dir: Path, dims: str):
    corpus = model_dir / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in CORPUS))
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "calibrate_quantization.py"), "--model-dir", str(model_dir),
         "--corpus", str(corpus), "--dimensions", dims, "--dtype", "float32"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads((model_dir / "quantization.json").read_text())


@pytest.fixture(scope="module")
def typed(models_root, start):
    """A 64-dimension text model with ranges for 64 and 32 dimensions, and its server."""
    model = Model(models_root, dict(BASE_SPEC, seed=21, num_labels=0, model_name="http-types", tokenizer=True))
    ranges = calibrate(model.dir, "64,32")
    srv = start(model, dtype="float32")
    return model, srv, {r["dimensions"]: np.array([r["min"], r["max"]], dtype=np.float32) for r in ranges["ranges"]}


# `start` is function-scoped in conftest: a module-scoped one for the fixtures above.
@pytest.fixture(scope="module")
def start(logs):
    from conftest import Server, stop_all

    started = []

    def _start(model, **flags):
        srv = Server(model.dir, logs, f"types-{len(started)}", **flags)
        started.append(srv)
        return srv.wait_ready()

    yield _start
    stop_all(started)


def client(srv):
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="dummy", max_retries=0, timeout=30)


def floats(srv, texts, dims=None):
    body = {"input": texts, **({"dimensions": dims} if dims else {})}
    reply = srv.call("POST", "/v1/embeddings", body)
    assert reply.status == 200, reply.body
    return np.array([d["embedding"] for d in reply.json()["data"]], dtype=np.float32)


@pytest.mark.parametrize("dims", [64, 32])
@pytest.mark.parametrize("kind", TYPES)
def test_openai_sdk_matches_sentence_transformers(typed, quantize, kind, dims):
    model, srv, ranges = typed
    want = quantize(floats(srv, CORPUS, dims), kind, ranges=ranges[dims])
    # encoding_format "float" (integers for these types): the SDK asks for base64 when not told,
    # and decodes base64 as float32.
    with client(srv) as c:
        got = c.embeddings.create(model=model.name, input=CORPUS, dimensions=dims, encoding_format="float",
                                  extra_body={"embedding_type": kind})
    assert np.array_equal(np.array([d.embedding for d in got.data]), want.astype(np.int64)), kind
    # encoding_format base64: the type's bytes.
    reply = srv.call("POST", "/v1/embeddings", {"input": CORPUS, "dimensions": dims, "embedding_type": kind,
                                                "encoding_format": "base64"})
    assert reply.status == 200, reply.body
    raw = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=want.dtype) for d in reply.json()["data"]]
    assert np.array_equal(np.stack(raw), want)


def test_curl_and_jina_names(typed, quantize, curl):
    model, srv, ranges = typed
    f = floats(srv, CORPUS[:2])
    reply = curl(srv, "POST", "/v1/embeddings", {"input": CORPUS[:2], "embedding_type": "ubinary"})
    assert reply.status == 200, reply.body
    assert [d["embedding"] for d in reply.json()["data"]] == quantize(f, "ubinary").tolist()
    # Jina's "base64" embedding type: the float32 values' bytes.
    reply = curl(srv, "POST", "/v1/embeddings", {"input": CORPUS[:2], "embedding_type": "base64"})
    got = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in reply.json()["data"]])
    assert np.array_equal(got, f)


@pytest.mark.parametrize(
    "extra, status, words",
    [
        ({"embedding_type": "int4"}, 400, ['embedding_type: expected "float", "int8"', 'got "int4"']),
        ({"embedding_type": 8}, 400, ["embedding_type: expected", "got an integer"]),
        ({"embedding_type": "binary", "dimensions": 60}, 400, ["multiple of 8, got 60"]),
        ({"embedding_type": "int8", "dimensions": 48}, 400, ["48 dimensions", "quantization.json", "it has: 64, 32"]),
    ],
)
def test_refusals_name_the_field_and_the_limit(typed, extra, status, words):
    _, srv, _ = typed
    reply = srv.call("POST", "/v1/embeddings", {"input": "hello world", **extra})
    assert reply.status == status, reply.body
    message = reply.error_message()
    for w in words:
        assert w in message, message
    assert reply.json()["error"]["param"] == "embedding_type"


def test_int8_without_ranges_names_the_file(embed_server, embed_model):
    reply = embed_server.call("POST", "/v1/embeddings", {"input": "hello", "embedding_type": "uint8"})
    assert reply.status == 400, reply.body
    assert str(embed_model.dir / "quantization.json") in reply.error_message()
    # binary types need no ranges
    reply = embed_server.call("POST", "/v1/embeddings", {"input": "hello", "embedding_type": "binary"})
    assert reply.status == 200, reply.body
    assert len(reply.json()["data"][0]["embedding"]) == embed_model.hidden // 8


def test_768_dimension_ubinary_base64_is_at_most_a_24th_of_float_json(models_root, start):
    model = Model(models_root, dict(BASE_SPEC, hidden=768, heads=12, layers=1, seed=22, num_labels=0,
                                    model_name="http-types-768", tokenizer=True))
    srv = start(model, dtype="float32")
    text = "The quick brown foxes jumped."
    plain = srv.call("POST", "/v1/embeddings", {"input": text})
    packed = srv.call("POST", "/v1/embeddings", {"input": text, "embedding_type": "ubinary", "encoding_format": "base64"})
    assert plain.status == packed.status == 200
    assert len(base64.b64decode(packed.json()["data"][0]["embedding"])) == 96
    assert len(packed.body) * 24 <= len(plain.body), (len(packed.body), len(plain.body))
    # The hostile cases among good requests: every good one answered, and right (to float32's
    # rounding: a batch of other rows may take another GEMM kernel).
    want = np.array(plain.json()["data"][0]["embedding"])
    bodies = [{"input": text}, {"input": text, "embedding_type": "unknown"},
              {"input": text, "embedding_type": "binary", "dimensions": 100},
              {"input": text, "embedding_type": "int8"}] * 8
    with cf.ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda b: srv.call("POST", "/v1/embeddings", b), bodies))
    for body, reply in zip(bodies, replies):
        if "embedding_type" in body:
            assert reply.status == 400, (body, reply.body)
        else:
            assert reply.status == 200, reply.body
            np.testing.assert_allclose(reply.json()["data"][0]["embedding"], want, atol=1e-5)


# ----------------------------------------------------------------------------- Cohere's embed API


def cohere_client(srv, v2=True):
    import cohere

    return (cohere.ClientV2 if v2 else cohere.Client)(api_key="dummy", base_url=srv.base, timeout=30)


def test_cohere_v2_sdk_every_type(typed, quantize):
    model, srv, ranges = typed
    f = floats(srv, CORPUS)
    got = cohere_client(srv).embed(model=model.name, texts=CORPUS, input_type="search_document",
                                   embedding_types=["float"] + TYPES)
    assert np.array_equal(np.array(got.embeddings.float_, dtype=np.float32), f)
    for kind in TYPES:
        assert np.array_equal(np.array(getattr(got.embeddings, kind)), quantize(f, kind, ranges=ranges[64])), kind
    assert got.texts == CORPUS
    usage = srv.call("POST", "/v1/embeddings", {"input": CORPUS}).json()["usage"]["prompt_tokens"]
    assert got.meta.billed_units.input_tokens == usage
    # output_dimension: the 32-dimension ranges.
    got = cohere_client(srv).embed(model=model.name, texts=CORPUS, input_type="search_query", output_dimension=32,
                                   embedding_types=["uint8"])
    assert np.array_equal(np.array(got.embeddings.uint8), quantize(floats(srv, CORPUS, 32), "uint8", ranges=ranges[32]))


def test_cohere_v1_sdk_floats_and_by_type(typed, quantize):
    model, srv, ranges = typed
    f = floats(srv, CORPUS[:3])
    plain = cohere_client(srv, v2=False).embed(model=model.name, texts=CORPUS[:3], input_type="classification")
    assert plain.response_type == "embeddings_floats"
    assert np.array_equal(np.array(plain.embeddings, dtype=np.float32), f)
    typed_reply = cohere_client(srv, v2=False).embed(model=model.name, texts=CORPUS[:3], embedding_types=["binary"])
    assert typed_reply.response_type == "embeddings_by_type"
    assert np.array_equal(np.array(typed_reply.embeddings.binary), quantize(f, "binary"))


@pytest.mark.parametrize(
    "body, words",
    [
        ({"texts": ["hello"], "embedding_types": ["int4"]}, ['embedding_types[0]: expected "float"', 'got "int4"']),
        ({"texts": ["hello"], "embedding_types": ["binary"], "output_dimension": 60}, ["multiple of 8, got 60"]),
        ({"texts": ["hello"], "embedding_types": ["int8"], "output_dimension": 48}, ["48 dimensions"]),
        ({"texts": ["hello"], "input_type": "image"}, ['input_type: expected "search_document"']),
        ({"texts": ["hello"], "truncate": "MIDDLE"}, ['truncate: expected "NONE", "START" or "END"']),
        ({"texts": "hello"}, ['texts: expected an array of strings, got "hello"']),
        ({"input_type": "search_query"}, ["texts: is required"]),
        ({"texts": ["hello"], "images": ["data:image/png;base64,AAAA"]}, ["images: not served here"]),
    ],
)
def test_cohere_refusals(typed, curl, body, words):
    _, srv, _ = typed
    reply = curl(srv, "POST", "/v2/embed", body)
    assert reply.status == 400, reply.body
    message = reply.json()["message"]
    for w in words:
        assert w in message, message


# ----------------------------------------------------------------------------- gRPC and KServe


def test_python_client_grpc_every_type(typed, quantize):
    """fastformer.v1 through the Python client: QuantizedEmbedding's bytes, decoded."""
    sys.path.insert(0, str(REPO / "client" / "python"))
    import fastformer_client

    model, srv, ranges = typed
    f = floats(srv, CORPUS)
    with fastformer_client.Client(srv.target, deadline_s=30) as c:
        res = c.encode(CORPUS, normalize=True, embedding_types=["float"] + TYPES)
        only = c.encode(CORPUS[:2], normalize=True, embedding_types=["ubinary"])
        with pytest.raises(fastformer_client.InvalidArgument, match="quantization.json"):
            c.encode(CORPUS[:1], normalize=False, embedding_types=["int8"])  # ranges are for normalised
    np.testing.assert_allclose(res.embeddings, f, atol=1e-6)
    for kind in TYPES:
        assert res.quantized[kind].dtype == quantize(f, kind, ranges=ranges[64]).dtype
        assert np.array_equal(res.quantized[kind], quantize(res.embeddings, kind, ranges=ranges[64])), kind
    assert only.embeddings.size == 0, "no float values unless asked for"
    assert np.array_equal(only.quantized["ubinary"], quantize(f[:2], "ubinary"))


def test_tritonclient_http_embedding_type(typed, quantize):
    import tritonclient.http as httpclient

    model, srv, ranges = typed
    f = floats(srv, CORPUS)
    texts = httpclient.InferInput("text", [len(CORPUS)], "BYTES")
    texts.set_data_from_numpy(np.array([t.encode() for t in CORPUS], dtype=np.object_))
    c = httpclient.InferenceServerClient(f"127.0.0.1:{srv.http_port}")
    try:
        for kind, datatype in (("int8", "INT8"), ("uint8", "UINT8"), ("binary", "INT8"), ("ubinary", "UINT8")):
            for binary in (False, True):
                result = c.infer(model.name, [texts], outputs=[httpclient.InferRequestedOutput("embedding", binary_data=binary)],
                                 parameters={"normalize": True, "embedding_type": kind})
                assert result.get_output("embedding")["datatype"] == datatype
                assert np.array_equal(result.as_numpy("embedding"), quantize(f, kind, ranges=ranges[64])), (kind, binary)
        with pytest.raises(Exception, match="embedding_type"):
            c.infer(model.name, [texts], parameters={"embedding_type": "int4"})
    finally:
        c.close()

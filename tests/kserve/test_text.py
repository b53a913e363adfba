"""The v2 BYTES input `text` through Triton's own client (tritonclient.grpc), on a model whose
directory has make_demo_model's WordPiece tokenizer.json. Expected ids are worked out by hand
from DEMO_WORDS (a token's id is its position), the results checked against the float64
reference on those ids."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import MODEL_SPEC, TOL, Model, Server, close
from make_demo_model import DEMO_WORDS
from test_tritonclient import call_raw

V = {w: i for i, w in enumerate(DEMO_WORDS)}
TEXTS = {
    "The quick brown foxes jumped.": ["[CLS]", "the", "quick", "brown", "fox", "##es", "jump", "##ed", ".", "[SEP]"],
    "Café, hello world!": ["[CLS]", "cafe", ",", "hello", "world", "!", "[SEP]"],
    "zebra": ["[CLS]", "[UNK]", "[SEP]"],
}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return Model(tmp_path_factory.mktemp("models"), dict(MODEL_SPEC, model_name="kserve-text", tokenizer=True))


@pytest.fixture(scope="module")
def text_server(text_model, logs):
    srv = Server(text_model.dir, logs, "text").wait_ready()
    yield srv
    srv.stop()


def text_input(texts, shape=None):
    arr = np.array([t.encode() if isinstance(t, str) else t for t in texts], dtype=np.object_)
    if shape is not None:
        arr = arr.reshape(shape)
    t = grpcclient.InferInput("text", list(arr.shape), "BYTES")
    t.set_data_from_numpy(arr)
    return t


def test_metadata_lists_text_and_num_tokens(text_server, text_model):
    with grpcclient.InferenceServerClient(text_server.url) as c:
        meta = c.get_model_metadata(text_model.name, as_json=True)
        config = c.get_model_config(text_model.name, as_json=True)["config"]
    inputs = {i["name"]: i for i in meta["inputs"]}
    assert inputs["text"]["datatype"] == "BYTES" and inputs["text"]["shape"] == ["-1", "1"]
    assert {o["name"]: o["datatype"] for o in meta["outputs"]}["num_tokens"] == "INT64"
    assert {i["name"]: i.get("optional", False) for i in config["input"]}["input_ids"] is True


@pytest.mark.parametrize("shape", [None, (3, 1)])
def test_text_rows_are_the_reference_on_hand_tokenized_ids(text_server, text_model, shape):
    texts = list(TEXTS)
    with grpcclient.InferenceServerClient(text_server.url) as c:
        result = c.infer(text_model.name, [text_input(texts, shape)])
    want_ids = [[V[t] for t in TEXTS[x]] for x in texts]
    assert result.as_numpy("num_tokens").tolist() == [len(w) for w in want_ids]
    want = text_model.reference(want_ids)
    emb, logits, tok = result.as_numpy("embedding"), result.as_numpy("logits"), result.as_numpy("token_embeddings")
    assert tok.shape == (3, max(len(w) for w in want_ids), text_model.hidden)
    for r, w in enumerate(want):
        for name, ours, ref in (("embedding", emb[r], w.embedding), ("logits", logits[r], w.logits),
                                ("token_embeddings", tok[r, :len(want_ids[r])], w.token_embeddings)):
            ok, worst = close(ours, ref)
            assert ok, f"row {r} {name}: differs from the float64 reference by {worst:.2e} (tolerance {TOL})"


def test_long_text_truncation_parameter(text_server, text_model):
    text = "the " + "dog " * 600 + "cat"
    with grpcclient.InferenceServerClient(text_server.url) as c:
        with pytest.raises(InferenceServerException) as err:
            c.infer(text_model.name, [text_input([text])])
        assert "text: row 0: the text is 604 tokens, over max_position_embeddings 512" in err.value.message()
        result = c.infer(text_model.name, [text_input([text])], parameters={"truncation": "left"})
    assert result.as_numpy("num_tokens").tolist() == [512]
    want_ids = [V["[CLS]"]] + [V["dog"]] * 509 + [V["cat"], V["[SEP]"]]
    ok, worst = close(result.as_numpy("embedding")[0], text_model.reference([want_ids])[0].embedding)
    assert ok, worst


def _raw_text_request(model, elements, shape=None):
    req = service_pb2.ModelInferRequest(model_name=model.name)
    req.inputs.add(name="text", datatype="BYTES", shape=shape or [len(elements)])
    req.raw_input_contents.append(b"".join(len(e).to_bytes(4, "little") + e for e in elements))
    return req


BAD = {  # name -> (request builder, message text)
    "invalid utf-8": (lambda m: _raw_text_request(m, [b"hello", b"ab\xff\xfe"]),
                      "text: row 1: text is not valid UTF-8"),
    "empty text": (lambda m: _raw_text_request(m, [b""]), "text: row 0: the text is empty"),
    "only whitespace": (lambda m: _raw_text_request(m, [b" \n\t "]), "text: row 0: the text tokenizes to no tokens"),
    "truncated raw": (lambda m: _raw_text_request(m, [b"hello"], shape=[2]), "before element 1's 4-byte length"),
    "element overruns": (lambda m: _overrun(m), "element 0 is 9 bytes, but only 3 remain"),
    "trailing bytes": (lambda m: _trailing(m), "bytes after the 1 elements"),
    "wrong shape": (lambda m: _raw_text_request(m, [b"a", b"b"], shape=[1, 2]), "expected [batch] or [batch, 1]"),
    "text with ids": (lambda m: _with_ids(m), "exactly one of input_ids, input_embeddings and text"),
    "wrong datatype": (lambda m: _wrong_type(m), "text: datatype INT64; expected BYTES"),
}


def _overrun(m):
    req = _raw_text_request(m, [b"hello"])
    req.raw_input_contents[0] = b"\x09\x00\x00\x00abc"
    return req


def _trailing(m):
    req = _raw_text_request(m, [b"hello"])
    req.raw_input_contents[0] += b"xx"
    return req


def _with_ids(m):
    req = _raw_text_request(m, [b"hello"])
    req.inputs.add(name="input_ids", datatype="INT64", shape=[1, 2])
    req.raw_input_contents.append(np.array([[5, 6]], dtype=np.int64).tobytes())
    return req


def _wrong_type(m):
    req = _raw_text_request(m, [b"hello"])
    req.inputs[0].datatype = "INT64"
    return req


@pytest.mark.parametrize("name", list(BAD))
def test_bad_text_is_invalid_argument(text_server, text_model, name):
    build, text = BAD[name]
    code, details = call_raw(text_server, build(text_model))
    assert code.name == "INVALID_ARGUMENT" and text in details, f"{name}: {code.name} {details!r}"


def test_model_without_tokenizer_refuses_text(server, model):
    code, details = call_raw(server, _raw_text_request(model, [b"hello"]))
    assert code.name == "INVALID_ARGUMENT" and "text: row 0: this model takes no text" in details, details


def test_typed_bytes_contents(text_server, text_model):
    req = service_pb2.ModelInferRequest(model_name=text_model.name)
    t = req.inputs.add(name="text", datatype="BYTES", shape=[1])
    t.contents.bytes_contents.append("zebra".encode())
    req.outputs.add(name="num_tokens")
    with grpc.insecure_channel(text_server.url) as ch:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert [o.name for o in resp.outputs] == ["num_tokens"]
    assert np.frombuffer(resp.raw_output_contents[0], dtype="<i8").tolist() == [3]


def test_embedding_types_through_grpc(text_model, logs, tmp_path):
    """The embedding_type parameter (docs/api.md, "Embedding types") over KServe gRPC: INT8 for
    int8 and binary, UINT8 for uint8 and ubinary, [rows, bytes]; each the float embedding as
    numpy quantizes it (packbits of x > 0; floor((x - min) / step) in float32, clipped to
    [0, 255], for hand-written ranges of [-1, 1] in every dimension)."""
    import shutil

    d = tmp_path / "m"
    shutil.copytree(text_model.dir, d)
    H = text_model.hidden
    (d / "quantization.json").write_text(
        '{"ranges": [{"dimensions": %d, "normalized": true, "min": %s, "max": %s}]}' % (H, [-1.0] * H, [1.0] * H))
    srv = Server(d, logs, "text-types").wait_ready()
    try:
        texts = list(TEXTS)
        with grpcclient.InferenceServerClient(srv.url) as c:
            f = c.infer(text_model.name, [text_input(texts)], parameters={"normalize": True}).as_numpy("embedding")
            lo = np.float32(-1)
            step = (np.float32(1) - lo) / np.float32(255)
            u8 = np.clip(np.floor((f - lo) / step), 0, 255).astype(np.uint8)
            want = {"int8": ("INT8", (u8.astype(np.int16) - 128).astype(np.int8)), "uint8": ("UINT8", u8),
                    "ubinary": ("UINT8", np.packbits(f > 0, axis=-1)),
                    "binary": ("INT8", (np.packbits(f > 0, axis=-1).astype(np.int16) - 128).astype(np.int8))}
            for kind, (datatype, expected) in want.items():
                result = c.infer(text_model.name, [text_input(texts)], outputs=[grpcclient.InferRequestedOutput("embedding")],
                                 parameters={"normalize": True, "embedding_type": kind})
                assert result.get_output("embedding").datatype == datatype
                assert np.array_equal(result.as_numpy("embedding"), expected), kind
            with pytest.raises(InferenceServerException, match="embedding_type must be the string"):
                c.infer(text_model.name, [text_input(texts)], parameters={"embedding_type": "int4"})
            with pytest.raises(InferenceServerException, match="calibrated ranges for 64 dimensions, not normalised"):
                c.infer(text_model.name, [text_input(texts)], parameters={"embedding_type": "int8"})
    finally:
        srv.stop()

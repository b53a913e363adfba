"""KServe v2 REST through Triton's own HTTP client (tritonclient.http): health, server and model
metadata, config, statistics, and infer with JSON and binary tensors (the binary tensor
extension) both ways, token ids and text. Results equal the float64 reference and the gRPC
Encoder's answer for the same sequences."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import GRPC_TOL, TEXTS, assert_close

rng = np.random.default_rng(7)


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}", connection_timeout=30, network_timeout=30)
    yield c
    c.close()


def int64_input(name, array, binary):
    t = httpclient.InferInput(name, list(array.shape), "INT64")
    t.set_data_from_numpy(array.astype(np.int64), binary_data=binary)
    return t


def text_input(texts, binary):
    arr = np.array([t.encode() for t in texts], dtype=np.object_)
    t = httpclient.InferInput("text", [len(texts)], "BYTES")
    t.set_data_from_numpy(arr, binary_data=binary)
    return t


def outputs(binary, *names):
    names = names or ("embedding", "token_embeddings", "logits", "num_tokens")
    return [httpclient.InferRequestedOutput(n, binary_data=binary) for n in names]


def check(model, result, seqs):
    """The un-normalised outputs of the KServe service against the float64 reference."""
    want = model.reference(seqs)
    emb, logits = result.as_numpy("embedding"), result.as_numpy("logits")
    tok, num = result.as_numpy("token_embeddings"), result.as_numpy("num_tokens")
    assert emb.shape == (len(seqs), model.hidden) and emb.dtype == np.float32
    assert logits.shape == (len(seqs), model.num_labels)
    assert num.tolist() == [len(s) for s in seqs]
    assert tok.shape == (len(seqs), max(map(len, seqs)), model.hidden)
    for r, (s, w) in enumerate(zip(seqs, want)):
        assert_close(emb[r], w.embedding, what=f"row {r} embedding")
        assert_close(logits[r], w.logits, what=f"row {r} logits")
        assert_close(tok[r, :len(s)], w.token_embeddings, what=f"row {r} token_embeddings")
        assert not tok[r, len(s):].any(), f"row {r}: token_embeddings past its {len(s)} tokens are not zero"


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "fastformer-server" and meta["version"]
    assert {"binary_tensor_data", "statistics", "model_configuration"} <= set(meta["extensions"])


def test_model_metadata_and_config(client, text_model):
    assert client.is_model_ready(text_model.name) and client.is_model_ready(text_model.name, "1")
    assert not client.is_model_ready("no-such-model")
    meta = client.get_model_metadata(text_model.name)
    assert meta["name"] == text_model.name and meta["versions"] == ["1"]
    inputs = {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]}
    assert inputs["input_ids"] == ("INT64", [-1, -1]) and inputs["text"][0] == "BYTES"
    assert inputs["input_embeddings"] == ("FP32", [-1, -1, text_model.hidden])
    outs = {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]}
    assert outs["embedding"] == ("FP32", [-1, text_model.hidden])
    assert outs["logits"] == ("FP32", [-1, text_model.num_labels])
    assert outs["num_tokens"][0] == "INT64"
    assert client.get_model_metadata(text_model.name, model_version="1")["name"] == text_model.name
    config = client.get_model_config(text_model.name)
    assert config["name"] == text_model.name
    assert config["max_batch_size"] == 256  # --max-batch-sequences' default
    assert {i["name"] for i in config["input"]} == {"text", "input_ids", "attention_mask", "input_embeddings", "spans"}
    with pytest.raises(InferenceServerException) as err:
        client.get_model_metadata("no-such-model")
    assert "no-such-model" in err.value.message()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_input_ids_json_and_binary(client, server, text_model, grpc_encode, binary):
    seqs = [rng.integers(4, text_model.vocab, 9).tolist(), rng.integers(4, text_model.vocab, 9).tolist()]
    result = client.infer(text_model.name, [int64_input("input_ids", np.array(seqs), binary)],
                          outputs=outputs(binary), request_id="rest-1")
    assert result.get_response()["id"] == "rest-1"
    assert result.get_response()["model_name"] == text_model.name
    check(text_model, result, seqs)
    via_grpc = grpc_encode(server, seqs, normalize=False)
    for r, g in enumerate(via_grpc):
        np.testing.assert_allclose(result.as_numpy("embedding")[r], g["embedding"], rtol=0, atol=GRPC_TOL)


@pytest.mark.parametrize("binary_in,binary_out", [(False, True), (True, False)], ids=["json-in", "binary-in"])
def test_infer_padded_batch_with_mask(client, text_model, binary_in, binary_out):
    lengths = [3, 11, 6]
    ids = np.zeros((3, 11), dtype=np.int64)
    mask = np.zeros((3, 11), dtype=np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(4, text_model.vocab, n)
        mask[r, :n] = 1
    result = client.infer(text_model.name, [int64_input("input_ids", ids, binary_in),
                                            int64_input("attention_mask", mask, binary_in)],
                          outputs=outputs(binary_out))
    check(text_model, result, [ids[r, :n].tolist() for r, n in enumerate(lengths)])


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_text_bytes(client, server, text_model, grpc_encode, binary):
    texts = list(TEXTS)
    result = client.infer(text_model.name, [text_input(texts, binary)], outputs=outputs(binary))
    seqs = [TEXTS[t] for t in texts]
    check(text_model, result, seqs)
    via_grpc = grpc_encode(server, texts, kind="text", normalize=False)
    for r, g in enumerate(via_grpc):
        np.testing.assert_allclose(result.as_numpy("embedding")[r], g["embedding"], rtol=0, atol=GRPC_TOL)


def test_only_requested_outputs(client, text_model):
    seq = rng.integers(4, text_model.vocab, 5).tolist()
    result = client.infer(text_model.name, [int64_input("input_ids", np.array([seq]), True)],
                          outputs=outputs(True, "embedding"))
    assert [o["name"] for o in result.get_response()["outputs"]] == ["embedding"]
    assert result.as_numpy("logits") is None
    assert_close(result.as_numpy("embedding")[0], text_model.reference([seq])[0].embedding)


def test_statistics_grow_after_infer(client, text_model):
    def stats():
        s = client.get_inference_statistics(text_model.name)["model_stats"]
        assert len(s) == 1 and s[0]["name"] == text_model.name and s[0]["version"] == "1"
        return s[0]

    before = stats()
    ids = rng.integers(4, text_model.vocab, (2, 7))
    client.infer(text_model.name, [int64_input("input_ids", ids, True)], outputs=outputs(True, "embedding"))
    after = stats()
    assert int(after["inference_stats"]["success"]["count"]) == int(before["inference_stats"]["success"]["count"]) + 1
    assert int(after["inference_count"]) == int(before["inference_count"]) + 2
    assert int(after["last_inference"]) >= int(before["last_inference"])


def test_errors_are_exceptions_with_the_message(client, text_model):
    with pytest.raises(InferenceServerException) as err:
        client.infer("no-such-model", [int64_input("input_ids", np.array([[5, 6]]), False)])
    assert "no-such-model" in err.value.message()
    with pytest.raises(InferenceServerException) as err:
        client.infer(text_model.name, [int64_input("input_ids", np.array([[5, text_model.vocab + 3]]), True)])
    assert "input_ids" in err.value.message()

"""The Open Inference Protocol (KServe v2) service, driven by Triton's Python client
(tritonclient.grpc): health, metadata, config, statistics, ModelInfer sync / async / streaming,
every bad input, and results equal to the Encoder API's and to the float64 reference."""

from __future__ import annotations

import queue
import shutil
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import TOL, close  # noqa: F401  (tests/kserve/conftest.py: this directory only)

rng = np.random.default_rng(5)


def ids_batch(model, lengths, pad=0):
    """[B, max(lengths)] int64 ids (no pad token inside) and the mask marking each row's length."""
    L = max(lengths)
    ids = np.full((len(lengths), L), pad, dtype=np.int64)
    mask = np.zeros((len(lengths), L), dtype=np.int64)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(1, model.vocab, n)
        mask[r, :n] = 1
    return ids, mask


def infer_input(name, array, datatype=None):
    t = grpcclient.InferInput(name, list(array.shape), datatype or
                              {np.int64: "INT64", np.int32: "INT32", np.float32: "FP32"}[array.dtype.type])
    t.set_data_from_numpy(array)
    return t


def outputs(*names):
    return [grpcclient.InferRequestedOutput(n) for n in names]


def check_against_reference(model, result, seqs, kind="ids"):
    want = model.reference(seqs, kind=kind)
    emb = result.as_numpy("embedding")
    assert emb.shape == (len(seqs), model.hidden)
    for r, w in enumerate(want):
        ok, worst = close(emb[r], w.embedding)
        assert ok, f"row {r}: embedding differs from the float64 reference by {worst:.2e} (tolerance {TOL})"
    tok = result.as_numpy("token_embeddings")
    if tok is not None:
        for r, (s, w) in enumerate(zip(seqs, want)):
            n = len(s)
            ok, worst = close(tok[r, :n], w.token_embeddings)
            assert ok, f"row {r}: token_embeddings differ by {worst:.2e}"
            assert not tok[r, n:].any(), f"row {r}: token_embeddings past its {n} tokens are not zero"
    logits = result.as_numpy("logits")
    if logits is not None:
        for r, w in enumerate(want):
            ok, worst = close(logits[r], w.logits)
            assert ok, f"row {r}: logits differ by {worst:.2e}"


# ----------------------------------------------------------------------------- health and metadata


def test_live_ready_and_server_metadata(client, server):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("kserve-head")
    assert client.is_model_ready("kserve-head", "1")
    assert not client.is_model_ready("kserve-head", "2")
    assert not client.is_model_ready("no-such-model")
    meta = client.get_server_metadata(as_json=True)
    assert meta["name"] == "fastformer-server"
    assert meta["version"], "ServerMetadata.version must not be empty"
    assert "statistics" in meta["extensions"]


def test_model_metadata_and_config(client, model):
    meta = client.get_model_metadata(model.name, as_json=True)
    assert meta["name"] == model.name and meta["versions"] == ["1"]
    inputs = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]}
    assert inputs == {"input_ids": ("INT64", [-1, -1]), "attention_mask": ("INT64", [-1, -1]),
                      "input_embeddings": ("FP32", [-1, -1, model.hidden]), "spans": ("INT64", [-1, 3])}
    out = {t["name"]: (t["datatype"], [int(d) for d in t["shape"]]) for t in meta["outputs"]}
    assert out == {"embedding": ("FP32", [-1, model.hidden]), "token_embeddings": ("FP32", [-1, -1, model.hidden]),
                   "logits": ("FP32", [-1, model.num_labels]), "span_embeddings": ("FP32", [-1, model.hidden])}

    config = client.get_model_config(model.name, as_json=True)["config"]
    assert config["name"] == model.name
    assert int(config["max_batch_size"]) > 0
    assert "dynamic_batching" in config
    # the two priority classes as Triton's levels: 1 interactive (the default here), 2 bulk
    assert int(config["dynamic_batching"]["priority_levels"]) == 2
    assert int(config["dynamic_batching"]["default_priority_level"]) == 1
    dims = {t["name"]: [int(d) for d in t["dims"]] for t in config["input"]}
    # spans (late chunking) is [chunks, 3] of (row, begin, end); optional, like attention_mask
    assert dims == {"input_ids": [-1], "attention_mask": [-1], "input_embeddings": [-1, model.hidden],
                    "spans": [3]}
    assert {t["name"]: t.get("optional", False) for t in config["input"]}["spans"] is True
    assert {t["name"]: t["data_type"] for t in config["input"]}["input_ids"] == "TYPE_INT64"
    assert {t["name"]: [int(d) for d in t["dims"]] for t in config["output"]}["embedding"] == [model.hidden]


def test_unknown_model_is_not_found(client):
    for call in (lambda: client.get_model_metadata("nope"), lambda: client.get_model_config("nope"),
                 lambda: client.get_model_metadata("kserve-head", "7")):
        with pytest.raises(InferenceServerException) as e:
            call()
        assert e.value.status() == "StatusCode.NOT_FOUND", e.value
        assert "not served here" in e.value.message() or "no version '7'" in e.value.message()


def test_other_rpcs_unimplemented_with_a_message(client):
    with pytest.raises(InferenceServerException) as e:
        client.get_system_shared_memory_status()
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "SystemSharedMemoryStatus" in e.value.message() and "not implemented by fastformer-server" in e.value.message()


# ----------------------------------------------------------------------------- inference


def test_infer_one_sequence_matches_reference_and_encode(client, model, encode):
    ids, _ = ids_batch(model, [37])
    result = client.infer(model.name, [infer_input("input_ids", ids)])
    assert result.get_response().id == ""
    check_against_reference(model, result, [ids[0].tolist()])
    via_encode = encode([ids[0].tolist()])[0]
    np.testing.assert_allclose(result.as_numpy("embedding")[0], via_encode["embedding"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("logits")[0], via_encode["logits"], rtol=0, atol=1e-5)


def test_a_served_model_name_is_an_alias_on_kserve_too(start, model):
    """--served-model-name is one naming rule for every protocol (issue 33): tritonclient names
    the model by an alias; the answers carry the model's own name; another name is NOT_FOUND."""
    srv = start(served_model_name="alias-a,alias-b")
    c = grpcclient.InferenceServerClient(srv.url)
    try:
        assert c.is_model_ready("alias-a")
        assert c.get_model_metadata("alias-b", as_json=True)["name"] == model.name
        ids, _ = ids_batch(model, [21])
        result = c.infer("alias-a", [infer_input("input_ids", ids)])
        assert result.get_response().model_name == model.name
        check_against_reference(model, result, [ids[0].tolist()])
        stats = c.get_inference_statistics("alias-b", as_json=True)["model_stats"]
        assert [m["name"] for m in stats] == [model.name], stats  # the alias's model, not none
        with pytest.raises(InferenceServerException) as refused:
            c.infer("alias-c", [infer_input("input_ids", ids)])
        assert refused.value.status() == "StatusCode.NOT_FOUND", refused.value
        assert "'alias-c'" in refused.value.message()
    finally:
        c.close()


def test_padded_batch_with_mask_int32_and_request_id(client, model, encode):
    lengths = [5, 64, 1, 30]
    ids, mask = ids_batch(model, lengths)
    result = client.infer(model.name, [infer_input("input_ids", ids.astype(np.int32)),
                                       infer_input("attention_mask", mask.astype(np.int32))],
                          request_id="batch-7")
    assert result.get_response().id == "batch-7"
    seqs = [ids[r, :n].tolist() for r, n in enumerate(lengths)]
    assert result.as_numpy("token_embeddings").shape == (4, 64, model.hidden)
    check_against_reference(model, result, seqs)
    via_encode = encode(seqs)
    for r in range(len(seqs)):
        np.testing.assert_allclose(result.as_numpy("embedding")[r], via_encode[r]["embedding"], rtol=0, atol=1e-5)


def test_interior_mask_zero_is_padding(client, model):
    ids, mask = ids_batch(model, [20])
    mask[0, 7] = 0
    result = client.infer(model.name, [infer_input("input_ids", ids), infer_input("attention_mask", mask)],
                          outputs=outputs("embedding"))
    seq = ids[0].tolist()
    seq[7] = 0  # pad_token_id: the reference masks it the same way
    want = model.reference([seq])[0]
    ok, worst = close(result.as_numpy("embedding")[0], want.embedding)
    assert ok, worst


def test_embeddings_input(client, model):
    emb = rng.standard_normal((2, 9, model.hidden)).astype(np.float32)
    mask = np.ones((2, 9), dtype=np.int64)
    mask[1, 6:] = 0
    result = client.infer(model.name, [infer_input("input_embeddings", emb), infer_input("attention_mask", mask)])
    check_against_reference(model, result, [emb[0], emb[1, :6]], kind="embeddings")


def test_only_requested_outputs_and_normalize(client, model):
    ids, _ = ids_batch(model, [12])
    params = {"normalize": True, "client_tag": "abc"}  # parameters we do not know are ignored
    result = client.infer(model.name, [infer_input("input_ids", ids)], outputs=outputs("embedding"),
                          parameters=params)
    names = [o.name for o in result.get_response().outputs]
    assert names == ["embedding"]
    emb = result.as_numpy("embedding")[0]
    want = model.reference([ids[0].tolist()])[0].embedding
    np.testing.assert_allclose(emb, want / np.linalg.norm(want), rtol=0, atol=TOL)


def test_truncation_parameter(client, model):
    ids, _ = ids_batch(model, [model.max_positions + 10])
    with pytest.raises(InferenceServerException) as e:
        client.infer(model.name, [infer_input("input_ids", ids)])
    assert "max_position_embeddings" in e.value.message()
    for side, keep in (("right", ids[0, :model.max_positions]), ("left", ids[0, -model.max_positions:])):
        result = client.infer(model.name, [infer_input("input_ids", ids)], outputs=outputs("embedding"),
                              parameters={"truncation": side})
        ok, worst = close(result.as_numpy("embedding")[0], model.reference([keep.tolist()])[0].embedding)
        assert ok, f"{side}: {worst}"


def test_async_infer(client, model):
    ids, mask = ids_batch(model, [3, 17])
    done = queue.Queue()
    client.async_infer(model.name, [infer_input("input_ids", ids), infer_input("attention_mask", mask)],
                       callback=lambda result, error: done.put((result, error)), request_id="a1")
    result, error = done.get(timeout=30)
    assert error is None, error
    assert result.get_response().id == "a1"
    check_against_reference(model, result, [ids[0, :3].tolist(), ids[1].tolist()])


def test_stream_answers_each_request_and_errors_in_band(client, model):
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        sent = {}
        for i, n in enumerate([4, 50, 9]):
            ids, _ = ids_batch(model, [n])
            sent[f"s{i}"] = ids[0].tolist()
            client.async_stream_infer(model.name, [infer_input("input_ids", ids)], request_id=f"s{i}")
        bad = np.array([[model.vocab + 5]], dtype=np.int64)
        client.async_stream_infer(model.name, [infer_input("input_ids", bad)], request_id="bad")
        ids, _ = ids_batch(model, [6])
        sent["after"] = ids[0].tolist()
        client.async_stream_infer(model.name, [infer_input("input_ids", ids)], request_id="after")
        got, errors = {}, []
        for _ in range(5):
            result, error = answers.get(timeout=30)
            if error is not None:
                errors.append(error)
            else:
                got[result.get_response().id] = result
    finally:
        client.stop_stream()
    assert len(errors) == 1 and "outside [0, vocab_size" in str(errors[0]), errors
    assert "INVALID_ARGUMENT" in str(errors[0])
    assert set(got) == set(sent), "every good request is answered, also the one after the error"
    for rid, seq in sent.items():
        check_against_reference(model, got[rid], [seq])


def test_stream_answers_a_message_that_does_not_parse_in_band_and_goes_on(client, server, model):
    """ModelStreamInfer reads raw messages (as EncodeStream does): a message that is not a
    ModelInferRequest (here an `id` that is not UTF-8) is answered in-band with
    INVALID_ARGUMENT naming the field and the byte, and the stream goes on. A tritonclient
    stream runs beside the raw writer on the same server, answered in full."""
    answers = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        ids, _ = ids_batch(model, [7])
        for i in range(3):
            client.async_stream_infer(model.name, [infer_input("input_ids", ids)], request_id=f"t{i}")
        channel = grpc.insecure_channel(server.url)
        raw = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                    request_serializer=lambda b: b,
                                    response_deserializer=service_pb2.ModelStreamInferResponse.FromString)

        def good(rid):
            req = service_pb2.ModelInferRequest(model_name=model.name, id=rid)
            t = req.inputs.add(name="input_ids", datatype="INT64", shape=list(ids.shape))
            t.contents.int64_contents.extend(int(v) for v in ids.ravel())
            return req.SerializeToString()

        bad = b"\x0a" + bytes([len(model.name)]) + model.name.encode() + b"\x1a\x03a\xffb"  # id 'a', 0xff, 'b'
        got = list(raw(iter([good("r0"), bad, good("r1")]), timeout=60))
        channel.close()
        tritons = [answers.get(timeout=30) for _ in range(3)]
    finally:
        client.stop_stream()
    assert len(got) == 3, [a.infer_response.id for a in got]
    by_id = {a.infer_response.id: a for a in got}
    assert set(by_id) == {"r0", "r1", ""}, sorted(by_id)
    for rid in ("r0", "r1"):
        assert by_id[rid].error_message == "", by_id[rid].error_message
        response = by_id[rid].infer_response
        names = [o.name for o in response.outputs]
        emb = np.frombuffer(response.raw_output_contents[names.index("embedding")], dtype=np.float32)
        assert emb.shape == (model.hidden,) and np.isfinite(emb).all()
    err = by_id[""].error_message
    assert err.startswith("INVALID_ARGUMENT: id (bytes from "), err
    assert "not valid UTF-8" in err and "at byte 1" in err, err
    assert all(error is None for _, error in tritons), [str(e) for _, e in tritons if e is not None]
    assert sorted(r.get_response().id for r, _ in tritons) == ["t0", "t1", "t2"]


# ----------------------------------------------------------------------------- bad input


def raw_request(model, ids: np.ndarray, **overrides):
    """A ModelInferRequest built by hand (to send what tritonclient would refuse to)."""
    req = service_pb2.ModelInferRequest(model_name=model.name)
    t = req.inputs.add(name="input_ids", datatype="INT64", shape=list(ids.shape))
    req.raw_input_contents.append(ids.astype(np.int64).tobytes())
    for k, v in overrides.items():
        setattr(t, k, v) if k != "shape" else (t.ClearField("shape"), t.shape.extend(v))
    return req


def call_raw(server, req):
    with grpc.insecure_channel(server.url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        try:
            stub.ModelInfer(req, timeout=30)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


BAD = [  # (case, status, text the message must hold)
    ("wrong model", "NOT_FOUND", "not served here"),
    ("wrong version", "NOT_FOUND", "no version '3'"),
    ("unknown input", "INVALID_ARGUMENT", "unknown input 'tokens'"),
    ("wrong datatype", "INVALID_ARGUMENT", "datatype FP16; expected INT64 or INT32"),
    ("wrong shape", "INVALID_ARGUMENT", "expected 2 ([batch, length])"),
    ("raw size", "INVALID_ARGUMENT", "raw contents are 16 bytes; shape [1, 3] of INT64 needs 24"),
    ("out of vocabulary", "INVALID_ARGUMENT", "row 0, token 1 has id 1000, outside [0, vocab_size 1000)"),
    ("negative id", "INVALID_ARGUMENT", "has id -1"),
    ("no real token", "INVALID_ARGUMENT", "attention_mask: row 1 has no real token"),
    ("mask shape", "INVALID_ARGUMENT", "attention_mask: shape [2, 2] must equal"),
    ("both inputs", "INVALID_ARGUMENT", "exactly one of input_ids and input_embeddings"),
    ("unknown output", "INVALID_ARGUMENT", "unknown output 'pooled'"),
    ("bad parameter", "INVALID_ARGUMENT", "truncation must be the string"),
    ("embedding width", "INVALID_ARGUMENT", "the last dimension must be hidden_size 64"),
]


def build_bad(name, model):
    ids = np.array([[5, 6, 7]], dtype=np.int64)
    if name == "wrong model":
        req = raw_request(model, ids)
        req.model_name = "other"
    elif name == "wrong version":
        req = raw_request(model, ids)
        req.model_version = "3"
    elif name == "unknown input":
        req = raw_request(model, ids, name="tokens")
    elif name == "wrong datatype":
        req = raw_request(model, ids, datatype="FP16")
    elif name == "wrong shape":
        req = raw_request(model, ids, shape=[3])
    elif name == "raw size":
        req = raw_request(model, ids)
        req.raw_input_contents[0] = ids.tobytes()[:16]
    elif name == "out of vocabulary":
        req = raw_request(model, np.array([[5, model.vocab, 7]]))
    elif name == "negative id":
        req = raw_request(model, np.array([[-1, 5]]))
    elif name == "no real token":
        req = raw_request(model, np.array([[5, 6], [7, 8]]))
        req.inputs.add(name="attention_mask", datatype="INT64", shape=[2, 2])
        req.raw_input_contents.append(np.array([[1, 1], [0, 0]], dtype=np.int64).tobytes())
    elif name == "mask shape":
        req = raw_request(model, ids)
        req.inputs.add(name="attention_mask", datatype="INT64", shape=[2, 2])
        req.raw_input_contents.append(np.ones((2, 2), dtype=np.int64).tobytes())
    elif name == "both inputs":
        req = raw_request(model, ids)
        req.inputs.add(name="input_embeddings", datatype="FP32", shape=[1, 3, model.hidden])
        req.raw_input_contents.append(np.zeros((1, 3, model.hidden), dtype=np.float32).tobytes())
    elif name == "unknown output":
        req = raw_request(model, ids)
        req.outputs.add(name="pooled")
    elif name == "bad parameter":
        req = raw_request(model, ids)
        req.parameters["truncation"].string_param = "middle"
    elif name == "embedding width":
        req = service_pb2.ModelInferRequest(model_name=model.name)
        req.inputs.add(name="input_embeddings", datatype="FP32", shape=[1, 2, 8])
        req.raw_input_contents.append(np.zeros((1, 2, 8), dtype=np.float32).tobytes())
    return req


@pytest.mark.parametrize("name,code,text", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_a_clear_status(server, model, name, code, text):
    got, details = call_raw(server, build_bad(name, model))
    assert got.name == code, f"{name}: {got.name} {details}"
    assert text in details, f"{name}: message {details!r} lacks {text!r}"


def test_typed_contents_accepted(server, model):
    ids = np.array([[5, 6, 7, 8]], dtype=np.int64)
    req = service_pb2.ModelInferRequest(model_name=model.name, id="typed")
    t = req.inputs.add(name="input_ids", datatype="INT64", shape=[1, 4])
    t.contents.int64_contents.extend(ids[0].tolist())
    with grpc.insecure_channel(server.url) as ch:
        resp = service_pb2_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
    assert resp.id == "typed"
    emb = np.frombuffer(resp.raw_output_contents[[o.name for o in resp.outputs].index("embedding")], dtype="<f4")
    ok, worst = close(emb, model.reference([ids[0].tolist()])[0].embedding)
    assert ok, worst


def test_bad_request_costs_no_other_request_its_answer(client, model):
    """Good and bad requests at once, from several threads: every good one is answered right."""
    errors, results = [], {}

    def good(i):
        ids, _ = ids_batch(model, [8 + i])
        results[i] = (ids[0].tolist(), client.infer(model.name, [infer_input("input_ids", ids)],
                                                    outputs=outputs("embedding")))

    def bad(i):
        try:
            client.infer(model.name, [infer_input("input_ids", np.array([[model.vocab + i]], dtype=np.int64))])
        except InferenceServerException as e:
            errors.append(e.status())

    threads = [threading.Thread(target=good if i % 2 else bad, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == ["StatusCode.INVALID_ARGUMENT"] * 8
    assert len(results) == 8
    for i, (seq, result) in results.items():
        ok, worst = close(result.as_numpy("embedding")[0], model.reference([seq])[0].embedding)
        assert ok, f"request {i}: {worst}"


# ----------------------------------------------------------------------------- statistics and metrics


def test_statistics_and_metrics_count_what_was_served(start, model):
    srv = start()
    c = grpcclient.InferenceServerClient(srv.url)
    try:
        rows = 0
        for n in range(1, 6):
            ids, mask = ids_batch(model, [n, 3])
            c.infer(model.name, [infer_input("input_ids", ids), infer_input("attention_mask", mask)],
                    outputs=outputs("embedding"))
            rows += 2
        with pytest.raises(InferenceServerException):
            c.infer(model.name, [infer_input("input_ids", np.array([[model.vocab]], dtype=np.int64))])
        stats = c.get_inference_statistics(model.name, as_json=True)["model_stats"]
    finally:
        c.close()
    assert len(stats) == 1 and stats[0]["name"] == model.name and stats[0]["version"] == "1"
    s, inf = stats[0], stats[0]["inference_stats"]
    assert int(inf["success"]["count"]) == 5
    assert int(s["inference_count"]) == rows
    assert 1 <= int(s["execution_count"]) <= 5
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert int(inf[key]["count"]) == 5, key
    assert int(inf["compute_infer"]["ns"]) > 0 and int(inf["success"]["ns"]) >= int(inf["compute_infer"]["ns"])
    assert int(s["last_inference"]) > 0
    # The same counts on /metrics; the bad request is refused before the queue (not a failure
    # of the model, as in Triton) and counted by its status.
    assert srv.metric("fastformer_requests_total", method="ModelInfer", code="OK") == 5
    assert srv.metric("fastformer_requests_total", method="ModelInfer", code="INVALID_ARGUMENT") == 1
    assert srv.metric("fastformer_requests_total", method="ModelStatistics", code="OK") == 1


def test_token_auth_applies(start, model, tmp_path):
    token_file = tmp_path / "tokens"
    token_file.write_text("s3cret\n")
    srv = start(auth_token_file=token_file, headers={"authorization": "Bearer s3cret"})
    c = grpcclient.InferenceServerClient(srv.url)
    try:
        ids, _ = ids_batch(model, [4])
        with pytest.raises(InferenceServerException) as e:
            c.infer(model.name, [infer_input("input_ids", ids)])
        assert e.value.status() == "StatusCode.UNAUTHENTICATED"
        r = c.infer(model.name, [infer_input("input_ids", ids)], headers={"authorization": "Bearer s3cret"})
        assert r.as_numpy("embedding").shape == (1, model.hidden)
    finally:
        c.close()


# ----------------------------------------------------------------------------- one batcher: drain


def test_sigterm_drains_admitted_requests_then_refuses(start, load_model):
    """v2 requests admitted before SIGTERM are all answered (the drain waits for them, as for
    Encode); the server then exits 0."""
    srv = start(model_dir=load_model.dir, max_batch_tokens=2048, max_queue_tokens=1_000_000,
                max_request_tokens=4096, shutdown_timeout_s=30)
    c = grpcclient.InferenceServerClient(srv.url)
    answers = queue.Queue()
    n = 16
    seqs = [ids_batch(load_model, [1500 + i])[0] for i in range(n)]
    try:
        for i, ids in enumerate(seqs):
            c.async_infer(load_model.name, [infer_input("input_ids", ids)], outputs=outputs("embedding"),
                          callback=lambda result, error: answers.put((result, error)), request_id=f"d{i}")
        # Every request admitted (in flight, or already answered) before the signal.
        deadline = time.monotonic() + 20
        while srv.metric("fastformer_inflight_requests") + answers.qsize() < n and time.monotonic() < deadline:
            time.sleep(0.005)
        unanswered = n - answers.qsize()
        srv.proc.send_signal(signal.SIGTERM)
        got = [answers.get(timeout=60) for _ in range(n)]
    finally:
        c.close()
    errors = [e for _, e in got if e is not None]
    assert not errors, f"{len(errors)} admitted requests failed in the drain: {errors[:3]}"
    by_id = {r.get_response().id: r for r, _ in got}
    for i in (0, n - 1):
        ok, worst = close(by_id[f"d{i}"].as_numpy("embedding")[0],
                          load_model.reference([seqs[i][0].tolist()])[0].embedding)
        assert ok, f"d{i}: {worst}"
    assert srv.proc.wait(timeout=60) == 0, srv.log_tail()
    print(f"{unanswered} of {n} requests were unanswered at SIGTERM")


def test_tls_applies(start, model, tmp_path):
    """The protocol's service is behind the listener's TLS: tritonclient with ssl=True and the
    server's certificate as its root works; a plaintext client is refused."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl not found: it makes the test certificate (apt-get install openssl)", pytrace=False)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", "server.key", "-out", "server.pem", "-days", "2", "-subj", "/CN=fastformer kserve test",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=tmp_path, check=True, capture_output=True)
    srv = start(wait=False, tls_cert=tmp_path / "server.pem", tls_key=tmp_path / "server.key")
    secure = grpcclient.InferenceServerClient(srv.url, ssl=True, root_certificates=str(tmp_path / "server.pem"))
    plain = grpcclient.InferenceServerClient(srv.url)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if secure.is_server_ready():
                    break
            except InferenceServerException:
                pass
            time.sleep(0.05)
        ids, _ = ids_batch(model, [6])
        r = secure.infer(model.name, [infer_input("input_ids", ids)], outputs=outputs("embedding"))
        ok, worst = close(r.as_numpy("embedding")[0], model.reference([ids[0].tolist()])[0].embedding)
        assert ok, worst
        with pytest.raises(InferenceServerException) as e:
            plain.infer(model.name, [infer_input("input_ids", ids)], client_timeout=5)
        assert e.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.DEADLINE_EXCEEDED"), e.value
    finally:
        secure.close()
        plain.close()

"""Every route of the HTTP listener through curl (status codes, JSON shapes, headers, results
against the float64 reference), and keep-alive over one http.client connection."""

from __future__ import annotations

import base64
import http.client
import json

import numpy as np

from conftest import ALIASES, TEXT, TEXTS, V, assert_close, ids, unit

TIMING = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time", "x-compute-time",
          "x-compute-tokens")


def softmax(x):
    e = np.exp(np.asarray(x, np.float64) - np.max(x))
    return e / e.sum()


# ----------------------------------------------------------------------------- OpenAI


def test_openai_routes(curl, server, text_model):
    r = curl(server, "GET", "/v1/models")
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["object"] == "list" and [m["id"] for m in body["data"]] == [text_model.name] + ALIASES
    assert all(set(m) == {"id", "object", "created", "owned_by"} and m["object"] == "model" for m in body["data"])
    r = curl(server, "GET", f"/v1/models/{ALIASES[0]}")
    assert r.status == 200 and r.json()["id"] == ALIASES[0]
    r = curl(server, "GET", "/v1/models/nope")
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"

    r = curl(server, "POST", "/v1/embeddings", {"input": TEXT, "model": text_model.name, "encoding_format": "base64"})
    assert r.status == 200
    body = r.json()
    assert set(body) == {"object", "data", "model", "usage"} and body["object"] == "list"
    assert body["usage"] == {"prompt_tokens": len(TEXTS[TEXT]), "total_tokens": len(TEXTS[TEXT])}
    (d,) = body["data"]
    assert set(d) == {"object", "index", "embedding"} and d["object"] == "embedding" and d["index"] == 0
    emb = np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
    assert_close(emb, text_model.unit(TEXTS[TEXT]))

    r = curl(server, "POST", "/v1/embeddings", {"input": [[5, 6, 7], [8, 9]]})  # no model: the served one
    assert r.status == 200 and r.json()["model"] == text_model.name and r.json()["usage"]["prompt_tokens"] == 5
    for row, seq in zip(r.json()["data"], [[5, 6, 7], [8, 9]]):
        assert_close(row["embedding"], text_model.unit(seq))

    r = curl(server, "GET", "/v1/embeddings")
    assert r.status == 405 and r.headers["allow"] == "POST" and "error" in r.json()


# ----------------------------------------------------------------------------- TEI


def check_timing(r):
    for h in TIMING:
        assert h in r.headers and r.headers[h].isdigit(), (h, r.headers)


def test_tei_embed(curl, server, text_model):
    r = curl(server, "POST", "/embed", {"inputs": TEXT})
    assert r.status == 200
    check_timing(r)
    assert int(r.headers["x-compute-tokens"]) == len(TEXTS[TEXT])
    out = r.json()
    assert np.asarray(out).shape == (1, text_model.hidden), "one input is still a list of lists"
    assert_close(out[0], text_model.unit(TEXTS[TEXT]))

    texts = list(TEXTS)
    r = curl(server, "POST", "/embed", {"inputs": texts, "normalize": False})
    assert r.status == 200
    want = text_model.reference([TEXTS[t] for t in texts])
    for got, w in zip(r.json(), want):
        assert_close(got, w.embedding)

    r = curl(server, "POST", "/embed", {"inputs": [[5, 6, 7, 8]]})
    assert r.status == 200 and np.asarray(r.json()).shape == (1, text_model.hidden)
    assert_close(r.json()[0], text_model.unit([5, 6, 7, 8]))


def test_tei_truncate(curl, server, text_model):
    text = "the " + "dog " * 600 + "cat"  # 604 tokens with [CLS] and [SEP]
    r = curl(server, "POST", "/embed", {"inputs": text})
    assert r.status == 422 and "512" in r.json()["error"] and r.json()["error"].startswith("inputs")
    r = curl(server, "POST", "/embed", {"inputs": text, "truncate": True})
    assert r.status == 200
    right = ids("[CLS]", "the") + [V["dog"]] * 509 + ids("[SEP]")
    assert_close(r.json()[0], text_model.unit(right))
    r = curl(server, "POST", "/embed", {"inputs": text, "truncate": True, "truncation_direction": "Left"})
    assert r.status == 200
    left = ids("[CLS]") + [V["dog"]] * 509 + ids("cat", "[SEP]")
    assert_close(r.json()[0], text_model.unit(left))
    r = curl(server, "POST", "/embed", {"inputs": "a", "truncation_direction": "middle"})
    assert r.status == 422 and "truncation_direction" in r.json()["error"]


def test_tei_embed_all(curl, server, text_model):
    texts = [TEXT, "the lazy dog"]
    r = curl(server, "POST", "/embed_all", {"inputs": texts})
    assert r.status == 200
    check_timing(r)
    out = r.json()
    want = text_model.reference([TEXTS[t] for t in texts])
    assert len(out) == 2
    for got, t, w in zip(out, texts, want):
        assert np.asarray(got).shape == (len(TEXTS[t]), text_model.hidden)
        assert_close(got, w.token_embeddings, what="token embeddings")


def test_tei_predict(curl, server, text_model):
    r = curl(server, "POST", "/predict", {"inputs": TEXT})
    assert r.status == 200
    check_timing(r)
    out = r.json()
    assert [set(x) for x in out] == [{"score", "label"}] * text_model.num_labels
    scores = [x["score"] for x in out]
    assert scores == sorted(scores, reverse=True)
    probs = softmax(text_model.reference([TEXTS[TEXT]])[0].logits)
    assert {x["label"] for x in out} == set(text_model.labels)  # from labels.json
    for x in out:
        assert abs(x["score"] - probs[text_model.labels.index(x["label"])]) < 1e-5, (x, probs)

    r = curl(server, "POST", "/predict", {"inputs": TEXT, "raw_scores": True})
    logits = text_model.reference([TEXTS[TEXT]])[0].logits
    for x in r.json():
        assert abs(x["score"] - logits[text_model.labels.index(x["label"])]) < 1e-4

    texts = list(TEXTS)[:3]
    for inputs in ([[t] for t in texts], texts):  # [["a"], ["b"], ["c"]] and ["a", "b", "c"]
        r = curl(server, "POST", "/predict", {"inputs": inputs})
        assert r.status == 200
        out = r.json()
        assert len(out) == 3 and all(len(row) == text_model.num_labels for row in out)
        for row, t in zip(out, texts):
            best = max(row, key=lambda x: x["score"])
            assert best == row[0]
            assert text_model.labels.index(best["label"]) == int(np.argmax(text_model.reference([TEXTS[t]])[0].logits))

    r = curl(server, "POST", "/predict", {"inputs": ["a", "b"]})
    assert r.status == 422 and "pair" in r.json()["error"] and r.json()["error_type"] == "Validation"


def test_tei_tokenize(curl, server):
    r = curl(server, "POST", "/tokenize", {"inputs": [TEXT, "zebra"]})
    assert r.status == 200
    out = r.json()
    assert [[t["id"] for t in row] for row in out] == [TEXTS[TEXT], TEXTS["zebra"]]
    words = {i: w for w, i in V.items()}
    for source, row in zip([TEXT, "zebra"], out):
        for t in row:
            assert set(t) == {"id", "text", "special", "start", "stop"}
            # Hugging Face's special-tokens mask: what the post-processor adds, not the [UNK]
            # the model made of an unknown word ("zebra")
            assert t["special"] == (words[t["id"]] in ("[CLS]", "[SEP]")), t
            if t["special"]:  # TEI: the token's own text, no offsets
                assert t["text"] == words[t["id"]] and t["start"] is None and t["stop"] is None
            else:  # TEI: the text's characters [start, stop), in code points
                assert t["text"] == source[t["start"]:t["stop"]] and t["start"] < t["stop"], t
    assert [(t["text"], t["start"], t["stop"]) for t in out[1] if not t["special"]] == [("zebra", 0, 5)]
    assert words[out[1][1]["id"]] == "[UNK]"
    # Offsets through the normalizer: lower-cased, accents stripped, the original's characters.
    r = curl(server, "POST", "/tokenize", {"inputs": "Héllo  WÖRLD!", "add_special_tokens": False})
    assert [(words[t["id"]], t["text"], t["start"], t["stop"]) for t in r.json()[0]] == \
        [("hello", "Héllo", 0, 5), ("world", "WÖRLD", 7, 12), ("!", "!", 12, 13)]
    r = curl(server, "POST", "/tokenize", {"inputs": "the lazy dog", "add_special_tokens": False})
    assert r.status == 200 and [t["id"] for t in r.json()[0]] == ids("the", "lazy", "dog")


def test_tei_info_and_health(curl, server, text_model, ids_server, embed_server):
    r = curl(server, "GET", "/info")
    assert r.status == 200
    info = r.json()
    assert info["model_id"] == text_model.name and info["model_dtype"] == "float32"
    assert info["model_type"]["classifier"]["id2label"] == {str(i): l for i, l in enumerate(text_model.labels)}
    assert info["model_type"]["classifier"]["label2id"] == {l: i for i, l in enumerate(text_model.labels)}
    assert info["max_input_length"] == 512 and info["max_client_batch_size"] == 2048
    assert info["max_batch_tokens"] == 16384 and info["max_batch_requests"] == 256
    assert info["accepts_text"] is True and info["backend"] == "cpu" and info["version"]
    info = curl(ids_server, "GET", "/info").json()
    assert info["model_type"]["classifier"]["id2label"] == {"0": "LABEL_0", "1": "LABEL_1", "2": "LABEL_2"}
    assert info["accepts_text"] is False
    assert curl(embed_server, "GET", "/info").json()["model_type"] == {"embedding": {"pooling": "attention"}}

    r = curl(server, "GET", "/health")
    assert r.status == 200 and r.body == b""
    r = curl(server, "POST", "/health")
    assert r.status == 405 and r.headers["allow"] == "GET"


def test_tei_root_route(curl, server, embed_server, embed_model):
    r = curl(server, "POST", "/", {"inputs": TEXT})  # a classifier head: /predict
    assert r.status == 200 and {x["label"] for x in r.json()} == {"negative", "neutral", "positive"}
    r = curl(embed_server, "POST", "/", {"inputs": TEXT})  # no head: /embed
    assert r.status == 200
    assert_close(r.json()[0], embed_model.unit(TEXTS[TEXT]))
    r = curl(embed_server, "POST", "/predict", {"inputs": TEXT})
    assert r.status == 422 and "classifier" in r.json()["error"]


def test_tei_errors_and_unknown_route(curl, server, ids_server):
    r = curl(ids_server, "POST", "/tokenize", {"inputs": "hello"})
    assert r.status == 422 and "tokenizer" in r.json()["error"]
    r = curl(server, "POST", "/embed", {"inputs": "a", "prompt_name": "query"})
    assert r.status == 422 and "prompt_name" in r.json()["error"]
    r = curl(server, "POST", "/embed", {"inputs": "a", "normalize": "yes"})
    assert r.status == 422 and "normalize" in r.json()["error"]
    r = curl(server, "GET", "/no/such/route")
    assert r.status == 404 and r.json()["error_type"] == "NotFound" and "/no/such/route" in r.json()["error"]
    r = curl(server, "POST", "/embed", {"inputs": "a"}, headers=["Content-Encoding: gzip"])
    assert r.status == 501 and "Content-Encoding" in r.json()["error"]
    r = curl(server, "POST", "/embed", {"inputs": "a"}, headers=["x-request-timeout-ms: soon"])
    assert r.status == 422 and "x-request-timeout-ms" in r.json()["error"]
    r = curl(server, "POST", "/embed", {"inputs": "a"}, headers=["x-request-timeout-ms: 5000"])
    assert r.status == 200


# ----------------------------------------------------------------------------- KServe v2 REST


def test_kserve_health_metadata_config(curl, server, text_model):
    r = curl(server, "GET", "/v2")
    assert r.status == 200 and "binary_tensor_data" in r.json()["extensions"]
    assert curl(server, "GET", "/v2/health/live").status == 200
    assert curl(server, "GET", "/v2/health/ready").status == 200
    for path in (f"/v2/models/{text_model.name}", f"/v2/models/{text_model.name}/versions/1"):
        r = curl(server, "GET", path)
        assert r.status == 200 and r.json()["name"] == text_model.name and r.json()["versions"] == ["1"]
        assert {i["name"] for i in r.json()["inputs"]} == {"text", "input_ids", "attention_mask", "input_embeddings", "spans"}
    assert curl(server, "GET", f"/v2/models/{text_model.name}/ready").status == 200
    assert curl(server, "GET", f"/v2/models/{text_model.name}/versions/1/ready").status == 200
    r = curl(server, "GET", f"/v2/models/{text_model.name}/config")
    assert r.status == 200 and r.json()["name"] == text_model.name and r.json()["max_batch_size"] == 256
    r = curl(server, "GET", "/v2/models/nope")
    assert r.status == 404 and set(r.json()) == {"error"} and "nope" in r.json()["error"]
    assert curl(server, "GET", "/v2/models/nope/ready").status == 400  # as Triton answers
    assert curl(server, "GET", f"/v2/models/{text_model.name}/versions/2").status == 404
    assert curl(server, "GET", f"/v2/models/{text_model.name}/bogus").status == 404


def test_kserve_stats_routes(curl, server, text_model):
    for path in ("/v2/models/stats", f"/v2/models/{text_model.name}/stats",
                 f"/v2/models/{text_model.name}/versions/1/stats"):
        r = curl(server, "GET", path)
        assert r.status == 200
        (s,) = r.json()["model_stats"]
        assert s["name"] == text_model.name and s["version"] == "1"


def test_kserve_stats_json_has_every_count_as_triton_does(start, ids_model):
    """Triton's statistics JSON carries every duration's count and ns, zeros included
    ("fail":{"count":0,"ns":0}); a client reading stats["inference_stats"]["fail"]["count"]
    must find it, on a fresh server and after successes alike."""
    srv = start(ids_model)
    missing = []
    for stage in ("fresh", "after one infer"):
        if stage != "fresh":
            body = {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [5, 6, 7]}]}
            assert srv.call("POST", f"/v2/models/{ids_model.name}/infer", body).status == 200
        (s,) = srv.call("GET", f"/v2/models/{ids_model.name}/stats").json()["model_stats"]
        for key in ("inference_count", "execution_count", "last_inference"):
            if not isinstance(s.get(key), int):
                missing.append(f"{stage}: {key}")
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            d = s["inference_stats"][key]
            if not (isinstance(d.get("count"), int) and isinstance(d.get("ns"), int)):
                missing.append(f"{stage}: inference_stats.{key} = {json.dumps(d)}")
    assert not missing, "missing from the statistics JSON: " + "; ".join(missing)


def test_kserve_infer_json(curl, server, text_model):
    seqs = [[5, 6, 7, 8], [9, 10, 11, 12]]
    body = {"id": "curl-1", "inputs": [{"name": "input_ids", "shape": [2, 4], "datatype": "INT64", "data": seqs}],
            "outputs": [{"name": "embedding"}, {"name": "logits"}, {"name": "num_tokens"}]}
    for path in (f"/v2/models/{text_model.name}/infer", f"/v2/models/{text_model.name}/versions/1/infer"):
        r = curl(server, "POST", path, body)
        assert r.status == 200 and r.headers["content-type"] == "application/json"
        out = r.json()
        assert out["model_name"] == text_model.name and out["model_version"] == "1" and out["id"] == "curl-1"
        by = {o["name"]: o for o in out["outputs"]}
        assert [o["name"] for o in out["outputs"]] == ["embedding", "logits", "num_tokens"]
        assert by["embedding"]["datatype"] == "FP32" and by["embedding"]["shape"] == [2, text_model.hidden]
        assert by["num_tokens"]["data"] == [4, 4]
        emb = np.asarray(by["embedding"]["data"]).reshape(2, text_model.hidden)
        logits = np.asarray(by["logits"]["data"]).reshape(2, text_model.num_labels)
        for r_, w in enumerate(text_model.reference(seqs)):
            assert_close(emb[r_], w.embedding)
            assert_close(logits[r_], w.logits)
    # text, normalised by the request parameter
    body = {"parameters": {"normalize": True},
            "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["the lazy dog"]}],
            "outputs": [{"name": "embedding"}]}
    r = curl(server, "POST", f"/v2/models/{text_model.name}/infer", body)
    assert r.status == 200
    assert_close(r.json()["outputs"][0]["data"], text_model.unit(TEXTS["the lazy dog"]))


def test_kserve_infer_binary_output_by_curl(curl, server, text_model):
    body = {"parameters": {"binary_data_output": True},
            "inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [[5, 6, 7]]}],
            "outputs": [{"name": "embedding"}]}
    r = curl(server, "POST", f"/v2/models/{text_model.name}/infer", body)
    assert r.status == 200 and r.headers["content-type"] == "application/octet-stream"
    n = int(r.headers["inference-header-content-length"])
    header = json.loads(r.body[:n])
    size = header["outputs"][0]["parameters"]["binary_data_size"]
    assert size == 4 * text_model.hidden and len(r.body) == n + size
    assert_close(np.frombuffer(r.body[n:], "<f4"), text_model.reference([[5, 6, 7]])[0].embedding)


def test_kserve_infer_errors(curl, server, text_model):
    r = curl(server, "POST", "/v2/models/nope/infer",
             {"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64", "data": [5]}]})
    assert r.status == 404 and set(r.json()) == {"error"} and "nope" in r.json()["error"]
    r = curl(server, "POST", f"/v2/models/{text_model.name}/infer", {"inputs": [{"name": "input_ids"}]})
    assert r.status == 400 and "inputs[0] (input_ids).datatype" in r.json()["error"]
    r = curl(server, "POST", f"/v2/models/{text_model.name}/infer", {"inputs": 3})
    assert r.status == 400 and r.json()["error"].startswith("inputs")
    r = curl(server, "POST", f"/v2/models/{text_model.name}/infer",
             {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", "data": [5, 99999]}]})
    assert r.status == 400 and "input_ids" in r.json()["error"]
    r = curl(server, "GET", f"/v2/models/{text_model.name}/infer")
    assert r.status == 405 and r.headers["allow"] == "POST"


# ----------------------------------------------------------------------------- keep-alive


def test_keep_alive_over_one_connection(server, text_model):
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    json_h = {"Content-Type": "application/json"}
    steps = [
        ("GET", "/health", None, 200),
        ("POST", "/v1/embeddings", {"input": TEXT}, 200),
        ("POST", "/embed", {"inputs": "the lazy dog"}, 200),
        ("POST", "/embed", {"inputs": ""}, 422),  # an error answer keeps the connection too
        ("GET", f"/v2/models/{text_model.name}", None, 200),
        ("POST", f"/v2/models/{text_model.name}/infer",
         {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [5, 6, 7]}]}, 200),
        ("GET", "/nope", None, 404),
        ("GET", "/info", None, 200),
        ("POST", "/v1/embeddings", {"input": ["the lazy dog", TEXT]}, 200),
    ]
    try:
        local = None
        for method, path, body, status in steps:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=json_h)
            r = conn.getresponse()
            data = r.read()
            assert r.status == status, (method, path, r.status, data[:300])
            assert (r.getheader("connection") or "").lower() != "close", (method, path)
            here = conn.sock.getsockname()
            assert local in (None, here), f"{method} {path}: a new connection ({local} then {here})"
            local = here
        last = json.loads(data)["data"]
        assert_close(last[0]["embedding"], text_model.unit(TEXTS["the lazy dog"]))
        assert_close(last[1]["embedding"], unit(text_model.unit(TEXTS[TEXT])))
    finally:
        conn.close()

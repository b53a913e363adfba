"""Several models and versions served at once: each answer equal to the float64 reference of
the version that computed it, and saying which model and version that was, in every protocol
(KServe v2 gRPC and REST through tritonclient, fastformer.v1 Encode, OpenAI's `model`);
unknown and unready models refused with a message naming them; per-model metrics."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json
import os
import subprocess

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import REPO, TOL, check_result, close, desc, grpc_error, infer, response_model

ALL_VERSIONS = "version_policy: { all: {} }\n"


@pytest.fixture
def two_models(start, repo, sources):
    """embed with versions 1 and 2 both served (version_policy all) and classify version 1;
    --default-model embed."""
    repo.add("embed", 1, sources.v1)
    repo.add("embed", 2, sources.v2)
    repo.config("embed", ALL_VERSIONS)
    repo.add("classify", 1, sources.classify)
    return start(repo, default_model="embed")


def test_two_models_at_once_each_equal_to_its_reference(two_models, sources):
    """Concurrent requests to classify, embed v1, embed v2 and embed (newest) over gRPC, and the
    same over HTTP: every answer equals its version's reference and names that model and version."""
    srv = two_models
    cases = [("classify", "1", "1", sources.classify), ("classify", "", "1", sources.classify),
             ("embed", "1", "1", sources.v1), ("embed", "2", "2", sources.v2), ("embed", "", "2", sources.v2)]
    work = []
    for i in range(40):
        model, version, answered, source = cases[i % len(cases)]
        work.append((model, version, answered, source, source.seqs([1 + (7 * i) % 60, 1 + (13 * i) % 90])))

    def one(item):
        model, version, answered, source, seqs = item
        c = srv.grpc()
        try:
            outs = ("embedding", "logits") if model == "classify" else ("embedding", "token_embeddings")
            result = infer(c, grpcclient, model, seqs, version=version, outputs=outs)
        finally:
            c.close()
        assert response_model(result) == (model, answered), (item[:3], response_model(result))
        check_result(result, source, seqs, f"{model} v{answered} (asked {version or 'newest'})")
        if model == "embed":
            tok = result.as_numpy("token_embeddings")
            for r, s in enumerate(seqs):
                ok, worst = close(tok[r, :len(s)], source.reference(s).token_embeddings)
                assert ok, f"{model} v{answered} row {r}: token_embeddings differ by {worst:.2e}"
        return True

    with cf.ThreadPoolExecutor(8) as pool:
        assert all(pool.map(one, work))

    h = srv.http()
    try:
        for model, version, answered, source in cases:
            seqs = source.seqs([19, 4])
            result = infer(h, httpclient, model, seqs, version=version)
            assert response_model(result) == (model, answered)
            check_result(result, source, seqs, f"HTTP {model} v{answered}")
        meta = h.get_model_metadata("embed")
        assert sorted(meta["versions"]) == ["1", "2"], meta
        assert h.is_model_ready("embed", "1") and h.is_model_ready("embed", "2") and h.is_model_ready("classify", "1")
    finally:
        h.close()


def test_model_config_and_metadata_per_model(two_models, sources):
    c = two_models.grpc()
    try:
        meta = c.get_model_metadata("classify", as_json=True)
        assert meta["name"] == "classify" and meta["versions"] == ["1"]
        out = {t["name"]: [int(d) for d in t["shape"]] for t in meta["outputs"]}
        assert out["logits"] == [-1, 3] and out["embedding"] == [-1, sources.classify.hidden]
        meta = c.get_model_metadata("embed", "1", as_json=True)
        assert meta["name"] == "embed"
        out = {t["name"]: [int(d) for d in t["shape"]] for t in meta["outputs"]}
        assert out["embedding"] == [-1, sources.v1.hidden] and "logits" not in out
        assert c.get_model_config("classify", as_json=True)["config"]["name"] == "classify"
        stats = c.get_inference_statistics("embed", "1", as_json=True)
        assert [(s["name"], s["version"]) for s in stats["model_stats"]] == [("embed", "1")], stats
    finally:
        c.close()


def test_unknown_model_and_version_are_not_found(two_models, sources):
    srv = two_models
    seqs = sources.v1.seqs([5])
    c, h = srv.grpc(), srv.http()
    try:
        e = grpc_error(infer, c, grpcclient, "nope", seqs)
        assert e.status() == "StatusCode.NOT_FOUND", desc(e)
        assert "model 'nope'" in e.message() and "not in the repository" in e.message(), desc(e)
        e = grpc_error(infer, c, grpcclient, "embed", seqs, version="7")
        assert e.status() == "StatusCode.NOT_FOUND" and "embed" in e.message() and "7" in e.message(), desc(e)
        assert not c.is_model_ready("nope")
        e = grpc_error(c.get_model_metadata, "nope")
        assert e.status() == "StatusCode.NOT_FOUND" and "nope" in e.message(), desc(e)

        e = grpc_error(infer, h, httpclient, "nope", seqs)
        assert e.status() == "404" and "nope" in e.message(), desc(e)
        e = grpc_error(infer, h, httpclient, "embed", seqs, version="7")
        assert e.status() == "404" and "7" in e.message(), desc(e)
        r = srv.rest("POST", "/v1/embeddings", {"model": "nope", "input": [[5, 6]]})
        assert r.status == 404 and "nope" in r.error_message(), r
    finally:
        c.close()
        h.close()


def test_fastformer_v1_encode_routes_by_model_name_and_version(two_models, sources, v1api):
    """fastformer.v1: EncodeRequest.model_name / model_version route; the EncodeResponse carries
    model_name / model_version; empty means --default-model (embed) at its newest version;
    GetModelInfo answers per model and version; an unknown model is NOT_FOUND naming it."""
    url = two_models.url
    seqs = sources.classify.seqs([12, 30])
    cases = [("classify", "", "classify", "1", sources.classify), ("embed", "1", "embed", "1", sources.v1),
             ("embed", "", "embed", "2", sources.v2), ("", "", "embed", "2", sources.v2),
             ("", "1", "embed", "1", sources.v1)]
    for name, version, want_name, want_version, source in cases:
        resp = v1api.encode(url, seqs, model_name=name, model_version=version, return_logits=want_name == "classify")
        assert (resp.model_name, resp.model_version) == (want_name, want_version), (name, version, resp.model_name,
                                                                                     resp.model_version)
        assert len(resp.encodings) == len(seqs)
        for r, s in enumerate(seqs):
            want = source.reference(s)
            ok, worst = close(np.asarray(resp.encodings[r].embedding), want.embedding)
            assert ok, f"Encode {name or '(default)'} v{version or 'newest'} row {r}: {worst:.2e} (tolerance {TOL})"
            if want_name == "classify":
                ok, worst = close(np.asarray(resp.encodings[r].logits), want.logits)
                assert ok, f"Encode classify logits row {r}: {worst:.2e}"

    info = v1api.model_info(url, model_name="classify")
    assert (info.model_name, info.model_version, info.num_labels, info.hidden_size) == \
        ("classify", "1", 3, sources.classify.hidden)
    info = v1api.model_info(url)
    assert (info.model_name, info.model_version, info.num_labels) == ("embed", "2", 0)
    info = v1api.model_info(url, model_name="embed", model_version="1")
    assert (info.model_name, info.model_version) == ("embed", "1")

    with pytest.raises(grpc.RpcError) as e:
        v1api.encode(url, seqs, model_name="nope")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details(), e.value
    with pytest.raises(grpc.RpcError) as e:
        v1api.encode(url, seqs, model_name="embed", model_version="9")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND and "9" in e.value.details(), e.value


# Runs under Debian's /usr/bin/python3, where tests/python_client tests the client (this suite's
# venv has a newer protobuf than the Debian protoc the client generates its stubs with).
CLIENT_SCRIPT = r"""
import json, sys
import grpc
from fastformer_client import Client
from fastformer_client.errors import FastformerError
url, seqs = sys.argv[1], json.loads(sys.argv[2])
out = {"encode": [], "errors": []}
with Client(url, deadline_s=30) as c:
    for name, version in (("classify", None), ("embed", 1), (None, None)):
        r = c.encode(seqs, model_name=name, model_version=version, return_result=True)
        out["encode"].append([name, version, r.model_name, r.model_version, r.embeddings.tolist()])
    info = c.model_info(model_name="embed", model_version="1")
    out["info"] = [info["model_name"], info["model_version"], c.model_info(model_name="classify")["num_labels"]]
    out["stream"] = sorted([r.request_id, r.model_name, r.model_version] for r in c.encode_stream(
        [{"sequences": seqs, "model_name": "classify"}, {"sequences": seqs, "model_version": "1"}, seqs]))
    try:
        c.encode(seqs, model_name="nope")
    except FastformerError as e:
        out["errors"].append([e.code.name, e.details])
    try:
        c.encode(seqs, model_version=1.5)
    except TypeError as e:
        out["errors"].append(["TypeError", str(e)])
print(json.dumps(out))
"""


def test_python_client_routes_by_model_name_and_version(two_models, sources):
    """Our Python client (client/python): encode(model_name=, model_version=) and
    model_info(model_name=) route, the result names who answered, encode_stream's per-message
    model_name is honoured, and an unknown model raises NOT_FOUND naming it."""
    seqs = sources.classify.seqs([11, 25])
    env = dict(os.environ, PYTHONPATH=str(REPO / "client" / "python"))
    run = subprocess.run(["/usr/bin/python3", "-c", CLIENT_SCRIPT, two_models.url, json.dumps(seqs)],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)
    want = {("classify", None): (("classify", "1"), sources.classify), ("embed", 1): (("embed", "1"), sources.v1),
            (None, None): (("embed", "2"), sources.v2)}
    assert len(out["encode"]) == 3
    for name, version, got_name, got_version, emb in out["encode"]:
        (answered, source) = want[(name, version)]
        assert (got_name, got_version) == answered, (name, version, got_name, got_version)
        for r, s in enumerate(seqs):
            ok, worst = close(np.asarray(emb[r]), source.reference(s).embedding)
            assert ok, f"client encode {name} v{version} row {r}: {worst:.2e}"
    assert out["info"] == ["embed", "1", 3], out["info"]
    assert out["stream"] == [["0", "classify", "1"], ["1", "embed", "1"], ["2", "embed", "2"]], out["stream"]
    (code, msg), (kind, _) = out["errors"]
    assert code == "NOT_FOUND" and "nope" in msg, out["errors"]
    assert kind == "TypeError", out["errors"]


def test_openai_model_field_routes_and_headers_say_who_answered(two_models, sources):
    """HTTP: OpenAI's `model` picks the model; x-fastformer-model / -version name who answered."""
    srv = two_models
    for model, want_model, want_version, source in (("classify", "classify", "1", sources.classify),
                                                     ("embed", "embed", "2", sources.v2),
                                                     (None, "embed", "2", sources.v2)):
        seq = source.seqs([9])[0]
        body = {"input": [seq], "encoding_format": "base64"}
        if model:
            body["model"] = model
        r = srv.rest("POST", "/v1/embeddings", body)
        assert r.status == 200, (r.status, r.body[:300])
        assert (r.headers.get("x-fastformer-model"), r.headers.get("x-fastformer-model-version")) == \
            (want_model, want_version), r.headers
        emb = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), dtype="<f4")
        want = np.asarray(source.reference(seq).embedding, dtype=np.float64)
        ok, worst = close(emb, want / np.linalg.norm(want))
        assert ok, f"OpenAI {model}: {worst:.2e}"


def test_per_model_metrics(two_models, sources):
    """fastformer_model_state{model,version,state} is 1 for the current state; fastformer_tokens_total
    carries model and version labels and counts each version's tokens."""
    srv = two_models
    for model, version in (("embed", "1"), ("embed", "2"), ("classify", "1")):
        assert srv.metric("fastformer_model_state", model=model, version=version, state="READY") == 1
        for other in ("LOADING", "UNLOADING", "UNAVAILABLE"):
            assert srv.metric("fastformer_model_state", model=model, version=version, state=other) == 0
    before = {k: srv.metric("fastformer_tokens_total", model=k[0], version=k[1])
              for k in (("embed", "1"), ("embed", "2"), ("classify", "1"))}
    c = srv.grpc()
    sent = {("embed", "1"): 0, ("embed", "2"): 0, ("classify", "1"): 0}
    try:
        for (model, version), source, lengths in ((("embed", "1"), sources.v1, [10, 20]),
                                                  (("embed", "2"), sources.v2, [7]),
                                                  (("classify", "1"), sources.classify, [3, 4, 5])):
            infer(c, grpcclient, model, source.seqs(lengths), version=version)
            sent[(model, version)] += sum(lengths)
    finally:
        c.close()
    text = srv.scrape()
    lines = [line for line in text.splitlines() if line.startswith("fastformer_tokens_total{")]
    assert lines and all('model="' in line and 'version="' in line for line in lines), lines
    for k, n in sent.items():
        grown = lambda: srv.metric("fastformer_tokens_total", model=k[0], version=k[1]) - before[k]
        srv.wait_for(lambda: grown() >= n, f"fastformer_tokens_total{{model={k[0]},version={k[1]}}} += {n}",
                     timeout=5)
        assert grown() == n, f"fastformer_tokens_total{{model={k[0]},version={k[1]}}} grew by {grown()}, not {n}"
    for name in ("fastformer_queue_tokens", "fastformer_batch_compute_duration_seconds_count",
                 "fastformer_sequences_total"):
        assert any(line.startswith(name + "{") and 'model="classify"' in line and 'version="1"' in line
                   for line in text.splitlines()), f"{name} has no model/version labels"

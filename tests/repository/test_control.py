"""The repository's control: RepositoryIndex, RepositoryModelLoad and RepositoryModelUnload over
gRPC (tritonclient.grpc) and their REST twins (tritonclient.http, raw HTTP), in each control
mode (none, explicit, poll and SIGHUP), and a broken version that leaves the serving one
untouched (docs/operations.md: the model repository)."""

from __future__ import annotations

import json
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import check_result, desc, grpc_error, infer, response_model

READY, UNAVAILABLE = "READY", "UNAVAILABLE"


def states(index):
    return {k: v[0] for k, v in index.items()}


def make_repo(repo, sources, classify=True):
    repo.add("embed", 1, sources.v1)
    repo.add("embed", 2, sources.v2)
    if classify:
        repo.add("classify", 1, sources.classify)


# ----------------------------------------------------------------------------- explicit mode, gRPC


def test_explicit_index_load_unload_grpc(start, repo, sources):
    """Explicit mode with --load-model embed: embed's newest version (policy latest 1) is READY,
    its older one and classify are listed UNAVAILABLE; classify loads, serves and unloads through
    tritonclient.grpc, with the states, reasons, ModelReady and the metric at each step."""
    make_repo(repo, sources)
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    c = srv.grpc()
    try:
        index, models = srv.index(c)
        assert [(m["name"], m["version"]) for m in models] == [("classify", "1"), ("embed", "1"), ("embed", "2")], \
            "every version directory, sorted by name then version"
        assert states(index) == {("classify", "1"): UNAVAILABLE, ("embed", "1"): UNAVAILABLE, ("embed", "2"): READY}
        assert index[("classify", "1")][1] == "not loaded", index
        assert index[("embed", "1")][1], "an UNAVAILABLE version says why"

        assert c.is_server_ready(), "ServerReady: every --load-model model has a READY version"
        assert c.is_model_ready("embed") and c.is_model_ready("embed", "2")
        assert not c.is_model_ready("embed", "1")
        assert not c.is_model_ready("classify") and not c.is_model_ready("classify", "1")
        assert "model_repository" in c.get_server_metadata(as_json=True)["extensions"]

        seqs = sources.classify.seqs([5, 17])
        c.load_model("classify")
        index, _ = srv.index(c)
        assert index[("classify", "1")][0] == READY, index
        assert c.is_model_ready("classify", "1") and c.is_model_ready("classify")
        assert srv.metric("fastformer_model_state", model="classify", version="1", state="READY") == 1
        result = infer(c, grpcclient, "classify", seqs, outputs=("embedding", "logits"))
        assert response_model(result) == ("classify", "1")
        check_result(result, sources.classify, seqs, "classify")
        result = infer(c, grpcclient, "embed", seqs)
        assert response_model(result) == ("embed", "2")
        check_result(result, sources.v2, seqs, "embed")

        c.unload_model("classify")  # returns once done
        index, _ = srv.index(c)
        assert index[("classify", "1")] == (UNAVAILABLE, "unloaded"), index
        assert index[("embed", "2")][0] == READY
        assert not c.is_model_ready("classify", "1")
        assert srv.metric("fastformer_model_state", model="classify", version="1", state="UNAVAILABLE") == 1
        assert srv.metric("fastformer_model_state", model="classify", version="1", state="READY") == 0
        e = grpc_error(infer, c, grpcclient, "classify", seqs)
        assert e.status() == "StatusCode.UNAVAILABLE" and "classify" in e.message(), desc(e)
        assert c.is_server_ready(), "classify was not one the server was started to serve"

        c.load_model("classify")  # loads again after an unload
        assert c.is_model_ready("classify", "1")
        check_result(infer(c, grpcclient, "classify", seqs), sources.classify, seqs, "classify reloaded")

        e = grpc_error(c.load_model, "nope")
        assert e.status() == "StatusCode.NOT_FOUND" and "nope" in e.message(), desc(e)
        c.unload_model("nope")  # as Triton: unloading what is not loaded does nothing, successfully
    finally:
        c.close()
    lines = [line for line in srv.log_text().splitlines() if "classify version 1" in line]
    assert any("model classify version 1 READY in" in line for line in lines), "\n".join(lines)
    assert any("model classify version 1 unloaded" in line for line in lines), \
        "no log line 'model classify version 1 unloaded' (the pinned log line); its lines:\n" + "\n".join(lines)


def test_a_model_not_loaded_yet_is_unavailable_not_unknown(start, repo, sources):
    """A model whose directory is in the repository but not loaded (explicit mode, not in
    --load-model; the index lists it UNAVAILABLE "not loaded") is known: a request for it answers
    UNAVAILABLE (HTTP 503) naming it, not NOT_FOUND (which is for names the repository lacks)."""
    make_repo(repo, sources)
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    assert srv.index()[0][("classify", "1")] == (UNAVAILABLE, "not loaded")
    seqs = sources.classify.seqs([5, 17])
    c, h = srv.grpc(), srv.http()
    try:
        e = grpc_error(infer, c, grpcclient, "classify", seqs)
        assert e.status() == "StatusCode.UNAVAILABLE" and "classify" in e.message(), desc(e)
        e = grpc_error(infer, h, httpclient, "classify", seqs)
        assert e.status() == "503" and "classify" in e.message(), desc(e)
    finally:
        c.close()
        h.close()


def test_unload_the_started_model_makes_the_server_unready(start, repo, sources):
    """ServerReady means "the models this server was started to serve are READY": unloading
    --load-model's model turns it false (and the HTTP /v2/health/ready 400, as Triton answers),
    loading it back true."""
    make_repo(repo, sources, classify=False)
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    c = srv.grpc()
    try:
        c.unload_model("embed")
        assert not c.is_server_ready()
        assert srv.rest("GET", "/v2/health/ready").status == 400
        c.load_model("embed")
        assert c.is_server_ready()
        assert srv.rest("GET", "/v2/health/ready").status == 200
        assert c.is_model_ready("embed", "2")
    finally:
        c.close()


# ----------------------------------------------------------------------------- explicit mode, HTTP


def test_explicit_index_load_unload_http(start, repo, sources):
    """The same through tritonclient.http (POST /v2/repository/index with an empty body,
    /v2/repository/models/{m}/load and /unload), and the raw REST shapes."""
    make_repo(repo, sources)
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    h = srv.http()
    try:
        index = h.get_model_repository_index()
        assert isinstance(index, list)
        assert [(m["name"], m["version"], m["state"]) for m in index] == [
            ("classify", "1", UNAVAILABLE), ("embed", "1", UNAVAILABLE), ("embed", "2", READY)], index
        assert {m["name"]: m.get("reason") for m in index if m["version"] == "1"}["classify"] == "not loaded"
        assert "model_repository" in h.get_server_metadata()["extensions"]
        assert h.is_model_ready("embed", "2") and not h.is_model_ready("embed", "1")
        assert not h.is_model_ready("classify")

        r = srv.rest("POST", "/v2/repository/index", {"ready": True})
        assert r.status == 200, r
        assert [(m["name"], m["version"], m["state"]) for m in r.json()] == [("embed", "2", READY)]

        seqs = sources.classify.seqs([9, 3])
        h.load_model("classify")
        assert h.is_model_ready("classify", "1")
        result = infer(h, httpclient, "classify", seqs, outputs=("embedding", "logits"))
        assert response_model(result) == ("classify", "1")
        check_result(result, sources.classify, seqs, "classify over HTTP")
        result = infer(h, httpclient, "embed", seqs, version="2")
        assert response_model(result) == ("embed", "2")
        check_result(result, sources.v2, seqs, "embed over HTTP")

        h.unload_model("classify")
        states_now = {(m["name"], m["version"]): (m["state"], m.get("reason")) for m in h.get_model_repository_index()}
        assert states_now[("classify", "1")] == (UNAVAILABLE, "unloaded"), states_now
        assert not h.is_model_ready("classify", "1")
        e = grpc_error(infer, h, httpclient, "classify", seqs)
        assert e.status() == "503" and "classify" in e.message(), desc(e)

        r = srv.rest("POST", "/v2/repository/models/classify/load")  # no body at all
        assert r.status == 200 and r.json() == {}, r
        r = srv.rest("POST", "/v2/repository/models/classify/unload", {})
        assert r.status == 200 and r.json() == {}, r
        r = srv.rest("POST", "/v2/repository/models/nope/load", {})
        assert r.status == 404 and "nope" in r.json()["error"], r
        e = grpc_error(h.load_model, "nope")
        assert e.status() == "404" and "nope" in e.message(), desc(e)
    finally:
        h.close()


# ----------------------------------------------------------------------------- mode none


def test_mode_none_loads_everything_and_refuses_load_and_unload(start, repo, sources):
    """--model-control-mode none (the default): every model is loaded at start; load and unload
    answer FAILED_PRECONDITION (gRPC) / 400 (HTTP), naming the mode."""
    make_repo(repo, sources)
    srv = start(repo)
    c, h = srv.grpc(), srv.http()
    try:
        index, _ = srv.index(c)
        assert states(index) == {("classify", "1"): READY, ("embed", "1"): UNAVAILABLE, ("embed", "2"): READY}
        for fn in (c.load_model, c.unload_model):
            e = grpc_error(fn, "classify")
            assert e.status() == "StatusCode.FAILED_PRECONDITION", desc(e)
            assert "--model-control-mode none" in e.message(), desc(e)
        for fn in (h.load_model, h.unload_model):
            e = grpc_error(fn, "classify")
            assert e.status() == "400" and "--model-control-mode none" in e.message(), desc(e)
        assert c.is_model_ready("classify", "1"), "a refused unload leaves the model serving"
    finally:
        c.close()
        h.close()


# ----------------------------------------------------------------------------- broken versions


def truncate_weights(d):
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def wrong_shape(d):
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] * 2  # the tensors no longer fit it
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize("breakage", [truncate_weights, wrong_shape], ids=["truncated-safetensors", "wrong-shape"])
def test_broken_version_3_leaves_version_2_serving(start, repo, sources, breakage):
    """A version 3 that cannot load: the load answers an error, version 2 keeps serving (empty
    version routes to it, results equal to its reference), the index shows version 3 UNAVAILABLE
    with the reason, the log says so, fastformer_model_load_failures_total{model} counts it."""
    make_repo(repo, sources, classify=False)
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    c = srv.grpc()
    try:
        before = srv.metric("fastformer_model_load_failures_total", model="embed")
        repo.add("embed", 3, sources.v1, mutate=breakage)
        e = grpc_error(c.load_model, "embed")
        assert e.status() in ("StatusCode.INVALID_ARGUMENT", "StatusCode.INTERNAL"), desc(e)
        assert e.message(), "the load error carries the reason"
        index, _ = srv.index(c)
        state, reason = index[("embed", "3")]
        assert state == UNAVAILABLE and reason, index
        assert index[("embed", "2")][0] == READY, index
        assert c.is_server_ready() and c.is_model_ready("embed", "2") and not c.is_model_ready("embed", "3")
        seqs = sources.v2.seqs([11, 40, 2])
        result = infer(c, grpcclient, "embed", seqs)
        assert response_model(result) == ("embed", "2")
        check_result(result, sources.v2, seqs, "after the failed load")
        e = grpc_error(infer, c, grpcclient, "embed", seqs, version="3")
        assert e.status() == "StatusCode.UNAVAILABLE" and "embed" in e.message() and "3" in e.message(), desc(e)
        assert srv.metric("fastformer_model_load_failures_total", model="embed") == before + 1
        assert srv.metric("fastformer_model_state", model="embed", version="3", state="UNAVAILABLE") == 1
        assert srv.metric("fastformer_model_state", model="embed", version="2", state="READY") == 1
        assert "load of model embed version 3 failed" in srv.log_text()

        # the HTTP index shows the same reason
        h = srv.http()
        try:
            entry = {(m["name"], m["version"]): m for m in h.get_model_repository_index()}[("embed", "3")]
            assert entry["state"] == UNAVAILABLE and entry.get("reason") == reason, entry
            e = grpc_error(h.load_model, "embed")
            assert e.status() in ("400", "500") and e.message(), desc(e)
        finally:
            h.close()
        assert srv.metric("fastformer_model_load_failures_total", model="embed") == before + 2
        # a fixed version 4 loads over it
        repo.add("embed", 4, sources.v1)
        c.load_model("embed")
        result = infer(c, grpcclient, "embed", seqs)
        assert response_model(result) == ("embed", "4")
        check_result(result, sources.v1, seqs, "version 4")
    finally:
        c.close()


def test_bad_config_pbtxt_names_the_file_and_field(start, repo, sources):
    """An unknown field in config.pbtxt: that model fails to load, with a reason naming the file
    and the field; the other model serves."""
    make_repo(repo, sources)
    repo.config("classify", 'max_batch_size: 8\nno_such_field: 3\n')
    srv = start(repo, model_control_mode="explicit", load_model="embed")
    c = srv.grpc()
    try:
        e = grpc_error(c.load_model, "classify")
        assert "config.pbtxt" in e.message() and "no_such_field" in e.message(), desc(e)
        index, _ = srv.index(c)
        state, reason = index[("classify", "1")]
        assert state == UNAVAILABLE and "config.pbtxt" in reason and "no_such_field" in reason, index
        assert c.is_model_ready("embed", "2")
    finally:
        c.close()


# ----------------------------------------------------------------------------- poll mode, SIGHUP


def serving_version(c, seqs):
    return response_model(infer(c, grpcclient, "embed", seqs))[1]


def test_poll_mode_picks_up_new_versions_and_models(start, repo, sources):
    """--model-control-mode poll --repository-poll-secs 1: a new version directory serves within
    a few seconds (and the older one is unloaded: latest 1), a new model directory too; load and
    unload answer FAILED_PRECONDITION."""
    repo.add("embed", 1, sources.v1)
    srv = start(repo, model_control_mode="poll", repository_poll_secs=1)
    c = srv.grpc()
    try:
        seqs = sources.v1.seqs([13, 6])
        assert serving_version(c, seqs) == "1"
        e = grpc_error(c.load_model, "embed")
        assert e.status() == "StatusCode.FAILED_PRECONDITION", desc(e)

        t0 = time.monotonic()
        repo.add("embed", 2, sources.v2)
        srv.wait_for(lambda: c.is_model_ready("embed", "2"), "embed version 2 READY after the poll", timeout=8)
        took = time.monotonic() - t0
        result = infer(c, grpcclient, "embed", seqs)
        assert response_model(result) == ("embed", "2")
        check_result(result, sources.v2, seqs, "after the poll")
        srv.wait_for(lambda: srv.index(c)[0][("embed", "1")] == (UNAVAILABLE, "unloaded"),
                     "embed version 1 unloaded (latest 1)", timeout=10)
        print(f"poll: version 2 READY {took:.2f} s after its directory appeared")

        repo.add("classify", 1, sources.classify)
        srv.wait_for(lambda: c.is_model_ready("classify", "1"), "the new model classify READY", timeout=8)
        cseqs = sources.classify.seqs([8])
        check_result(infer(c, grpcclient, "classify", cseqs), sources.classify, cseqs, "classify")
    finally:
        c.close()


def test_sighup_rescans_in_poll_mode(start, repo, sources):
    """--repository-poll-secs 0: no periodic rescan; SIGHUP rescans, and the new version serves."""
    repo.add("embed", 1, sources.v1)
    srv = start(repo, model_control_mode="poll", repository_poll_secs=0)
    c = srv.grpc()
    try:
        seqs = sources.v1.seqs([21])
        repo.add("embed", 2, sources.v2)
        time.sleep(2.5)
        assert serving_version(c, seqs) == "1", "no rescan without SIGHUP at --repository-poll-secs 0"
        index, _ = srv.index(c)
        assert ("embed", "2") not in index or index[("embed", "2")][0] != READY, index
        srv.sighup()
        srv.wait_for(lambda: c.is_model_ready("embed", "2"), "embed version 2 READY after SIGHUP", timeout=15)
        result = infer(c, grpcclient, "embed", seqs)
        assert response_model(result) == ("embed", "2")
        check_result(result, sources.v2, seqs, "after SIGHUP")
        assert srv.proc.poll() is None
    finally:
        c.close()

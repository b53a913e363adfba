"""Priority classes (docs/operations.md, "Priority classes"): with bulk requests queued behind a
busy engine, an interactive request sent after them is answered before them, on every way of
choosing the class (the x-priority header, Cohere's input_type, the gRPC field through the
Python client, KServe's priority parameter); a bad class is refused by name; the per-class
metrics count them. A test of order, not of speed: one sequence a batch, and every batch
stalled STALL_MS (FASTFORMER_TEST_FAULTS: each sequence starts with [CLS]), so the calls queue
behind the first and their answers come back STALL_MS apart, in the order they were batched.
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import threading
import time

import pytest
from conftest import REPO, V, call

STALL_TOKEN = V["[CLS]"]  # a batch holding a sequence that starts with this id sleeps STALL_MS
STALL_MS = 250
BULK = 4
IDS = [STALL_TOKEN, V["the"], V["dog"]]


@pytest.fixture
def busy(embed_model, start):
    """A server that computes one sequence a batch, and the order its answers came back in."""
    srv = start(embed_model, max_batch_sequences=1, bulk_promote_after_ms=60000,
                env_extra={"FASTFORMER_TEST_FAULTS": f"stall_first_token={STALL_TOKEN}:{STALL_MS}"})
    return srv


def run_mix(srv, bulk_call, interactive_call):
    """A stalled batch first, then BULK bulk calls, then one interactive call; the order of
    their answers (names), each call's status checked by the callers."""
    done, lock = [], threading.Lock()

    def run(name, fn):
        fn()
        with lock:
            done.append(name)

    with cf.ThreadPoolExecutor(BULK + 2) as pool:
        stall = pool.submit(run, "stall", lambda: srv_ok(srv.call("POST", "/v1/embeddings",
                                                                 {"input": [IDS]})))
        time.sleep(0.05)  # the stalled batch is computing
        bulk = [pool.submit(run, f"bulk{i}", bulk_call) for i in range(BULK)]
        time.sleep(0.1)  # queued (one of them staged as the next batch)
        query = pool.submit(run, "interactive", interactive_call)
        for f in [stall, query, *bulk]:
            f.result(timeout=30)
    return done


def srv_ok(reply):
    assert reply.status == 200, reply.body
    return reply


def test_header_interactive_overtakes_queued_bulk(busy):
    done = run_mix(
        busy,
        lambda: srv_ok(busy.call("POST", "/v1/embeddings", {"input": [IDS]}, {"x-priority": "bulk"})),
        lambda: srv_ok(busy.call("POST", "/embed", {"inputs": "hello world"}, {"X-Priority": "interactive"})))
    # First in, first answered; the query next, ahead of the four bulk calls sent before it (one
    # queue for both classes would answer it last).
    assert done[0] == "stall" and done[1] == "interactive", done
    metrics = call(busy.metrics_port, "GET", "/metrics").body.decode()
    assert 'fastformer_priority_requests_total{model="http-embed",priority="bulk",version="1"} 4' in metrics, metrics
    assert 'fastformer_priority_requests_total{model="http-embed",priority="interactive",version="1"} 2' in metrics


def test_cohere_input_type_chooses_the_class(busy):
    docs = {"texts": ["the lazy dog"], "input_type": "search_document"}
    query = {"texts": ["hello"], "input_type": "search_query"}
    done = run_mix(busy, lambda: srv_ok(busy.call("POST", "/v2/embed", docs)),
                   lambda: srv_ok(busy.call("POST", "/v2/embed", query)))
    assert done[1] == "interactive", done


def test_grpc_and_kserve_fields_choose_the_class(busy):
    sys.path.insert(0, str(REPO / "client" / "python"))
    import fastformer_client
    import tritonclient.http as httpclient
    import numpy as np

    def kserve_interactive():
        c = httpclient.InferenceServerClient(f"127.0.0.1:{busy.http_port}")
        ids = httpclient.InferInput("input_ids", [1, 3], "INT64")
        ids.set_data_from_numpy(np.array([IDS], dtype=np.int64))
        c.infer("http-embed", [ids], priority=1)
        c.close()

    with fastformer_client.Client(busy.target, deadline_s=30) as c:
        done = run_mix(busy, lambda: c.encode([IDS], priority="bulk"), kserve_interactive)
    assert done[1] == "interactive", done


@pytest.mark.parametrize("headers, body, words", [
    ({"x-priority": "urgent"}, {"input": "hello"}, ['x-priority: expected "interactive" or "bulk"', "'urgent'"]),
])
def test_unknown_class_is_refused_by_name(embed_server, headers, body, words):
    reply = embed_server.call("POST", "/v1/embeddings", body, headers)
    assert reply.status == 400, reply.body
    for w in words:
        assert w in reply.error_message()
    ok = embed_server.call("POST", "/v1/embeddings", body)
    assert ok.status == 200, "a refused class costs no other request its answer"


def test_each_class_has_its_default_deadline(embed_model, start):
    """--bulk-timeout-ms: a bulk call that sets no deadline of its own, still queued behind a
    stalled batch when its class's deadline passes, is answered 504; an interactive one (no
    default deadline) waits and is answered."""
    srv = start(embed_model, max_batch_sequences=1, bulk_timeout_ms=100,
                env_extra={"FASTFORMER_TEST_FAULTS": f"stall_first_token={STALL_TOKEN}:{STALL_MS}"})
    with cf.ThreadPoolExecutor(3) as pool:
        stall = pool.submit(srv.call, "POST", "/v1/embeddings", {"input": [IDS]})
        time.sleep(0.05)
        bulk = pool.submit(srv.call, "POST", "/v1/embeddings", {"input": [[V["the"], V["dog"]]]},
                           {"x-priority": "bulk"})
        query = pool.submit(srv.call, "POST", "/v1/embeddings", {"input": [[V["the"], V["dog"]]]})
        assert stall.result(30).status == 200
        assert bulk.result(30).status == 504, bulk.result().body
        assert query.result(30).status == 200

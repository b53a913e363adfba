"""Faults: clients that vanish or stall, requests at every limit, an engine that fails, bad
start-up conditions and SIGTERM under continuous load. After each fault the server still
answers correctly and nothing leaked: the queue, in-flight and open-stream gauges are back to
zero, and every sequence sent was computed or dropped, once.

Engine faults and busy engines come from the test-only hook FASTFORMER_TEST_FAULTS
(server/cmd/test_faults.h): `fail_first_token=N` fails any batch holding a sequence whose first
token id is N; `stall_first_token=N:MS` makes such a batch sleep MS ms before compute, so the
tests know what is computing, staged or queued without relying on timing.

Some faults are covered elsewhere and not repeated here: deadlines and cancellation of queued
calls, overload (test_server_overload.py), bad input of every kind and the good side of the
position, vocabulary and request-token limits (test_server_bad_input.py), SIGTERM with a
fixed set of accepted calls and the second signal (test_server_lifecycle.py).
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

OK = grpc.StatusCode.OK
FAIL_TOKEN = 13    # first token id of a sequence whose batch fails
STALL_TOKEN = 14   # first token id of a sequence whose batch stalls STALL_MS
STALL_MS = 5000  # long enough for the test to queue its calls behind a stalled batch on a busy machine (3000
#                 was not, once, with the golden suite beside it in CI)
FAULTS = {"FASTFORMER_TEST_FAULTS": f"fail_first_token={FAIL_TOKEN},stall_first_token={STALL_TOKEN}:{STALL_MS}"}
D = 64  # the "head" model's hidden size


# ----------------------------------------------------------------------------- helpers


def _idle(m) -> bool:
    return all(m.value(g) == 0 for g in ("fastformer_queue_tokens", "fastformer_queue_sequences",
                                         "fastformer_inflight_requests", "fastformer_open_streams"))


def assert_nothing_leaked(srv, timeout=20.0):
    """The queue, in-flight and open-stream gauges return to zero."""
    m = srv.metrics_when(_idle, timeout)
    gauges = {g: m.value(g) for g in ("fastformer_queue_tokens", "fastformer_queue_sequences",
                                      "fastformer_inflight_requests", "fastformer_open_streams")}
    print(f"gauges after the fault: {gauges}")
    assert _idle(m), f"gauges not back to zero {timeout:.0f} s after the fault: {gauges}"
    return m


def assert_still_serving(e2e, models, srv, model_key="head"):
    """SERVING, and a unary call and a stream message are answered correctly."""
    assert srv.health_status("") == "SERVING", f"health after the fault: {srv.health_status('')}"
    model = models.get(model_key)
    seqs = [[5, 6, 0, 7], [9] * 20]
    resp = srv.stub.Encode(e2e.make_request(seqs, "ids", request_id="after"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("unary call after the fault", resp, model, seqs, request_id="after")
    reqs = [e2e.make_request(seqs[:1], "ids", request_id="s-after")]
    resps = list(srv.stub.EncodeStream(iter(reqs), timeout=e2e.RPC_TIMEOUT_S))
    assert len(resps) == 1, f"stream after the fault answered {len(resps)} messages"
    e2e.check_response("stream message after the fault", resps[0], model, seqs[:1], request_id="s-after")


def counted(m, before, name, **labels):
    return m.value(name, **labels) - before.value(name, **labels)


def sequences_accounted(m, before):
    """Sequences computed plus sequences dropped before compute since `before`."""
    return (counted(m, before, "fastformer_sequences_total")
            + counted(m, before, "fastformer_sequences_dropped_total"))


def wait_metrics(srv, pred, what, timeout=20.0):
    m = srv.metrics_when(pred, timeout)
    assert pred(m), f"timed out waiting for {what}"
    return m


def engine_busy(srv, stalled=1, staged=0):
    """Wait until `stalled` calls are computing and `staged` more are formed into the next batch:
    the queue is empty and that many calls are in flight."""
    n = stalled + staged
    return wait_metrics(srv, lambda m: m.value("fastformer_inflight_requests") == n
                        and m.value("fastformer_queue_sequences") == 0,
                        f"{n} calls in flight with an empty queue")


def stall_request(e2e, request_id="stall", n=8):
    return e2e.make_request([[STALL_TOKEN] + [3] * (n - 1)], "ids", request_id=request_id)


def result(future, timeout):
    try:
        return OK, "", future.result(timeout=timeout)
    except grpc.RpcError as e:
        return e.code(), e.details() or "", None


class HeldStream:
    """An EncodeStream call whose client sends only when told to; `close()` half-closes it."""

    _END = object()

    def __init__(self, stub, timeout=120):
        self._outbox = queue_mod.Queue()
        self.call = stub.EncodeStream(iter(self._outbox.get, self._END), timeout=timeout)

    def send(self, req):
        self._outbox.put(req)

    def close(self):
        self._outbox.put(self._END)

    def responses(self):
        """Every answer until the server ends the call: (code, details, [EncodeResponse])."""
        out = []
        try:
            for r in self.call:
                out.append(r)
            return OK, "", out
        except grpc.RpcError as e:
            return e.code(), e.details() or "", out


# ----------------------------------------------------------------------------- clients that vanish


def test_cancel_mid_flight(e2e, models, servers):
    """Calls cancelled while computing, while staged and while queued: each sequence is computed
    or dropped exactly once, the gauges return to zero, the uncancelled call is answered."""
    model = models.get("head")
    srv = servers.start("head", extra_env=FAULTS)
    before = srv.metrics()
    computing = srv.stub.Encode.future(stall_request(e2e, "computing"), timeout=60)
    engine_busy(srv, 1)
    staged = srv.stub.Encode.future(e2e.make_request([[20, 21, 22]], "ids"), timeout=60)
    engine_busy(srv, 1, 1)
    queued = [srv.stub.Encode.future(e2e.make_request([[30 + i] * 5, [40 + i] * 3], "ids"), timeout=60)
              for i in range(4)]
    keep_seqs = [[50, 51, 52, 53]]
    keep = srv.stub.Encode.future(e2e.make_request(keep_seqs, "ids", request_id="keep"), timeout=60)
    wait_metrics(srv, lambda m: m.value("fastformer_queue_sequences") == 9, "9 sequences queued")
    for f in [computing, staged] + queued:
        assert f.cancel(), "a call finished before it could be cancelled"
    code, msg, resp = result(keep, 60)
    assert code == OK, f"the call that was not cancelled got {code.name} ({msg!r})"
    e2e.check_response("uncancelled call", resp, model, keep_seqs, request_id="keep")
    m = assert_nothing_leaked(srv)
    sent = 1 + 1 + 2 * len(queued) + 1
    m = srv.metrics_when(lambda m: sequences_accounted(m, before) >= sent)
    print(f"sequences computed +{counted(m, before, 'fastformer_sequences_total'):.0f}, dropped "
          f"+{counted(m, before, 'fastformer_sequences_dropped_total'):.0f} of {sent} sent")
    assert sequences_accounted(m, before) == sent, "a sequence was lost or computed twice"
    assert counted(m, before, "fastformer_sequences_dropped_total", reason="cancelled") >= 2 * len(queued), \
        "cancelled queued sequences were computed"
    assert counted(m, before, "fastformer_requests_total", method="Encode") == 2 + len(queued) + 1, \
        "every call is counted once in fastformer_requests_total"
    assert_still_serving(e2e, models, srv)


@pytest.mark.parametrize("mode", ["stream", "unary"])
def test_client_killed_mid_flight(e2e, models, servers, mode):
    """fastformer-loadgen (16 streams, or 16 unary calls in flight) is SIGKILLed under load:
    the server answers into the void, drops what is queued, and is back to idle."""
    loadgen = e2e.require_binary("fastformer-loadgen")
    srv = servers.start("load", max_batch_tokens=2048, max_request_tokens=4096)
    before = srv.metrics()
    cmd = [str(loadgen), "--target", srv.target, "--concurrency", "16", "--lengths", "fixed:1500",
           "--duration", "60", "--warmup", "0"] + (["--stream"] if mode == "stream" else [])
    client = subprocess.Popen(e2e.die_with_parent(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        busy = lambda m: m.value("fastformer_inflight_requests") >= 8 and counted(  # noqa: E731
            m, before, "fastformer_sequences_total") >= 4
        m = srv.metrics_when(busy, 30)
        assert busy(m), f"the load generator never loaded the server (exit {client.poll()})"
        if mode == "stream":
            assert m.value("fastformer_open_streams") == 16, f"{m.value('fastformer_open_streams')} streams open"
        inflight = m.value("fastformer_inflight_requests")
    finally:
        client.kill()
        client.wait()
    print(f"killed the client with {inflight:.0f} requests in flight")
    m = assert_nothing_leaked(srv, timeout=60)
    method = "EncodeStream" if mode == "stream" else "Encode"
    answered = counted(m, before, "fastformer_requests_total", method=method)
    accounted = sequences_accounted(m, before)
    print(f"{method}: {answered:.0f} answered (by code: "
          f"{ {c: counted(m, before, 'fastformer_requests_total', method=method, code=c) for c in ('OK', 'CANCELLED')} }), "
          f"{accounted:.0f} sequences computed or dropped")
    assert answered == accounted, "every admitted request (one sequence each) is answered once"
    assert_still_serving(e2e, models, srv, "load")


def test_channel_closed_with_calls_in_flight(e2e, models, servers):
    """A client closes its channel with unary calls and stream messages in flight."""
    srv = servers.start("head", extra_env=FAULTS)
    before = srv.metrics()
    ch = srv.new_channel(own_connection=True)
    stub = e2e.pb_grpc.EncoderStub(ch)
    calls = [stub.Encode.future(stall_request(e2e, "stall"), timeout=60)]
    engine_busy(srv, 1)
    calls += [stub.Encode.future(e2e.make_request([[60 + i] * 9], "ids"), timeout=60) for i in range(5)]
    stream = HeldStream(stub)
    for i in range(3):
        stream.send(e2e.make_request([[70 + i] * 4], "ids", request_id=f"m{i}"))
    wait_metrics(srv, lambda m: m.value("fastformer_inflight_requests") == 9 and
                 m.value("fastformer_open_streams") == 1, "9 calls in flight and 1 stream open")
    ch.close()
    stream.close()
    codes = {result(f, 10)[0].name for f in calls}
    print(f"client side after close: {codes}")
    m = assert_nothing_leaked(srv)
    m = srv.metrics_when(lambda m: sequences_accounted(m, before) >= 9)
    assert sequences_accounted(m, before) == 9, "a sequence was lost or computed twice"
    assert_still_serving(e2e, models, srv)


def test_streams_held_open_are_bounded(e2e, models, servers):
    """Streams opened and never written to hold a slot each; --max-concurrent-streams bounds them:
    exactly the limit opens, one more is RESOURCE_EXHAUSTED naming the limit, unary calls go on,
    and a slot freed by a client is usable again."""
    limit = 4
    model = models.get("head")
    srv = servers.start("head", max_concurrent_streams=limit)
    before = srv.metrics()
    held = [HeldStream(srv.stub) for _ in range(limit)]
    wait_metrics(srv, lambda m: m.value("fastformer_open_streams") == limit, f"{limit} streams open")
    extra = HeldStream(srv.stub)
    code, msg, _ = extra.responses()
    print(f"stream {limit + 1}: {code.name}: {msg}")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"stream over the limit: {code.name} ({msg!r})"
    assert f"max_concurrent_streams {limit}" in msg, f"message {msg!r} does not name the limit"
    extra.close()
    seqs = [[5, 6, 7]]
    resp = srv.stub.Encode(e2e.make_request(seqs, "ids"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("unary call while the streams are held", resp, model, seqs)
    # the held streams still work: one message on each, then closed
    for i, s in enumerate(held[:2]):
        s.send(e2e.make_request(seqs, "ids", request_id=f"h{i}"))
        s.close()
        code, msg, resps = s.responses()
        assert code == OK and len(resps) == 1, f"held stream {i}: {code.name} {msg!r}, {len(resps)} answers"
        e2e.check_response(f"held stream {i}", resps[0], model, seqs, request_id=f"h{i}")
    wait_metrics(srv, lambda m: m.value("fastformer_open_streams") == limit - 2, "2 slots freed")
    again = HeldStream(srv.stub)
    again.send(e2e.make_request(seqs, "ids", request_id="again"))
    again.close()
    code, msg, resps = again.responses()
    assert code == OK and len(resps) == 1, f"a stream in a freed slot: {code.name} {msg!r}"
    for s in held[2:]:
        s.call.cancel()  # a client that gives up without closing
    m = assert_nothing_leaked(srv)
    assert counted(m, before, "fastformer_requests_total", method="EncodeStream", code="RESOURCE_EXHAUSTED") == 1
    assert_still_serving(e2e, models, srv)


# ----------------------------------------------------------------------------- limits


MSG_LIMIT = 64 * 1024


def _request_of_size(e2e, size):
    """A valid request of exactly `size` serialized bytes (the request_id pads it)."""
    req = e2e.make_request([[5, 6, 7]], "ids")
    pad = size - req.ByteSize()
    while True:
        req.request_id = "x" * pad
        if req.ByteSize() == size:
            return req
        pad -= req.ByteSize() - size


def test_limits_exactly_and_just_over(e2e, models, servers):
    """Each request limit at exactly its value (answered) and one over (the documented error,
    naming the field and the limit): --max-request-tokens, the model's max_position_embeddings,
    --max-message-bytes, and the batch budgets, which split work but never reject it."""
    model = models.get("head")
    srv = servers.start("head", max_request_tokens=1024, max_queue_tokens=4096, max_message_bytes=MSG_LIMIT,
                        max_batch_tokens=300, max_batch_sequences=3)
    # --max-request-tokens: 1024 tokens OK, 1025 INVALID_ARGUMENT
    at = [[7] * 512, [8] * 500, [9] * 12]
    resp = srv.stub.Encode(e2e.make_request(at, "ids", request_id="at"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("exactly max_request_tokens", resp, model, at, request_id="at")
    code, msg, _ = e2e.rpc_code(srv.stub.Encode, e2e.make_request(at[:2] + [[9] * 13], "ids"), timeout=10)
    print(f"max_request_tokens + 1: {code.name}: {msg}")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_request_tokens 1024" in msg and "1025" in msg, msg
    # max_position_embeddings per sequence, on a stream (in-band)
    reqs = [e2e.make_request([[11] * 512], "ids", request_id="pos-at"),
            e2e.make_request([[11] * 513], "ids", request_id="pos-over")]
    by_id = {r.request_id: r for r in srv.stub.EncodeStream(iter(reqs), timeout=e2e.RPC_TIMEOUT_S)}
    e2e.check_response("512 tokens on a stream", by_id["pos-at"], model, [[11] * 512])
    err = by_id["pos-over"].error
    print(f"513 tokens on a stream: {err.code}: {err.message}")
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "sequence 0" in err.message and "max_position_embeddings 512" in err.message, err.message
    # --max-message-bytes: exactly the limit OK, one byte more RESOURCE_EXHAUSTED naming both sizes
    req = _request_of_size(e2e, MSG_LIMIT)
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("a message of exactly max_message_bytes", resp, model, [[5, 6, 7]])
    req = _request_of_size(e2e, MSG_LIMIT + 1)
    code, msg, _ = e2e.rpc_code(srv.stub.Encode, req, timeout=10)
    print(f"max_message_bytes + 1: {code.name}: {msg}")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(MSG_LIMIT) in msg and str(MSG_LIMIT + 1) in msg, msg
    # batch budgets (300 tokens, 3 sequences): a request over both is split, a sequence over the
    # token budget runs alone; nothing is rejected
    before = srv.metrics()
    seqs = [[12] * 300, [18, 1], [15] * 301, [16] * 2, [17] * 3]
    resp = srv.stub.Encode(e2e.make_request(seqs, "ids"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("over the batch budgets", resp, model, seqs)
    m = srv.metrics_when(lambda m: counted(m, before, "fastformer_sequences_total") >= 5)
    batches = counted(m, before, "fastformer_batch_tokens_count")
    print(f"5 sequences over the batch budgets ran in {batches:.0f} batches")
    assert batches >= 3, f"{batches} batches: the 300-token / 3-sequence budgets were not applied"
    assert_still_serving(e2e, models, srv)


def test_queue_tokens_exactly_and_just_over(e2e, models, servers):
    """--max-queue-tokens: a queue filled to exactly the limit is admitted; one more token is
    RESOURCE_EXHAUSTED naming max_queue_tokens; afterwards the queue drains to zero."""
    model = models.get("head")
    limit = 1024
    srv = servers.start("head", extra_env=FAULTS, max_queue_tokens=limit, max_request_tokens=limit)
    computing = srv.stub.Encode.future(stall_request(e2e), timeout=60)
    engine_busy(srv, 1)
    staged = srv.stub.Encode.future(e2e.make_request([[20] * 10], "ids"), timeout=60)
    engine_busy(srv, 1, 1)
    full_seqs = [[21] * 512, [22] * 500, [23] * 12]
    full = srv.stub.Encode.future(e2e.make_request(full_seqs, "ids", request_id="full"), timeout=60)
    wait_metrics(srv, lambda m: m.value("fastformer_queue_tokens") == limit, f"{limit} tokens queued")
    code, msg, _ = e2e.rpc_code(srv.stub.Encode, e2e.make_request([[24]], "ids"), timeout=10)
    print(f"one token over a full queue: {code.name}: {msg}")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, f"{code.name} {msg!r}"
    assert f"max_queue_tokens {limit}" in msg, f"message {msg!r} does not name the limit"
    for f in (computing, staged):
        assert result(f, 60)[0] == OK
    code, msg, resp = result(full, 60)
    assert code == OK, f"the request that filled the queue exactly: {code.name} {msg!r}"
    e2e.check_response("a queue filled exactly", resp, model, full_seqs, request_id="full")
    assert_nothing_leaked(srv)
    assert_still_serving(e2e, models, srv)


# ----------------------------------------------------------------------------- engine failure


def test_engine_failure_fails_only_its_batch(e2e, models, servers):
    """A batch the engine fails on: its requests (and only they) get INTERNAL; the call that
    shared its batch fails with it, the calls before and after succeed; still SERVING. (Batches
    of at most 2 sequences, and a staged batch that is full: work that arrives later joins a
    staged batch that has room, docs/operations.md "Priority classes".)"""
    model = models.get("head")
    srv = servers.start("head", extra_env=FAULTS, max_batch_sequences=2)
    before = srv.metrics()
    bad_seqs, good_seqs = [[FAIL_TOKEN, 5, 6]], [[31, 32, 33]]
    computing = srv.stub.Encode.future(stall_request(e2e), timeout=60)
    engine_busy(srv, 1)
    staged = srv.stub.Encode.future(e2e.make_request(good_seqs * 2, "ids", request_id="staged"), timeout=60)
    engine_busy(srv, 1, 1)
    # these two queue together behind the staged batch, so they form one batch
    sharing = srv.stub.Encode.future(e2e.make_request(good_seqs, "ids", request_id="sharing"), timeout=60)
    bad = srv.stub.Encode.future(e2e.make_request(bad_seqs, "ids", request_id="bad"), timeout=60)
    wait_metrics(srv, lambda m: m.value("fastformer_queue_sequences") == 2, "2 sequences queued")
    got = {name: result(f, 60) for name, f in
           [("computing", computing), ("staged", staged), ("sharing", sharing), ("bad", bad)]}
    print({k: (c.name, msg) for k, (c, msg, _) in got.items()})
    assert got["computing"][0] == OK and got["staged"][0] == OK, "a batch before the failing one failed"
    e2e.check_response("batch before the failure", got["staged"][2], model, good_seqs * 2, request_id="staged")
    for name in ("sharing", "bad"):
        code, msg, _ = got[name]
        assert code == grpc.StatusCode.INTERNAL, f"{name}: {code.name} ({msg!r}), expected INTERNAL"
        assert "engine failure" in msg and "injected test fault" in msg, msg
    assert srv.health_status("") == "SERVING" and srv.health_status("fastformer.v1.Encoder") == "SERVING"
    resp = srv.stub.Encode(e2e.make_request(good_seqs, "ids", request_id="next"), timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("the call after the failure", resp, model, good_seqs, request_id="next")
    m = assert_nothing_leaked(srv)
    assert counted(m, before, "fastformer_batch_failures_total") == 1
    assert counted(m, before, "fastformer_requests_total", method="Encode", code="INTERNAL") == 2
    assert "engine failed on a batch of 2 sequences" in srv.log_text()
    assert_still_serving(e2e, models, srv)


def test_engine_failure_on_a_stream(e2e, models, servers):
    """One batch per sequence: on a stream, the failing message is answered INTERNAL in-band and
    the messages around it are answered; a unary call failing alongside does not stop the others."""
    model = models.get("head")
    srv = servers.start("head", extra_env=FAULTS, max_batch_sequences=1)
    bad_seq, good_seq = [FAIL_TOKEN, 5, 6], [31, 32, 33]
    reqs = [e2e.make_request([good_seq], "ids", request_id="m0"),
            e2e.make_request([bad_seq], "ids", request_id="m1"),
            e2e.make_request([good_seq], "ids", request_id="m2")]
    unary = [srv.stub.Encode.future(e2e.make_request([s], "ids", request_id=f"u{i}"), timeout=60)
             for i, s in enumerate([good_seq, bad_seq, good_seq, bad_seq, good_seq])]
    resps = list(srv.stub.EncodeStream(iter(reqs), timeout=e2e.RPC_TIMEOUT_S))
    by_id = {r.request_id: r for r in resps}
    assert sorted(by_id) == ["m0", "m1", "m2"], f"stream answered {[r.request_id for r in resps]}"
    e2e.check_response("m0", by_id["m0"], model, [good_seq])
    e2e.check_response("m2", by_id["m2"], model, [good_seq])
    err = by_id["m1"].error
    print(f"failing stream message: {err.code}: {err.message}")
    assert err.code == grpc.StatusCode.INTERNAL.value[0] and "injected test fault" in err.message
    for i, f in enumerate(unary):
        code, msg, resp = result(f, 60)
        if i % 2:
            assert code == grpc.StatusCode.INTERNAL, f"unary {i}: {code.name}"
        else:
            assert code == OK, f"unary {i}: {code.name} ({msg!r})"
            e2e.check_response(f"unary {i}", resp, model, [good_seq])
    assert_nothing_leaked(srv)
    assert_still_serving(e2e, models, srv)


def test_fault_hook_is_off_and_strict(e2e, models, servers):
    """Without FASTFORMER_TEST_FAULTS nothing is injected (a sequence starting with FAIL_TOKEN is
    answered); with it the start-up log warns; a malformed value refuses to start."""
    model = models.get("head")
    plain = servers.start("head")
    seqs = [[FAIL_TOKEN, 5, 6]]
    e2e.check_response("no hook", plain.stub.Encode(e2e.make_request(seqs, "ids"), timeout=30), model, seqs)
    assert "TEST FAULT" not in plain.log_text()
    faulty = servers.start("head", extra_env=FAULTS)
    assert "TEST FAULT INJECTION ON" in faulty.log_text()
    bad = servers.start("head", wait=False, extra_env={"FASTFORMER_TEST_FAULTS": "fail_frist_token=1"})
    assert bad.wait_exit(30) == 1, "a misspelt FASTFORMER_TEST_FAULTS did not stop the start-up"
    assert "FASTFORMER_TEST_FAULTS: unknown entry 'fail_frist_token=1'" in bad.log_text(), bad.log_text()


# ----------------------------------------------------------------------------- start-up failures


def _expect_start_failure(srv, *needles):
    rc = srv.wait_exit(30)
    log = srv.log_text()
    print(f"exit {rc}: {[line for line in log.splitlines() if ' error ' in line]}")
    assert rc is not None, f"still running 30 s after a start that should fail\n{log}"
    assert rc == 1, f"exit code {rc}, expected 1\n{log}"
    for n in needles:
        assert n in log, f"the log does not say {n!r}:\n{log}"


def test_second_server_on_a_busy_port(e2e, models, servers):
    """A second server on a gRPC port (or metrics port) in use exits 1 naming the address; the
    first keeps serving. (gRPC sets SO_REUSEPORT by default; the server turns it off, else the
    second one would start and take half of the connections.)"""
    first = servers.start("head")
    second = servers.start("head", wait=False, listen=first.target)
    _expect_start_failure(second, f"cannot listen on {first.target}: address already in use")
    metrics_addr = f"127.0.0.1:{first.metrics_port}"
    third = servers.start("head", wait=False, metrics_listen=metrics_addr)
    _expect_start_failure(third, f"cannot serve metrics on {metrics_addr}: address already in use")
    assert_still_serving(e2e, models, first)


def _bad_model_dirs(src, root):
    """name -> (model directory, the path the message must name). The tests run as root, which
    reads any file whatever its mode, so "unreadable" is made with a directory or a dangling
    symbolic link where a file should be (chmod 000 is tried too when not root)."""
    def copy(name, skip=()):
        d = root / name
        d.mkdir()
        for f in ("config.json", "model.safetensors"):
            if f not in skip:
                (d / f).write_bytes((src / f).read_bytes())
        return d

    cases = {"missing_directory": (root / "gone", root / "gone")}
    d = copy("no_weights", skip=("model.safetensors",))
    cases["missing_weights"] = (d, d / "model.safetensors")
    d = copy("no_config", skip=("config.json",))
    cases["missing_config"] = (d, d / "config.json")
    d = copy("weights_dir", skip=("model.safetensors",))
    (d / "model.safetensors").mkdir()
    cases["weights_are_a_directory"] = (d, d / "model.safetensors")
    d = copy("config_dir", skip=("config.json",))
    (d / "config.json").mkdir()
    cases["config_is_a_directory"] = (d, d / "config.json")
    d = copy("dangling", skip=("model.safetensors",))
    (d / "model.safetensors").symlink_to(root / "deleted.safetensors")
    cases["weights_dangling_link"] = (d, d / "model.safetensors")
    d = copy("truncated")
    (d / "model.safetensors").write_bytes((src / "model.safetensors").read_bytes()[:100])
    cases["weights_truncated"] = (d, d / "model.safetensors")
    if os.geteuid() != 0:
        d = copy("unreadable")
        (d / "model.safetensors").chmod(0)
        cases["weights_unreadable"] = (d, d / "model.safetensors")
    return cases


def test_bad_model_directory(e2e, models, servers, tmp_path):
    """A model directory that is gone or unreadable at start-up: exit 1, `start-up failed: <path>: ...`."""
    src = models.get("head").dir
    cases = _bad_model_dirs(src, tmp_path)
    started = {name: servers.start("head", wait=False, model_dir=d) for name, (d, _) in cases.items()}
    for name, srv in started.items():
        print(name, end=": ")
        _expect_start_failure(srv, f"start-up failed: {cases[name][1]}")
    if os.geteuid() == 0:
        print("running as root: chmod 000 would not stop a read, so unreadable files are simulated by "
              "directories and dangling links")


# ----------------------------------------------------------------------------- SIGTERM


def test_sigterm_under_continuous_load(e2e, models, servers):
    """Clients keep sending (unary calls and stream messages) across SIGTERM: every request is
    answered OK (and correctly) or UNAVAILABLE (refused before admission), none hangs or
    vanishes, and the server exits 0 (so everything admitted was answered).

    One exception, a known race: a unary call sent after the signal that reaches the server as
    it finally stops gRPC (after the drain) may be answered CANCELLED by gRPC itself instead of
    UNAVAILABLE. Such a call was never admitted; it is counted and printed, not failed."""
    model = models.get("load")
    rng = np.random.default_rng(77)
    seqs = [e2e.make_ids(rng, 600, model.vocab) for _ in range(4)]
    for s in seqs:
        model.reference(s)
    srv = servers.start("load", max_batch_tokens=2048, max_request_tokens=4096, shutdown_timeout_s=30)
    stop, stop_streams = threading.Event(), threading.Event()
    outcomes = []  # (kind, index, code, details, response, when answered, when sent)
    lock = threading.Lock()

    def unary_client(k):
        stub = e2e.pb_grpc.EncoderStub(srv.new_channel(own_connection=True))
        i = 0
        while not stop.is_set():
            sent_at = time.monotonic()
            code, msg, resp = e2e.rpc_code(stub.Encode, e2e.make_request([seqs[i % 4]], "ids"), timeout=60)
            with lock:
                outcomes.append(("unary", i % 4, code, msg, resp, time.monotonic(), sent_at))
            i += 1

    def stream_client(k):
        stub = e2e.pb_grpc.EncoderStub(srv.new_channel(own_connection=True))
        stream = HeldStream(stub)
        sent = 0
        answered = threading.Event()

        def reader():
            code, msg, resps = stream.responses()
            with lock:
                for r in resps:
                    i = int(r.request_id)
                    c = grpc.StatusCode.OK if not r.HasField("error") else next(
                        s for s in grpc.StatusCode if s.value[0] == r.error.code)
                    outcomes.append(("stream", i % 4, c, r.error.message, r, None, None))
                outcomes.append(("stream-end", sent, code, msg, len(resps), None, None))
            answered.set()

        t = threading.Thread(target=reader)
        t.start()
        while not stop_streams.is_set():
            stream.send(e2e.make_request([seqs[sent % 4]], "ids", request_id=str(sent)))
            sent += 1
            time.sleep(0.05)
        stream.close()
        t.join(90)

    threads = [threading.Thread(target=unary_client, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=stream_client, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        srv.metrics_when(lambda m: m.value("fastformer_requests_total", code="OK") >= 4, 30)
        time.sleep(1.0)
        srv.signal(signal.SIGTERM)
        t0 = time.monotonic()
        # streams keep sending while the server drains, then close their side (a stream still
        # open a second after the drain is cancelled); unary clients go on until after the exit
        time.sleep(0.3)
        stop_streams.set()
        time.sleep(0.7)
    finally:
        stop_streams.set()
        stop.set()
        for t in threads:
            t.join(120)
    assert not any(t.is_alive() for t in threads), "a client call hung after SIGTERM"
    rc = srv.wait_exit(35)
    elapsed = time.monotonic() - t0
    requests = [o for o in outcomes if o[0] != "stream-end"]
    by_code, unavailable = {}, {}
    for o in requests:
        by_code[o[2].name] = by_code.get(o[2].name, 0) + 1
        if o[2] == grpc.StatusCode.UNAVAILABLE:
            unavailable[o[3]] = unavailable.get(o[3], 0) + 1
    ends = [o for o in outcomes if o[0] == "stream-end"]
    ok_after = sum(1 for o in requests if o[0] == "unary" and o[2] == OK and o[5] > t0)
    print(f"{len(requests)} requests across SIGTERM: {by_code}; UNAVAILABLE messages {unavailable}; "
          f"unary calls answered OK after the signal: {ok_after}; streams (code, sent, answered) "
          f"{[(o[2].name, o[1], o[4]) for o in ends]}; exit {rc} after {elapsed:.1f} s")
    assert ok_after > 0, "no call in flight at the signal was answered after it"
    for kind, i, code, msg, resp, _, sent_at in requests:
        if code == grpc.StatusCode.CANCELLED and kind == "unary" and sent_at > t0:
            continue  # the known race at gRPC's own shutdown (docstring)
        assert code in (OK, grpc.StatusCode.UNAVAILABLE), f"{kind} request answered {code.name} ({msg!r})"
        if code == OK:
            e2e.check_response(f"{kind} request", resp, model, [seqs[i]])
    assert by_code.get("OK", 0) > 0 and by_code.get("UNAVAILABLE", 0) > 0, \
        f"the load did not straddle the signal: {by_code}"
    for _, sent, code, msg, n, _, _ in ends:
        assert code == OK and n == sent, f"a stream sent {sent} messages and got {n} answers, then {code.name} {msg!r}"
    assert rc == 0, f"exit code {rc} after SIGTERM\n{srv.log_tail()}"

"""Overload and deadlines under load, on the heavier "load" model.

Overload: with a small --max-queue-tokens, a burst of requests gets RESOURCE_EXHAUSTED for the
excess at once; every accepted request is answered correctly; nothing of a rejected one is
computed; a rejected request succeeds when retried later.

Deadlines: requests with short deadlines behind a long queue get DEADLINE_EXCEEDED, the server
drops their sequences before compute (fastformer_sequences_dropped_total{reason="deadline"}) and
fastformer_tokens_total counts only what was really computed.
"""

from __future__ import annotations

import time

import grpc
import numpy as np

OK = grpc.StatusCode.OK


def _wait_all(futures, timeout):
    """[(code, details, response)] of every future, in order."""
    out = []
    deadline = time.monotonic() + timeout
    for f in futures:
        try:
            out.append((OK, "", f.result(timeout=max(0.1, deadline - time.monotonic()))))
        except grpc.FutureTimeoutError:
            raise AssertionError(f"a call did not finish within {timeout} s")
        except grpc.RpcError as e:
            out.append((e.code(), e.details() or "", None))
    return out


def test_overload_resource_exhausted(e2e, models, servers):
    model = models.get("load")
    rng = np.random.default_rng(2000)
    distinct = [e2e.make_ids(rng, 500, model.vocab) for _ in range(4)]
    for s in distinct:
        model.reference(s)
    srv = servers.start("load", max_queue_tokens=2000, max_batch_tokens=512, max_request_tokens=2000)
    n = 48
    reqs = [e2e.make_request([distinct[i % 4]], "ids", request_id=f"r{i}") for i in range(n)]
    before = srv.metrics()
    t0 = time.monotonic()
    futures = [srv.stub.Encode.future(q, timeout=e2e.RPC_TIMEOUT_S) for q in reqs]
    results = _wait_all(futures, e2e.RPC_TIMEOUT_S)
    print(f"{n} requests of 500 tokens sent in {time.monotonic() - t0:.3f} s")
    accepted = [i for i, (c, _, _) in enumerate(results) if c == OK]
    rejected = [i for i, (c, _, _) in enumerate(results) if c == grpc.StatusCode.RESOURCE_EXHAUSTED]
    other = [(i, c.name, m) for i, (c, m, _) in enumerate(results) if i not in accepted and i not in rejected]
    print(f"accepted {len(accepted)}, RESOURCE_EXHAUSTED {len(rejected)}"
          + (f": {results[rejected[0]][1]!r}" if rejected else ""))
    assert not other, f"codes other than OK / RESOURCE_EXHAUSTED: {other[:5]}"
    assert rejected, "no RESOURCE_EXHAUSTED: 48 x 500 tokens at once with --max-queue-tokens 2000"
    assert len(accepted) >= 4, f"only {len(accepted)} accepted: an empty queue of 2000 tokens holds 4 x 500"
    for i in accepted:
        e2e.check_response(f"accepted request {i}", results[i][2], model, [distinct[i % 4]], request_id=f"r{i}")

    after = srv.metrics_when(lambda m: m.value("fastformer_tokens_total") - before.value("fastformer_tokens_total")
                             >= 500 * len(accepted))
    delta = lambda name, **l: after.value(name, **l) - before.value(name, **l)  # noqa: E731
    assert delta("fastformer_requests_total", method="Encode", code="RESOURCE_EXHAUSTED") == len(rejected)
    assert delta("fastformer_requests_total", method="Encode", code="OK") == len(accepted)
    assert delta("fastformer_tokens_total") == 500 * len(accepted), \
        f"tokens_total rose by {delta('fastformer_tokens_total')}, {500 * len(accepted)} tokens accepted"
    assert after.value("fastformer_queue_tokens") == 0, "queue_tokens gauge not back to 0"
    assert after.value("fastformer_inflight_requests") == 0, "inflight_requests gauge not back to 0"

    # RESOURCE_EXHAUSTED is retryable: the same request goes through on an idle server.
    i = rejected[0]
    resp = srv.stub.Encode(reqs[i], timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response(f"retried request {i}", resp, model, [distinct[i % 4]], request_id=f"r{i}")


LONG_REQUESTS = 40   # x 2000 tokens ahead of the short ones
SHORT_REQUESTS = 20  # x 300 tokens, deadline SHORT_DEADLINE_S
SHORT_DEADLINE_S = 0.1


def test_deadlines_under_load(e2e, models, servers):
    model = models.get("load")
    rng = np.random.default_rng(5)
    longs = [e2e.make_ids(rng, 2000, model.vocab) for _ in range(4)]
    short = e2e.make_ids(rng, 300, model.vocab)
    for s in longs:
        model.reference(s)
    srv = servers.start("load", max_batch_tokens=2048, max_queue_tokens=1_000_000, max_request_tokens=4096)
    before = srv.metrics()
    long_f = [srv.stub.Encode.future(e2e.make_request([longs[i % 4]], "ids", request_id=f"long{i}"),
                                     timeout=e2e.RPC_TIMEOUT_S) for i in range(LONG_REQUESTS)]
    short_f = [srv.stub.Encode.future(e2e.make_request([short], "ids", request_id=f"short{i}"),
                                      timeout=SHORT_DEADLINE_S) for i in range(SHORT_REQUESTS)]
    short_results = _wait_all(short_f, 30)
    long_pending = sum(not f.done() for f in long_f)
    long_results = _wait_all(long_f, e2e.RPC_TIMEOUT_S)

    codes = [c.name for c, _, _ in short_results]
    assert codes == ["DEADLINE_EXCEEDED"] * SHORT_REQUESTS, f"short-deadline calls answered {codes}"
    assert long_pending > 0, (f"the queue of {LONG_REQUESTS} x 2000 tokens drained before the "
                              f"{SHORT_DEADLINE_S * 1000:.0f} ms deadlines expired: raise LONG_REQUESTS")
    for i, (c, m, resp) in enumerate(long_results):
        assert c == OK, f"long request {i}: {c.name} {m!r}"
        e2e.check_response(f"long request {i}", resp, model, [longs[i % 4]], request_id=f"long{i}")

    dropped = lambda m, reason: (m.value("fastformer_sequences_dropped_total", reason=reason)  # noqa: E731
                                 - before.value("fastformer_sequences_dropped_total", reason=reason))
    after = srv.metrics_when(lambda m: dropped(m, "deadline") + dropped(m, "cancelled") >= SHORT_REQUESTS, 20)
    delta = lambda name, **l: after.value(name, **l) - before.value(name, **l)  # noqa: E731
    d_deadline, d_cancelled = dropped(after, "deadline"), dropped(after, "cancelled")
    computed_tokens = delta("fastformer_tokens_total")
    print(f"dropped: deadline +{d_deadline:.0f}, cancelled +{d_cancelled:.0f}; tokens_total +{computed_tokens:.0f} "
          f"of {LONG_REQUESTS * 2000 + SHORT_REQUESTS * 300} sent; long calls pending when the short ones "
          f"expired: {long_pending}")
    assert d_deadline == SHORT_REQUESTS, (f"sequences_dropped_total{{reason=\"deadline\"}} rose by {d_deadline:.0f}"
                                          f" (cancelled by {d_cancelled:.0f}), expected {SHORT_REQUESTS}")
    assert computed_tokens == LONG_REQUESTS * 2000, \
        f"tokens_total rose by {computed_tokens:.0f}: compute was spent on expired sequences"
    assert delta("fastformer_sequences_total") == LONG_REQUESTS
    assert delta("fastformer_requests_total", method="Encode", code="DEADLINE_EXCEEDED") == SHORT_REQUESTS
    assert after.value("fastformer_queue_tokens") == 0 and after.value("fastformer_queue_sequences") == 0
    assert srv.health_status() == "SERVING"


def test_cancelled_requests_dropped(e2e, models, servers):
    """Calls cancelled by the client while queued: dropped before compute, counted as "cancelled"."""
    model = models.get("load")
    rng = np.random.default_rng(6)
    longs = [e2e.make_ids(rng, 2000, model.vocab) for _ in range(2)]
    short = e2e.make_ids(rng, 300, model.vocab)
    srv = servers.start("load", max_batch_tokens=2048, max_queue_tokens=1_000_000, max_request_tokens=4096)
    before = srv.metrics()
    n_long, n_cancel = 20, 5
    long_f = [srv.stub.Encode.future(e2e.make_request([longs[i % 2]], "ids"), timeout=e2e.RPC_TIMEOUT_S)
              for i in range(n_long)]
    cancel_f = [srv.stub.Encode.future(e2e.make_request([short], "ids"), timeout=e2e.RPC_TIMEOUT_S)
                for _ in range(n_cancel)]
    srv.metrics_when(lambda m: m.value("fastformer_inflight_requests") + sum(f.done() for f in long_f + cancel_f)
                     >= n_long + n_cancel, 10)
    assert all(f.cancel() for f in cancel_f), "the short calls finished before they could be cancelled"
    long_results = _wait_all(long_f, e2e.RPC_TIMEOUT_S)
    assert all(c == OK for c, _, _ in long_results), [(c.name, m) for c, m, _ in long_results if c != OK][:3]
    dropped = lambda m, reason: (m.value("fastformer_sequences_dropped_total", reason=reason)  # noqa: E731
                                 - before.value("fastformer_sequences_dropped_total", reason=reason))
    after = srv.metrics_when(lambda m: dropped(m, "cancelled") + dropped(m, "deadline") >= n_cancel, 10)
    computed = after.value("fastformer_tokens_total") - before.value("fastformer_tokens_total")
    print(f"dropped: cancelled +{dropped(after, 'cancelled'):.0f}, deadline +{dropped(after, 'deadline'):.0f}; "
          f"tokens_total +{computed:.0f}")
    assert dropped(after, "cancelled") == n_cancel, \
        f"sequences_dropped_total{{reason=\"cancelled\"}} rose by {dropped(after, 'cancelled'):.0f}, expected {n_cancel}"
    assert computed == n_long * 2000, f"tokens_total rose by {computed:.0f}: cancelled sequences were computed"
    assert after.value("fastformer_queue_tokens") == 0 and after.value("fastformer_inflight_requests") == 0

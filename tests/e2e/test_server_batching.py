"""64 concurrent clients with mixed lengths: every answer correct and in request order, and the
batch metrics prove that sequences of different requests shared batches."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

CLIENTS = 64
REQUESTS_PER_CLIENT = 4
POOL = 96  # distinct sequences (lengths 1..300); the reference is computed once per sequence


def test_64_concurrent_clients(e2e, models, servers):
    model = models.get("head")
    srv = servers.start("head", max_queue_delay_us=2000, max_batch_tokens=4096, max_batch_sequences=64,
                        max_queue_tokens=1_000_000, max_request_tokens=4096)
    rng = np.random.default_rng(64)
    pool = [e2e.make_ids(rng, int(n), model.vocab) for n in rng.integers(1, 301, POOL)]
    pool[0], pool[1] = [42], [7, 0]  # the shortest shapes too
    for s in pool:
        model.reference(s)
    # client c, request r: 1..3 sequences from the pool
    plan = [[[int(i) for i in rng.choice(POOL, int(rng.integers(1, 4)), replace=False)]
             for _ in range(REQUESTS_PER_CLIENT)] for _ in range(CLIENTS)]
    before = srv.metrics()
    start = threading.Barrier(CLIENTS)

    def client(c):
        ch = srv.new_channel(own_connection=True)
        stub = e2e.pb_grpc.EncoderStub(ch)
        start.wait(timeout=60)
        out = []
        for r, picks in enumerate(plan[c]):
            req = e2e.make_request([pool[i] for i in picks], "ids", request_id=f"c{c}r{r}")
            code, msg, resp = e2e.rpc_code(stub.Encode, req, timeout=e2e.RPC_TIMEOUT_S)
            out.append((code, msg, resp))
        return out

    with ThreadPoolExecutor(CLIENTS) as ex:
        results = list(ex.map(client, range(CLIENTS)))

    n_requests = n_seqs = n_tokens = 0
    for c, answers in enumerate(results):
        for r, ((code, msg, resp), picks) in enumerate(zip(answers, plan[c])):
            label = f"client {c} request {r}"
            assert code.name == "OK", f"{label}: {code.name} {msg!r}"
            seqs = [pool[i] for i in picks]
            assert resp.request_id == f"c{c}r{r}", f"{label}: request_id {resp.request_id!r}"
            assert len(resp.encodings) == len(seqs), f"{label}: {len(resp.encodings)} encodings for {len(seqs)}"
            for k, (enc, s) in enumerate(zip(resp.encodings, seqs)):  # order: each sequence is different
                assert enc.num_tokens == len(s), f"{label} seq {k}: num_tokens {enc.num_tokens} != {len(s)}"
                e2e.assert_close(f"{label} seq {k} (pool {picks[k]}, n={len(s)})", list(enc.embedding),
                                 model.reference(s).embedding, e2e.TOL)
            n_requests += 1
            n_seqs += len(seqs)
            n_tokens += sum(map(len, seqs))

    after = srv.metrics_when(lambda m: m.value("fastformer_tokens_total") - before.value("fastformer_tokens_total")
                             >= n_tokens and m.value("fastformer_inflight_requests") == 0)
    delta = lambda n, **l: after.value(n, **l) - before.value(n, **l)  # noqa: E731
    batches = delta("fastformer_batch_sequences_count")
    seqs_in_batches = delta("fastformer_batch_sequences_sum")
    print(f"{n_requests} requests, {n_seqs} sequences, {n_tokens} tokens in {batches:.0f} batches "
          f"({seqs_in_batches / max(batches, 1):.2f} sequences per batch)")
    assert delta("fastformer_requests_total", method="Encode", code="OK") == n_requests
    assert seqs_in_batches == n_seqs, f"batch_sequences_sum rose by {seqs_in_batches}, {n_seqs} sequences sent"
    assert delta("fastformer_batch_tokens_sum") == n_tokens, \
        f"batch_tokens_sum rose by {delta('fastformer_batch_tokens_sum')}, {n_tokens} tokens sent"
    assert delta("fastformer_sequences_total") == n_seqs
    assert delta("fastformer_tokens_total") == n_tokens
    assert delta("fastformer_queue_duration_seconds_count") == n_seqs, "queue duration is observed per sequence"
    assert seqs_in_batches / batches > 1, "no batch held more than one sequence"
    # Each request in batches of its own would need at least one batch per request.
    assert batches < n_requests, (f"{batches:.0f} batches for {n_requests} requests: no evidence of sequences "
                                  f"from different requests sharing a batch")

"""SIGTERM with HTTP requests in flight: the drain answers every admitted HTTP request before the
listener closes, new requests meanwhile get 503, and the server exits 0."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np

from conftest import assert_close

STALL_TOKEN = 14  # the first token id of a sequence whose batch stalls (FASTFORMER_TEST_FAULTS)
STALL_MS = 1500


def test_sigterm_answers_every_admitted_http_request(start, ids_model):
    srv = start(ids_model, env_extra={"FASTFORMER_TEST_FAULTS": f"stall_first_token={STALL_TOKEN}:{STALL_MS}"},
                shutdown_timeout_s=30)
    seqs = [[STALL_TOKEN, 5, 6]] + [[7 + i, 8, 9] for i in range(5)]
    answers = [None] * len(seqs)

    def send(i):
        answers[i] = srv.call("POST", "/v1/embeddings", {"input": [seqs[i]], "encoding_format": "float"},
                              timeout=60)

    first = threading.Thread(target=send, args=(0,))
    first.start()
    time.sleep(0.3)  # the stalled batch computes; the next requests queue behind it
    rest = [threading.Thread(target=send, args=(i,)) for i in range(1, len(seqs))]
    for t in rest:
        t.start()
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    late = srv.call("POST", "/embed", {"inputs": [[5, 6]]}, timeout=10)
    for t in [first, *rest]:
        t.join(60)
    assert late.status == 503, (late.status, late.body[:300])
    assert "shutting down" in late.error_message()
    for i, r in enumerate(answers):
        assert r is not None and r.status == 200, (i, r and (r.status, r.body[:300]))
        got = np.asarray(r.json()["data"][0]["embedding"])
        assert_close(got, ids_model.unit(seqs[i]), what=f"request {i}")
    assert srv.proc.wait(timeout=30) == 0, srv.log_tail()
    assert "drained; exiting" in srv.log_text()

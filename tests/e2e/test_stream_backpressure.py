"""A client that sends on EncodeStream without reading its answers: the server stops reading
that stream once its unwritten answers reach a bound (64), so the answers cannot pile up in
server memory; the client is then held by HTTP/2 flow control. Once the client reads, every
message is answered, in full (nothing dropped by the pause)."""

from __future__ import annotations

import time

N_MESSAGES = 8000
SEQ_LEN = 64           # with token embeddings: 16 KiB per answer (D 64, float32); all 8000
                       # messages together fit in the queue of the server below


def _answered(srv) -> float:
    return srv.metrics().value("fastformer_requests_total", method="EncodeStream")


def test_unread_answers_stop_reading(e2e, models, servers):
    model = models.get("head")
    srv = servers.start("head", max_queue_tokens=N_MESSAGES * SEQ_LEN)
    ids = [(i * 7 + 3) % (model.vocab - 1) + 1 for i in range(SEQ_LEN)]
    sent = [0]

    def requests():
        for i in range(N_MESSAGES):
            sent[0] += 1
            yield e2e.make_request([ids], "ids", request_id=f"m{i}", tokens=True)

    call = srv.stub.EncodeStream(requests(), timeout=120)
    # The answers are not read: the server's answer count comes to rest (what it had read is
    # computed, then it reads no more) well short of every message.
    later, quiet_since, give_up = _answered(srv), time.monotonic(), time.monotonic() + 60
    while time.monotonic() - quiet_since < 2.0:
        assert time.monotonic() < give_up, f"the server kept answering an unread stream ({later:.0f} answers)"
        time.sleep(0.25)
        now = _answered(srv)
        if now != later:
            later, quiet_since = now, time.monotonic()
    assert later < N_MESSAGES / 2, (
        f"{later:.0f} of {N_MESSAGES} messages answered while the client read nothing: the server did not "
        f"stop reading (client had sent {sent[0]})")
    # Now read: every message is answered exactly once, with its token embeddings.
    got = {}
    for resp in call:
        assert resp.request_id not in got, f"{resp.request_id} answered twice"
        assert not resp.HasField("error"), f"{resp.request_id}: {resp.error.message}"
        got[resp.request_id] = len(resp.encodings[0].token_embeddings)
    assert set(got.values()) == {SEQ_LEN * model.hidden}, set(got.values())
    assert len(got) == N_MESSAGES, f"{len(got)} of {N_MESSAGES} answered"
    assert sent[0] == N_MESSAGES
    assert e2e.wait_until(lambda: srv.metrics().value("fastformer_queue_tokens") == 0, 5)

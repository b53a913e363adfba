"""Client.encode_stream and AsyncClient (asyncio.run) against a real fastformer-server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest


def _requests(pyc, model, rng, n=12):
    """n stream messages of varied sizes and options (dicts), with their sequences."""
    reqs = []
    for i in range(n):
        seqs = [pyc.make_ids(rng, int(rng.integers(1, 400)), model.vocab) for _ in range(int(rng.integers(1, 4)))]
        reqs.append({"sequences": seqs, "request_id": f"m{i}", "normalize": bool(i % 3 == 1),
                     "return_token_embeddings": bool(i % 4 == 2)})
    return reqs


def _check_stream_results(pyc, model, reqs, results):
    by_id = {r.request_id: r for r in results}
    assert len(results) == len(reqs) and sorted(by_id) == sorted(r["request_id"] for r in reqs)
    for q in reqs:
        r = by_id[q["request_id"]]
        assert r.num_tokens == [len(s) for s in q["sequences"]]
        if q.get("return_token_embeddings"):
            assert r.token_embeddings is not None
        else:
            assert r.token_embeddings is None
        pyc.check(f"stream {q['request_id']}", model, q["sequences"], "ids", r.embeddings,
                  r.token_embeddings, normalize=q.get("normalize", False))


def test_stream_results_match_reference(ffc, models, client, pyc):
    model = models.get("head")
    reqs = _requests(pyc, model, np.random.default_rng(10))
    results = list(client.encode_stream(reqs))
    assert all(isinstance(r, ffc.EncodeResult) for r in results)
    _check_stream_results(pyc, model, reqs, results)


def test_stream_forms_defaults_and_ids(ffc, models, client, pyc):
    """Plain lists of sequences get str(index) as request_id; the keyword arguments are the defaults
    and a dict overrides them; an EncodeRequest passes as is; a generator is consumed lazily."""
    model = models.get("head")
    rng = np.random.default_rng(11)
    a = [pyc.make_ids(rng, 20, model.vocab)]
    b = [pyc.make_ids(rng, 30, model.vocab), pyc.make_ids(rng, 5, model.vocab)]
    pbreq = ffc.encoder_pb2.EncodeRequest(request_id="raw")
    pbreq.sequences.add().token_ids.extend(a[0])

    def gen():
        yield a
        yield {"sequences": b, "normalize": False}
        yield {"sequences": a, "request_id": "named", "return_logits": True}
        yield pbreq

    results = {r.request_id: r for r in client.encode_stream(gen(), normalize=True)}
    assert sorted(results) == ["0", "1", "named", "raw"]
    pyc.check("index 0", model, a, "ids", results["0"].embeddings, normalize=True)
    pyc.check("index 1", model, b, "ids", results["1"].embeddings, normalize=False)
    assert results["named"].logits.shape == (1, 3)
    pyc.check("named", model, a, "ids", results["named"].embeddings, logits=results["named"].logits, normalize=True)
    pyc.check("raw", model, a, "ids", results["raw"].embeddings)


def test_stream_request_conversion_error_propagates(ffc, client):
    """A message the client cannot build (here: a 1-D float array) raises in the caller."""
    def gen():
        yield [[1, 2, 3]]
        yield [np.zeros(3, dtype=np.float32)]
        yield [[4, 5, 6]]

    with pytest.raises(TypeError, match="sequence 0: a 1-D float array"):
        list(client.encode_stream(gen()))
    with pytest.raises(TypeError, match="unknown keys"):
        list(client.encode_stream([{"sequences": [[1]], "deadline_s": 3}]))
    with pytest.raises(ValueError, match="errors"):
        list(client.encode_stream([[[1]]], errors="ignore"))


def test_stream_deadline(ffc, client):
    def slow():
        yield [[1, 2, 3]]
        import time
        time.sleep(1.0)
        yield [[4, 5, 6]]

    with pytest.raises(ffc.DeadlineExceeded):
        list(client.encode_stream(slow(), deadline_s=0.3))


def test_stream_early_exit_cancels(ffc, client):
    """Leaving the loop early ends the call (the client stays usable)."""
    it = client.encode_stream([[[1, 2, 3]]] * 50)
    first = next(it)
    assert isinstance(first, ffc.EncodeResult)
    it.close()
    assert client.encode([[1, 2]]).shape == (1, 64)


# ----------------------------------------------------------------------------- AsyncClient


def test_async_encode_parity_and_shapes(ffc, models, head, pyc):
    model = models.get("head")
    rng = np.random.default_rng(12)
    seqs = [pyc.make_ids(rng, n, model.vocab) for n in (3, 77, 512)]
    emb_seq = [pyc.make_embeddings(rng, 9, model.hidden)]

    async def main():
        async with ffc.AsyncClient(head.target) as c:
            emb = await c.encode(seqs)
            full = await c.encode(seqs, return_token_embeddings=True, return_logits=True, request_id="a1")
            from_emb = await c.encode(emb_seq, normalize=True)
            info = await c.model_info()
            health = await c.health()
            unknown = await c.health("nope")
            await c.wait_for_serving(5.0)
            return emb, full, from_emb, info, health, unknown

    emb, full, from_emb, info, health, unknown = asyncio.run(main())
    assert emb.dtype == np.float32 and emb.shape == (3, 64)
    pyc.check("async ids", model, seqs, "ids", emb)
    assert full.request_id == "a1" and full.logits.shape == (3, 3)
    pyc.check("async full", model, seqs, "ids", full.embeddings, full.token_embeddings, full.logits)
    pyc.check("async embeddings", model, emb_seq, "embeddings", from_emb, normalize=True)
    assert info["hidden_size"] == 64 and info["model_name"] == "e2e-head"
    assert health == "SERVING" and unknown == "SERVICE_UNKNOWN"


def test_async_concurrent_calls(ffc, models, head, pyc):
    model = models.get("head")
    rng = np.random.default_rng(13)
    batches = [[pyc.make_ids(rng, int(rng.integers(1, 300)), model.vocab)] for _ in range(24)]

    async def main():
        async with ffc.AsyncClient(head.target) as c:
            return await asyncio.gather(*(c.encode(b, request_id=str(i)) for i, b in enumerate(batches)))

    outs = asyncio.run(main())
    for b, e in zip(batches, outs):
        pyc.check("gather", model, b, "ids", e)


def test_async_stream(ffc, models, head, pyc):
    """Sync iterable and async generator sources; errors="yield" and the default raise."""
    model = models.get("head")
    reqs = _requests(pyc, model, np.random.default_rng(14), n=8)

    async def agen():
        for q in reqs:
            await asyncio.sleep(0)
            yield q

    async def main():
        async with ffc.AsyncClient(head.target) as c:
            from_list = [r async for r in c.encode_stream(reqs)]
            from_agen = [r async for r in c.encode_stream(agen())]
            mixed = [r async for r in c.encode_stream([[[1, 2]], [[5, 5000]], [[3]]], errors="yield")]
            try:
                async for _ in c.encode_stream([[[5, 5000]]]):
                    pass
                raised = None
            except ffc.FastformerError as e:
                raised = e
            try:
                async for _ in c.encode_stream([[[1]], [np.zeros(2)]]):
                    pass
                conv = None
            except TypeError as e:
                conv = e
            return from_list, from_agen, mixed, raised, conv

    from_list, from_agen, mixed, raised, conv = asyncio.run(main())
    _check_stream_results(pyc, model, reqs, from_list)
    _check_stream_results(pyc, model, reqs, from_agen)
    by_id = {r.request_id: r for r in mixed}
    assert sorted(by_id) == ["0", "1", "2"]
    assert isinstance(by_id["1"], ffc.InvalidArgument) and "sequence 0" in by_id["1"].details
    assert isinstance(by_id["0"], ffc.EncodeResult) and isinstance(by_id["2"], ffc.EncodeResult)
    assert isinstance(raised, ffc.InvalidArgument) and raised.request_id == "0"
    assert conv is not None and "sequence 0" in str(conv)


def test_async_errors(ffc, head, pyc):
    async def main(port):
        out = {}
        async with ffc.AsyncClient(head.target) as c:
            try:
                await c.encode([[5] * 512] * 4, deadline_s=1e-6)
            except ffc.FastformerError as e:
                out["deadline"] = e
        async with ffc.AsyncClient(f"127.0.0.1:{port}", deadline_s=5) as c:
            try:
                await c.model_info()
            except ffc.FastformerError as e:
                out["unavailable"] = e
        return out

    with pyc.held_port() as port:  # bound, not listening: nothing answers there
        out = asyncio.run(main(port))
    assert isinstance(out["deadline"], ffc.DeadlineExceeded)
    assert isinstance(out["unavailable"], ffc.Unavailable)

"""Typed errors through the Python client for every bad-input case of the server's suite
(tests/e2e/test_server_bad_input.py: the same cases, codes and message needles), unary, async
and in-band on EncodeStream; the oversize message; the server stays correct afterwards."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

import grpc
import numpy as np
import pytest


def _bad_input_module():
    """tests/e2e/test_server_bad_input.py (the conftest loads it under this name first)."""
    name = "fastformer_e2e_bad_input"
    if name not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "e2e" / "test_server_bad_input.py"
        spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


B = _bad_input_module()

D = B.D


def _case(name):
    """(model key, sequences for the client, encode kwargs, expected code, needles, alternatives)."""
    if name in B.SEQUENCE_CASES:
        model_key, fields, code, needles, alts = B.SEQUENCE_CASES[name]
        good = B.GOOD_IDS if model_key == "head" else B.GOOD_EMB
        bad = {k: v for k, v in fields.items()}  # {} is the empty sequence (neither field set)
        return model_key, [good, good, bad, good], {}, code, needles, alts
    model_key, _, code, needles, alts = B.REQUEST_CASES[name]
    seqs, kw = {
        "no_sequences": ([], {}),
        "over_max_request_tokens": ([[3] * 500] * 5, {}),
        "return_logits_without_head": ([B.GOOD_EMB], {"return_logits": True}),
        "unknown_truncation": ([B.GOOD_IDS], {"truncation": 7}),
    }[name]
    return model_key, seqs, kw, code, needles, alts


def _check(name, err, ffc, want_code, needles, alts):
    assert isinstance(err, ffc.FastformerError), f"{name}: {err!r}"
    assert err.code == want_code, f"{name}: got {err.code.name} ({err.details!r}), expected {want_code.name}"
    expected_cls = {grpc.StatusCode.INVALID_ARGUMENT: ffc.InvalidArgument,
                    grpc.StatusCode.RESOURCE_EXHAUSTED: ffc.ResourceExhausted}[want_code]
    assert type(err) is expected_cls, f"{name}: {type(err).__name__}"
    for n in needles:
        assert n in err.details, f"{name}: message {err.details!r} does not name {n!r}"
    if alts:
        assert any(a in err.details for a in alts), f"{name}: message {err.details!r} names none of {alts}"


def _target(servers, model_key):
    return servers.shared(model_key, **(B.HEAD_FLAGS if model_key == "head" else {})).target


def _still_correct(ffc, models, target, model_key, pyc):
    model = models.get(model_key)
    good = B.GOOD_IDS if model_key == "head" else B.GOOD_EMB
    kind = "ids" if model_key == "head" else "embeddings"
    with ffc.Client(target) as c:
        assert c.health() == "SERVING"
        res = c.encode([good], return_token_embeddings=True)
    pyc.check("after the bad request", model, [good], kind, res.embeddings, res.token_embeddings)


def test_the_case_tables_are_covered():
    """Every case of the server's suite has its client form here (a new case there fails here)."""
    for name in B.ALL_CASES:
        _case(name)


@pytest.mark.parametrize("name", B.ALL_CASES)
def test_bad_input_unary_typed_error(ffc, models, servers, pyc, name):
    model_key, seqs, kw, code, needles, alts = _case(name)
    target = _target(servers, model_key)
    with ffc.Client(target) as c:
        with pytest.raises(ffc.FastformerError) as ei:
            c.encode(seqs, request_id=f"bad-{name}", **kw)
    print(f"{name}: {ei.value!r}")
    _check(name, ei.value, ffc, code, needles, alts)
    assert ei.value.request_id == f"bad-{name}"
    _still_correct(ffc, models, target, model_key, pyc)


@pytest.mark.parametrize("name", B.ALL_CASES)
def test_bad_input_stream_in_band_typed_error(ffc, models, servers, pyc, name):
    """good, bad, good on one stream: errors="yield" gives the bad one's typed error (with its
    request_id) and the others their results; the stream goes on."""
    model_key, seqs, kw, code, needles, alts = _case(name)
    target = _target(servers, model_key)
    model = models.get(model_key)
    good = B.GOOD_IDS if model_key == "head" else B.GOOD_EMB
    kind = "ids" if model_key == "head" else "embeddings"
    reqs = [{"sequences": [good], "request_id": "before"}, dict(sequences=seqs, request_id="bad", **kw),
            {"sequences": [good], "request_id": "after"}]
    with ffc.Client(target) as c:
        out = list(c.encode_stream(reqs, errors="yield"))
    by_id = {r.request_id: r for r in out}
    assert sorted(by_id) == ["after", "bad", "before"] and len(out) == 3, [r.request_id for r in out]
    _check(name, by_id["bad"], ffc, code, needles, alts)
    for rid in ("before", "after"):
        assert isinstance(by_id[rid], ffc.EncodeResult), f"{name} {rid}: {by_id[rid]!r}"
        pyc.check(f"{name} stream {rid}", model, [good], kind, by_id[rid].embeddings)


def test_bad_input_stream_errors_raise(ffc, head):
    """errors="raise" (the default): the in-band error raises its typed error, with request_id."""
    reqs = [{"sequences": [B.GOOD_IDS], "request_id": "ok"}, {"sequences": [[5, 1000]], "request_id": "bad"}]
    got = []
    with ffc.Client(head.target) as c:
        with pytest.raises(ffc.InvalidArgument) as ei:
            for r in c.encode_stream(reqs):
                got.append(r.request_id)
    assert ei.value.request_id == "bad" and "sequence 0" in ei.value.details and "vocab_size 1000" in ei.value.details
    assert ei.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert got in ([], ["ok"])


@pytest.mark.parametrize("name", ["negative_id", "embeddings_nan", "no_sequences", "unknown_truncation",
                                  "token_ids_without_word_embedding"])
def test_bad_input_async_typed_error(ffc, servers, name):
    model_key, seqs, kw, code, needles, alts = _case(name)
    target = _target(servers, model_key)

    async def main():
        async with ffc.AsyncClient(target) as c:
            try:
                await c.encode(seqs, **kw)
            except ffc.FastformerError as e:
                return e
            return None

    err = asyncio.run(main())
    _check(name, err, ffc, code, needles, alts)


def test_oversize_message_resource_exhausted(ffc, models, head, pyc):
    """Over the server's --max-message-bytes (256 KiB): ResourceExhausted; over the client's own
    max_message_bytes: ResourceExhausted too, raised before anything is sent."""
    rows = B.MAX_MESSAGE_BYTES // (4 * D) + 64
    big = [np.full((rows, D), 0.5, dtype=np.float32)]
    with ffc.Client(head.target) as c:
        with pytest.raises(ffc.ResourceExhausted) as ei:
            c.encode(big, truncation="right")
        assert ei.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        print(f"server limit: {ei.value!r}")
        # on a stream the oversize message ends the whole stream with the status
        with pytest.raises(ffc.ResourceExhausted):
            list(c.encode_stream([[B.GOOD_IDS], big], truncation="right", errors="yield"))
    with ffc.Client(head.target, max_message_bytes=64 << 10) as c:
        with pytest.raises(ffc.ResourceExhausted) as ei:
            c.encode([np.full((300, D), 0.5, dtype=np.float32)])
        print(f"client limit: {ei.value!r}")
    _still_correct(ffc, models, head.target, "head", pyc)


def test_error_classes(ffc):
    """The hierarchy and the constructors."""
    classes = {ffc.InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
               ffc.ResourceExhausted: grpc.StatusCode.RESOURCE_EXHAUSTED,
               ffc.DeadlineExceeded: grpc.StatusCode.DEADLINE_EXCEEDED,
               ffc.Unavailable: grpc.StatusCode.UNAVAILABLE, ffc.Cancelled: grpc.StatusCode.CANCELLED,
               ffc.Internal: grpc.StatusCode.INTERNAL, ffc.Unauthenticated: grpc.StatusCode.UNAUTHENTICATED}
    from fastformer_client.errors import error_for
    import pickle
    for cls, code in classes.items():
        e = cls("boom")
        assert isinstance(e, ffc.FastformerError) and e.code == code and e.details == "boom"
        assert type(error_for(code, "x")) is cls and type(error_for(code.value[0], "x")) is cls
        e2 = pickle.loads(pickle.dumps(cls("m", request_id="r")))
        assert type(e2) is cls and e2.details == "m" and e2.request_id == "r"
    base = ffc.FastformerError(grpc.StatusCode.NOT_FOUND, "nope")
    assert base.code == grpc.StatusCode.NOT_FOUND and str(base) == "NOT_FOUND: nope"
    assert type(error_for(5, "nf")) is ffc.FastformerError and error_for(5, "nf").code == grpc.StatusCode.NOT_FOUND
    assert ffc.FastformerError(3, "m").code == grpc.StatusCode.INVALID_ARGUMENT

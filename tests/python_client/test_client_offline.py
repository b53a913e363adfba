"""The client without fastformer-server: request building, the wire decoder against protobuf, and an
in-process fake Encoder service (grpcio) for what the real server cannot show yet: the bearer
token (token and token_file), UNAUTHENTICATED, INTERNAL, TLS and mutual TLS, unusual but valid
wire encodings, malformed responses."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from concurrent import futures

import grpc
import numpy as np
import pytest


@pytest.fixture(scope="module")
def pb(ffc):
    return ffc.encoder_pb2


# ----------------------------------------------------------------------------- request building


def test_build_request_kinds(ffc, pb):
    from fastformer_client._common import build_request
    rng = np.random.default_rng(0)
    e = rng.standard_normal((3, 8))
    req = build_request([[1, 2, 3], np.array([4, 5], dtype=np.int16), e, {"input_embeddings": e.ravel()},
                         {"token_ids": [7], "input_embeddings": [0.5] * 8}, {}, []],
                        return_token_embeddings=True, return_logits=True, normalize=True, truncation="left",
                        request_id=17)
    want = pb.EncodeRequest(request_id="17", return_token_embeddings=True, return_logits=True, normalize=True,
                            truncation=pb.TRUNCATION_LEFT)
    want.sequences.add().token_ids.extend([1, 2, 3])
    want.sequences.add().token_ids.extend([4, 5])
    want.sequences.add().input_embeddings.extend(e.astype(np.float32).ravel().tolist())
    want.sequences.add().input_embeddings.extend(e.astype(np.float32).ravel().tolist())
    s = want.sequences.add()
    s.token_ids.append(7)
    s.input_embeddings.extend([0.5] * 8)
    want.sequences.add()
    want.sequences.add()
    assert req == want
    assert build_request([[2**31 - 1, -(2**31)]]).sequences[0].token_ids == [2**31 - 1, -(2**31)]
    with pytest.raises(ffc.InvalidArgument, match="sequence 0: token_ids: token 0 has id -2147483649"):
        build_request([[-(2**31) - 1]])
    # NaN and Inf pass (the server rejects them, naming the row and column)
    req = build_request([np.array([[np.nan, np.inf]], dtype=np.float32)])
    assert np.isnan(req.sequences[0].input_embeddings[0]) and np.isinf(req.sequences[0].input_embeddings[1])


# ----------------------------------------------------------------------------- wire decoder


def _random_response(pb, rng, error=False):
    r = pb.EncodeResponse(request_id="id-é" + str(rng.integers(1000)), queue_time_us=int(rng.integers(1 << 40)),
                          compute_time_us=int(rng.integers(1 << 20)))
    if error:
        r.error.code = int(rng.integers(1, 17))
        r.error.message = "sequence 3: token_ids: ✗"
        return r
    for _ in range(int(rng.integers(1, 5))):
        n = int(rng.integers(1, 50))
        enc = r.encodings.add(num_tokens=n)
        enc.embedding.extend(rng.standard_normal(16).astype(np.float32).tolist())
        enc.token_embeddings.extend(rng.standard_normal(n * 16).astype(np.float32).tolist())
        enc.logits.extend(rng.standard_normal(3).astype(np.float32).tolist())
    return r


def test_wire_decoder_matches_protobuf(ffc, pb):
    from fastformer_client._wire import decode_encode_response
    rng = np.random.default_rng(1)
    for k in range(40):
        r = _random_response(pb, rng, error=(k % 5 == 4))
        d = decode_encode_response(r.SerializeToString())
        assert d.request_id == r.request_id and d.queue_time_us == r.queue_time_us
        assert d.compute_time_us == r.compute_time_us
        assert d.error == ((r.error.code, r.error.message) if r.HasField("error") else None)
        assert len(d.encodings) == len(r.encodings)
        for a, b in zip(d.encodings, r.encodings):
            assert a.num_tokens == b.num_tokens
            for x, y in ((a.embedding, b.embedding), (a.token_embeddings, b.token_embeddings), (a.logits, b.logits)):
                assert x.dtype == np.float32 and x.flags.writeable
                np.testing.assert_array_equal(x, np.asarray(y, dtype=np.float32))


def _unpacked_float(field, v):
    from fastformer_client._wire import varint_bytes
    return varint_bytes(field << 3 | 5) + np.float32(v).tobytes()


def test_wire_decoder_unpacked_split_unknown_fields_negative_code(ffc, pb):
    from fastformer_client._wire import decode_encode_response, packed_floats_field, varint_bytes

    def ld(field, payload):
        return varint_bytes(field << 3 | 2) + varint_bytes(len(payload)) + payload

    enc = (_unpacked_float(1, 1.5) + packed_floats_field(1, np.array([2.5, 3.5])) + _unpacked_float(1, 4.5)
           + varint_bytes(4 << 3) + varint_bytes(2) + ld(9, b"unknown") + packed_floats_field(2, np.arange(8)))
    err = ld(5, varint_bytes(1 << 3) + varint_bytes(-3) + ld(2, b"neg"))
    data = ld(1, b"x") + ld(2, enc) + varint_bytes(99 << 3) + varint_bytes(5) + err
    d = decode_encode_response(data)
    assert d.request_id == "x" and d.error == (-3, "neg")
    np.testing.assert_array_equal(d.encodings[0].embedding, [1.5, 2.5, 3.5, 4.5])
    np.testing.assert_array_equal(d.encodings[0].token_embeddings, np.arange(8))
    assert d.encodings[0].num_tokens == 2
    # protobuf agrees
    r = pb.EncodeResponse.FromString(data)
    assert list(r.encodings[0].embedding) == [1.5, 2.5, 3.5, 4.5] and r.error.code == -3


def test_health_codec():
    from fastformer_client._wire import decode_health_response, encode_health_request
    assert encode_health_request("") == b""
    assert encode_health_request("fastformer.v1.Encoder") == b"\x0a\x15fastformer.v1.Encoder"
    assert decode_health_response(b"") == "UNKNOWN"
    assert [decode_health_response(bytes([8, i])) for i in range(4)] == \
        ["UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"]


# ----------------------------------------------------------------------------- fake server


class FakeEncoder:
    """Encode answers one 4-wide encoding per sequence (embedding = [n, 0, 0, 0]); the health check
    answers SERVING. Records the metadata of every call; `token` set: UNAUTHENTICATED without it."""

    def __init__(self, pb):
        self.pb = pb
        self.metadata = []
        self.token = None
        self.response_override = None
        self.abort = None

    def _auth(self, context):
        md = dict(context.invocation_metadata())
        self.metadata.append(md)
        if self.token is not None and md.get("authorization") != f"Bearer {self.token}":
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

    def _answer(self, req):
        r = self.pb.EncodeResponse(request_id=req.request_id, queue_time_us=7, compute_time_us=9)
        for s in req.sequences:
            n = len(s.token_ids) or len(s.input_embeddings) // 4
            enc = r.encodings.add(num_tokens=n)
            enc.embedding.extend([float(n), 0, 0, 0])
            if req.return_token_embeddings:
                enc.token_embeddings.extend([1.0] * (4 * n))
            if req.return_logits:
                enc.logits.extend([0.5, -0.5])
        return r.SerializeToString()

    def encode(self, req, context):
        self._auth(context)
        if self.abort:
            context.abort(*self.abort)
        if self.response_override is not None:
            return self.response_override
        return self._answer(req)

    def encode_stream(self, reqs, context):
        self._auth(context)
        for req in reqs:
            if req.request_id.startswith("fail"):
                r = self.pb.EncodeResponse(request_id=req.request_id)
                r.error.code = grpc.StatusCode.INTERNAL.value[0]
                r.error.message = "engine failure: fake"
                yield r.SerializeToString()
            else:
                yield self._answer(req)

    def health(self, req, context):
        self._auth(context)
        return b"\x08\x01"

    def handlers(self):
        pb = self.pb
        raw = lambda b: b  # noqa: E731
        return [grpc.method_handlers_generic_handler("fastformer.v1.Encoder", {
                    "Encode": grpc.unary_unary_rpc_method_handler(self.encode, pb.EncodeRequest.FromString, raw),
                    "EncodeStream": grpc.stream_stream_rpc_method_handler(self.encode_stream,
                                                                          pb.EncodeRequest.FromString, raw)}),
                grpc.method_handlers_generic_handler("grpc.health.v1.Health", {
                    "Check": grpc.unary_unary_rpc_method_handler(self.health, raw, raw)})]


@pytest.fixture
def fake(pb):
    impl = FakeEncoder(pb)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=impl.handlers())
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    impl.target = f"127.0.0.1:{port}"
    yield impl
    server.stop(None)


def test_token_sent_as_bearer_metadata(ffc, fake):
    fake.token = "s3cret"
    with ffc.Client(fake.target, token="s3cret") as c:
        assert c.encode([[1, 2]]).tolist() == [[2, 0, 0, 0]]
        assert c.health() == "SERVING"
        assert [r.request_id for r in c.encode_stream([[[1]], [[2]]])] in (["0", "1"], ["1", "0"])
    assert all(md.get("authorization") == "Bearer s3cret" for md in fake.metadata) and len(fake.metadata) == 3
    with ffc.Client(fake.target) as c:
        with pytest.raises(ffc.Unauthenticated) as ei:
            c.encode([[1]])
        assert ei.value.code == grpc.StatusCode.UNAUTHENTICATED and "bearer" in ei.value.details
        with pytest.raises(ffc.Unauthenticated):
            list(c.encode_stream([[[1]]]))
    with ffc.Client(fake.target, token="wrong") as c:
        with pytest.raises(ffc.Unauthenticated):
            c.health()

    async def run_async():
        async with ffc.AsyncClient(fake.target, token="s3cret") as c:
            return await c.encode([[1, 2, 3]])
    assert asyncio.run(run_async()).tolist() == [[3, 0, 0, 0]]
    with pytest.raises(ValueError):
        ffc.Client(fake.target, token="a", token_file="b")


def test_token_file_is_reread_when_it_changes(ffc, fake, tmp_path):
    path = tmp_path / "token"
    path.write_text("first\n")
    fake.token = "first"
    with ffc.Client(fake.target, token_file=path) as c:
        c.encode([[1]])
        path.write_text("second-token\n")
        os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
        fake.token = "second-token"
        c.encode([[1]])
    assert [md["authorization"] for md in fake.metadata] == ["Bearer first", "Bearer second-token"]
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    with pytest.raises(ValueError, match="empty"):
        ffc.Client(fake.target, token_file=empty)
    with pytest.raises(FileNotFoundError):
        ffc.Client(fake.target, token_file=tmp_path / "missing")


def test_internal_and_in_band_errors(ffc, fake):
    with ffc.Client(fake.target) as c:
        fake.abort = (grpc.StatusCode.INTERNAL, "engine failure: boom")
        with pytest.raises(ffc.Internal, match="engine failure: boom"):
            c.encode([[1]])
        fake.abort = (grpc.StatusCode.NOT_FOUND, "what")
        with pytest.raises(ffc.FastformerError) as ei:
            c.encode([[1]])
        assert type(ei.value) is ffc.FastformerError and ei.value.code == grpc.StatusCode.NOT_FOUND
        fake.abort = None
        out = list(c.encode_stream([{"sequences": [[1]], "request_id": "ok"},
                                    {"sequences": [[1]], "request_id": "fail-1"}], errors="yield"))
        by_id = {r.request_id: r for r in out}
        assert isinstance(by_id["fail-1"], ffc.Internal) and by_id["fail-1"].details == "engine failure: fake"
        assert isinstance(by_id["ok"], ffc.EncodeResult)


def test_results_from_fake(ffc, fake):
    with ffc.Client(fake.target) as c:
        res = c.encode([[1, 2, 3], np.ones((2, 4))], return_token_embeddings=True, return_logits=True,
                       request_id="q")
    assert res.request_id == "q" and res.num_tokens == [3, 2] and (res.queue_time_us, res.compute_time_us) == (7, 9)
    assert [t.shape for t in res.token_embeddings] == [(3, 4), (2, 4)] and res.logits.shape == (2, 2)
    assert res.embeddings.tolist() == [[3, 0, 0, 0], [2, 0, 0, 0]]


def test_malformed_response_is_internal(ffc, fake, pb):
    r = pb.EncodeResponse()
    r.encodings.add().embedding.extend([1, 2, 3, 4])
    fake.response_override = r.SerializeToString()  # one encoding for two sequences
    with ffc.Client(fake.target) as c:
        with pytest.raises(ffc.Internal, match="malformed response: 1 encodings for 2 sequences"):
            c.encode([[1], [2]])
        r.encodings[0].num_tokens = 1
        r.encodings[0].token_embeddings.extend([1, 2, 3])  # 3 values for 1 x 4
        fake.response_override = r.SerializeToString()
        with pytest.raises(ffc.Internal, match="token_embeddings"):
            c.encode([[1]], return_token_embeddings=True)


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl not on PATH")
    d = tmp_path_factory.mktemp("certs")
    for name in ("server", "client"):
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                        "-subj", f"/CN={name}", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                        "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt")],
                       check=True, capture_output=True)
    return d


@pytest.mark.parametrize("mutual", [False, True])
def test_tls(ffc, pb, certs, mutual):
    impl = FakeEncoder(pb)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=impl.handlers())
    creds = grpc.ssl_server_credentials([((certs / "server.key").read_bytes(), (certs / "server.crt").read_bytes())],
                                        root_certificates=(certs / "client.crt").read_bytes() if mutual else None,
                                        require_client_auth=mutual)
    port = server.add_secure_port("127.0.0.1:0", creds)
    server.start()
    try:
        target = f"localhost:{port}"
        client_cert = dict(certificate_chain=certs / "client.crt", private_key=str(certs / "client.key")) \
            if mutual else {}
        with ffc.Client(target, root_certificates=str(certs / "server.crt"), **client_cert) as c:
            assert c.health() == "SERVING" and c.encode([[1, 2]]).shape == (1, 4)
        # PEM bytes work as well as paths; tls=True with the wrong root fails to connect
        with ffc.Client(target, tls=True, root_certificates=(certs / "server.crt").read_bytes(), **client_cert) as c:
            assert c.health() == "SERVING"
        with ffc.Client(target, tls=True, root_certificates=(certs / "client.crt").read_bytes(), deadline_s=5,
                        **client_cert) as c:
            with pytest.raises(ffc.Unavailable):
                c.health()
        if mutual:
            with ffc.Client(target, root_certificates=certs / "server.crt", deadline_s=5) as c:
                with pytest.raises(ffc.Unavailable):
                    c.health()

        async def run_async():
            async with ffc.AsyncClient(target, root_certificates=certs / "server.crt", **client_cert) as c:
                return await c.health()
        assert asyncio.run(run_async()) == "SERVING"
    finally:
        server.stop(None)
    with pytest.raises(ValueError, match="both"):
        ffc.Client("x:1", certificate_chain=b"x")

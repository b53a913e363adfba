"""Start-up, health, reflection and graceful shutdown.

Health (grpc.health.v1, services "" and "fastformer.v1.Encoder"): NOT_SERVING until the model is
loaded and a warm-up batch has run (Encode meanwhile: UNAVAILABLE), then SERVING; NOT_SERVING
while draining where that is observable. Reflection lists fastformer.v1.Encoder and serves its
descriptor. SIGTERM under load: every accepted request is answered OK and correctly, calls after
the signal get UNAVAILABLE, the process exits 0 within --shutdown-timeout-s.
"""

from __future__ import annotations

import signal
import time

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2

SERVICE = "fastformer.v1.Encoder"
INFERENCE_SERVICE = "inference.GRPCInferenceService"


def test_health_transitions_at_startup(e2e, models, servers):
    """The "slowload" model converts a 128 MB float16 embedding at load, so start-up takes visible time."""
    models.get("slowload")
    srv = servers.start("slowload", wait=False).wait_listening()
    probe = e2e.make_request([[5, 6, 7]], "ids", request_id="early")
    history = []          # distinct consecutive (status "", status SERVICE)
    early_encode = None   # (code, message) of an Encode sent while NOT_SERVING
    deadline = time.monotonic() + 30
    while True:
        if not srv.alive():
            pytest.fail(f"server exited with {srv.proc.returncode} during start-up\n{srv.log_tail()}", pytrace=False)
        state = (srv.health_status("", timeout=0.5), srv.health_status(SERVICE, timeout=0.5))
        if not history or history[-1] != state:
            history.append(state)
        if "NOT_SERVING" in state and early_encode is None:
            code, msg, _ = e2e.rpc_code(srv.stub.Encode, probe, timeout=5)
            early_encode = (code.name, msg)
        if state == ("SERVING", "SERVING"):
            break
        assert time.monotonic() < deadline, f"not SERVING after 30 s; health history {history}\n{srv.log_tail()}"
        time.sleep(0.001)
    print(f"health history (\"\", {SERVICE}): {history}; Encode while NOT_SERVING: {early_encode}")
    allowed = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "NOT_SERVING", "SERVING"}  # the first two: not listening yet
    assert all(s in allowed for st in history for s in st), f"unexpected health answers: {history}"
    assert any(s == "NOT_SERVING" for st in history for s in st), (
        f"health never said NOT_SERVING during start-up (history {history}, polled from the moment the port "
        f"accepted connections): a client sees connection refused while the model loads and SERVING right "
        f"after; the server should listen, answer NOT_SERVING (and Encode UNAVAILABLE) while it loads the "
        f"model and runs the warm-up batch")
    for k in (0, 1):  # per service: once SERVING, it stays SERVING
        seq = [st[k] for st in history]
        assert "NOT_SERVING" not in seq[seq.index("SERVING"):], f"SERVING went back: {history}"
    if early_encode is not None and early_encode[0] != "OK":
        assert early_encode[0] == "UNAVAILABLE", f"Encode while NOT_SERVING: {early_encode}, expected UNAVAILABLE"
    elif early_encode is not None:
        # the probe raced with the end of start-up; fine only if health had turned SERVING meanwhile
        assert srv.health_status("") == "SERVING"
    resp = srv.stub.Encode(probe, timeout=e2e.RPC_TIMEOUT_S)
    e2e.check_response("after start-up", resp, models.get("slowload"), [[5, 6, 7]], request_id="early")


def _reflect(e2e, srv, **kwargs):
    req = e2e.refl_pb.ServerReflectionRequest(**kwargs)
    resps = list(srv.reflection.ServerReflectionInfo(iter([req]), timeout=10))
    assert len(resps) == 1, f"reflection answered {len(resps)} messages"
    return resps[0]


def test_reflection(e2e, servers):
    srv = servers.shared("head")
    resp = _reflect(e2e, srv, list_services="")
    names = [s.name for s in resp.list_services_response.service]
    print(f"reflection lists {names}")
    assert SERVICE in names, f"reflection lists {names}"
    resp = _reflect(e2e, srv, file_containing_symbol=SERVICE)
    assert resp.WhichOneof("message_response") == "file_descriptor_response", f"reflection answered {resp}"
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in resp.file_descriptor_response.file_descriptor_proto]
    services = {f"{f.package}.{s.name}": [m.name for m in s.method] for f in files for s in f.service}
    assert sorted(services.get(SERVICE, [])) == ["Encode", "EncodeStream", "GetModelInfo"], services
    # The Open Inference Protocol's service, described from its own file (tests/kserve drives it).
    assert INFERENCE_SERVICE in names, f"reflection lists {names}"
    resp = _reflect(e2e, srv, file_containing_symbol=INFERENCE_SERVICE)
    files = [descriptor_pb2.FileDescriptorProto.FromString(b)
             for b in resp.file_descriptor_response.file_descriptor_proto]
    services = {f"{f.package}.{s.name}": [m.name for m in s.method] for f in files for s in f.service}
    assert sorted(services.get(INFERENCE_SERVICE, [])) == sorted(
        ["ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
         "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
         "RepositoryModelUnload"]), services


def test_health_of_each_service(e2e, servers):
    srv = servers.shared("head")
    assert srv.health_status("") == "SERVING"
    assert srv.health_status(SERVICE) == "SERVING"
    assert srv.health_status(INFERENCE_SERVICE) == "SERVING"


def test_sigterm_under_load(e2e, models, servers):
    model = models.get("load")
    rng = np.random.default_rng(15)
    seqs = [e2e.make_ids(rng, 2000, model.vocab) for _ in range(4)]
    for s in seqs:
        model.reference(s)
    srv = servers.start("load", max_batch_tokens=2048, max_queue_tokens=1_000_000, max_request_tokens=4096,
                        shutdown_timeout_s=30)
    n = 20
    futures = [srv.stub.Encode.future(e2e.make_request([seqs[i % 4]], "ids", request_id=f"f{i}"),
                                      timeout=e2e.RPC_TIMEOUT_S) for i in range(n)]
    # every call accepted (in flight or already answered) before the signal
    m = srv.metrics_when(lambda m: m.value("fastformer_inflight_requests") + sum(f.done() for f in futures) >= n, 10)
    inflight = m.value("fastformer_inflight_requests")
    pending = sum(not f.done() for f in futures)
    assert inflight + (n - pending) >= n, f"only {inflight:.0f} in flight and {n - pending} answered of {n}"
    assert pending > 0, "every request finished before the signal: raise the load"
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    time.sleep(0.1)
    late_req = e2e.make_request([[5, 6, 7]], "ids", request_id="late")
    late = [e2e.rpc_code(srv.stub.Encode, late_req, timeout=5)[:2],
            e2e.rpc_code(e2e.pb_grpc.EncoderStub(srv.new_channel(own_connection=True)).Encode, late_req,
                         timeout=5)[:2]]
    health = srv.health_status("", timeout=1)
    results = []
    for i, f in enumerate(futures):
        code, msg, resp = e2e.rpc_code(f.result)
        results.append((code, msg, resp))
    rc = srv.wait_exit(35)
    elapsed = time.monotonic() - t0
    print(f"SIGTERM with {pending} of {n} requests pending; late calls {[(c.name, m) for c, m in late]}; "
          f"health while draining {health}; exit {rc} after {elapsed:.2f} s")
    for i, (code, msg, resp) in enumerate(results):
        assert code == grpc.StatusCode.OK, f"accepted request {i} answered {code.name} ({msg!r}) during shutdown"
        e2e.check_response(f"request {i}", resp, model, [seqs[i % 4]], request_id=f"f{i}")
    for c, msg in late:
        assert c == grpc.StatusCode.UNAVAILABLE, f"a call after SIGTERM got {c.name} ({msg!r}), expected UNAVAILABLE"
    assert health in ("NOT_SERVING", "UNAVAILABLE"), f"health while draining: {health}"
    assert rc is not None, f"still running {elapsed:.0f} s after SIGTERM (--shutdown-timeout-s 30)"
    assert rc == 0, f"exit code {rc} after SIGTERM\n{srv.log_tail()}"
    assert elapsed <= 31, f"exit took {elapsed:.1f} s, over --shutdown-timeout-s 30"


def test_second_signal_exits_at_once(e2e, models, servers):
    """A second SIGTERM during the drain exits at once (without waiting for the queue)."""
    model = models.get("load")
    srv = servers.start("load", max_batch_tokens=2048, max_queue_tokens=1_000_000, max_request_tokens=4096)
    ids = e2e.make_ids(np.random.default_rng(2), 2000, model.vocab)
    futures = [srv.stub.Encode.future(e2e.make_request([ids], "ids"), timeout=e2e.RPC_TIMEOUT_S) for _ in range(30)]
    srv.metrics_when(lambda m: m.value("fastformer_inflight_requests") + sum(f.done() for f in futures) >= 30, 10)
    srv.signal(signal.SIGTERM)
    time.sleep(0.2)
    pending = sum(not f.done() for f in futures)
    t0 = time.monotonic()
    srv.signal(signal.SIGTERM)
    rc = srv.wait_exit(5)
    elapsed = time.monotonic() - t0
    print(f"second SIGTERM with {pending} requests pending: exit {rc} after {elapsed:.2f} s")
    assert pending > 0, "the queue drained before the second signal: raise the load"
    assert rc is not None and elapsed < 2, f"still running {elapsed:.1f} s after the second SIGTERM"
    for f in futures:  # every call ends (answered, or failed by the exit), none hangs
        e2e.rpc_code(f.result, timeout=10)


def test_a_served_model_name_is_an_alias_on_fastformer_v1_too(e2e, models, servers):
    """--served-model-name is one naming rule for every protocol (issue 33; it was HTTP's only):
    Encode and GetModelInfo name the model by an alias and answer with its own name."""
    model = models.get("head")
    srv = servers.start("head", served_model_name="alias-a,alias-b")
    ids = [5, 9, 13, 2]
    req = e2e.pb.EncodeRequest(model_name="alias-b", sequences=[e2e.pb.Sequence(token_ids=ids)])
    resp = srv.stub.Encode(req, timeout=e2e.RPC_TIMEOUT_S)
    assert resp.model_name == "e2e-head"
    e2e.check_encoding("alias-b", resp.encodings[0], model.reference(ids), len(ids), model.hidden)
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(model_name="alias-a"), timeout=e2e.RPC_TIMEOUT_S)
    assert info.model_name == "e2e-head"
    with pytest.raises(grpc.RpcError) as refused:
        srv.stub.Encode(e2e.pb.EncodeRequest(model_name="alias-c", sequences=req.sequences),
                        timeout=e2e.RPC_TIMEOUT_S)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'alias-c'" in refused.value.details()

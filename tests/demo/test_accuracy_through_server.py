"""The held-out split as text through the real server (issue 15, point 5): fastformer-server on
the trained demo model, its tokenizer.json doing the notebook's tokenization, every page sent
as Sequence.text over gRPC. Every predicted label equals the notebook's PyTorch model's on the
same page, the logits agree within 1e-4 of the page's largest |logit| (float32), num_tokens is
the length of the notebook's ids, and so the accuracy is the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from fastformer_testing import REPO, ServerProcess, server_opts  # tools/, on sys.path by conftest.py
from fastformer_testing.cpu_features import has_bf16_gemms

LOGIT_TOLERANCE = 1e-4  # relative to the page's largest |logit|
PAGES_PER_REQUEST = 16


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO / "proto"), f"--python_out={out}",
                    f"--grpc_python_out={out}", "fastformer/v1/encoder.proto"], check=True)
    sys.path.insert(0, str(out))
    from fastformer.v1 import encoder_pb2, encoder_pb2_grpc
    return encoder_pb2, encoder_pb2_grpc


def _serve(demo_model_dir, stubs, log_dir, env=None, **flags):
    """The server on the demo model (its own engine settings), answering GetModelInfo:
    (server, channel, stub, info)."""
    if not (demo_model_dir / "tokenizer.json").is_file():
        pytest.fail(f"{demo_model_dir} has no tokenizer.json: tools/train_demo_model.py writes it", pytrace=False)
    pb, pb_grpc = stubs
    srv = ServerProcess(log_dir / "server.log", server_opts({"model-dir": demo_model_dir}, flags, engine={}), env=env,
                        start_timeout=60, stop_grace=30)
    try:
        channel = grpc.insecure_channel(srv.target)
        stub = pb_grpc.EncoderStub(channel)
        info = srv.wait_for(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=2), "GetModelInfo",
                            interval=0.2, retry_on=(grpc.RpcError,))
    except BaseException:
        srv.stop(check=False)
        raise
    return srv, channel, stub, info


@pytest.fixture(scope="module")
def server(demo_model_dir, stubs, tmp_path_factory):
    # float32: the 1e-4 logit rule is float32's (the default, auto, is bfloat16 on a CPU with
    # AVX512_BF16 or AMX; the bfloat16 test below names its dtype too).
    srv, channel, stub, info = _serve(demo_model_dir, stubs, tmp_path_factory.mktemp("server"), dtype="float32")
    yield stub, info
    channel.close()
    srv.stop()


def _encode_split(pb, stub, demo_split):
    logits, tokens = [], []
    for i in range(0, len(demo_split.texts), PAGES_PER_REQUEST):
        req = pb.EncodeRequest(request_id=f"pages-{i}", return_logits=True)
        for text in demo_split.texts[i:i + PAGES_PER_REQUEST]:
            req.sequences.add().text = text
        resp = stub.Encode(req, timeout=120)
        logits += [list(e.logits) for e in resp.encodings]
        tokens += [e.num_tokens for e in resp.encodings]
    return np.array(logits, dtype=np.float64), tokens


def test_the_split_as_text_gives_the_notebook_predictions(server, stubs, demo_split, demo_report):
    pb, _ = stubs
    stub, info = server
    assert info.accepts_text and info.tokenizer.startswith("WordLevel"), (info.accepts_text, info.tokenizer)
    want_tokens = [len(json.loads(line)["token_ids"])
                   for line in demo_split.ids_path.read_text().splitlines() if line.strip()]
    start = time.monotonic()
    ours, tokens = _encode_split(pb, stub, demo_split)
    seconds = time.monotonic() - start
    torch_logits = demo_split.torch_logits
    assert ours.shape == torch_logits.shape, (ours.shape, torch_logits.shape)
    assert tokens == want_tokens, [i for i, (a, b) in enumerate(zip(tokens, want_tokens)) if a != b][:10]
    scale = np.maximum(np.abs(torch_logits).max(1, keepdims=True), 1e-30)
    rel = (np.abs(ours - torch_logits) / scale).max(1)
    labels, torch_labels = ours.argmax(1), demo_split.torch_labels
    differ = np.flatnonzero(labels != torch_labels)
    accuracy, torch_accuracy = (labels == demo_split.labels).mean(), (torch_labels == demo_split.labels).mean()
    demo_report(f"gRPC text: {len(labels)} pages ({sum(tokens)} tokens) in {seconds:.1f} s: labels equal to "
                f"PyTorch's on {len(labels) - len(differ)}/{len(labels)}, worst logit difference "
                f"{rel.max():.2e} of the page's largest |logit|, accuracy {accuracy:.4f} "
                f"(PyTorch {torch_accuracy:.4f})")
    assert len(differ) == 0, f"pages whose label differs from PyTorch's: {differ.tolist()}"
    assert rel.max() <= LOGIT_TOLERANCE, f"page {int(rel.argmax())}: logits differ by {rel.max():.2e}"
    assert accuracy == torch_accuracy


def test_the_split_in_bfloat16_gives_the_notebook_labels(demo_model_dir, stubs, demo_split, demo_report, tmp_path):
    """--dtype bfloat16 through the server: every page's label equals PyTorch's (issue 22,
    point 5). On a CPU without AVX512_BF16 or AMX the server refuses bfloat16, so the test
    runs the same bfloat16 engine over float32 GEMMs (FASTFORMER_CPU_BFLOAT16=emulate) and
    says so."""
    pb, _ = stubs
    hardware = has_bf16_gemms()
    env = None if hardware else {"FASTFORMER_CPU_BFLOAT16": "emulate"}
    srv, channel, stub, info = _serve(demo_model_dir, stubs, tmp_path, env=env, dtype="bfloat16")
    try:
        ours, tokens = _encode_split(pb, stub, demo_split)
    finally:
        channel.close()
        text = srv.stop()
    assert "bfloat16" in text and ("emulated" in text) == (not hardware), text[-2000:]
    torch_logits = demo_split.torch_logits
    labels, torch_labels = ours.argmax(1), demo_split.torch_labels
    differ = np.flatnonzero(labels != torch_labels)
    scale = np.maximum(np.abs(torch_logits).max(1, keepdims=True), 1e-30)
    rel = (np.abs(ours - torch_logits) / scale).max(1)
    demo_report(f"gRPC text, bfloat16 ({'hardware' if hardware else 'emulated over float32 GEMMs: no bfloat16 here'}): "
                f"labels equal to PyTorch's on {len(labels) - len(differ)}/{len(labels)}, worst logit difference "
                f"{rel.max():.2e} of the page's largest |logit|")
    assert len(differ) == 0, f"pages whose label differs from PyTorch's: {differ.tolist()}"
    # Rounded, so not the float32 logits (the dtype took effect).
    assert rel.max() > 1e-5

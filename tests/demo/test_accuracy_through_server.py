"""The held-out split as text through the real server (issue 15, point 5): fastformer-server on
the trained demo model, its tokenizer.json doing the notebook's tokenization, every page sent
as Sequence.text over gRPC. Every predicted label equals the notebook's PyTorch model's on the
same page, the logits agree within 1e-4 of the page's largest |logit| (float32), num_tokens is
the length of the notebook's ids, and so the accuracy is the same."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
LOGIT_TOLERANCE = 1e-4  # relative to the page's largest |logit|
PAGES_PER_REQUEST = 16


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stubs")
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO / "proto"), f"--python_out={out}",
                    f"--grpc_python_out={out}", "fastformer/v1/encoder.proto"], check=True)
    sys.path.insert(0, str(out))
    from fastformer.v1 import encoder_pb2, encoder_pb2_grpc
    return encoder_pb2, encoder_pb2_grpc


@pytest.fixture(scope="module")
def server(demo_model_dir, require_binary, stubs, tmp_path_factory):
    if not (demo_model_dir / "tokenizer.json").is_file():
        pytest.fail(f"{demo_model_dir} has no tokenizer.json: tools/train_demo_model.py writes it", pytrace=False)
    pb, pb_grpc = stubs
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(require_binary("fastformer-server")), "--model-dir", str(demo_model_dir),
                                 "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{_free_port()}"],
                                stdout=out, stderr=subprocess.STDOUT)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.EncoderStub(channel)
    deadline = time.monotonic() + 60
    while True:
        try:
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=2)
            break
        except grpc.RpcError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"fastformer-server did not serve: {log.read_text()[-3000:]}", pytrace=False)
            time.sleep(0.2)
    yield stub, info
    channel.close()
    proc.terminate()
    proc.wait(timeout=30)


def test_the_split_as_text_gives_the_notebook_predictions(server, stubs, demo_split, demo_report):
    pb, _ = stubs
    stub, info = server
    assert info.accepts_text and info.tokenizer.startswith("WordLevel"), (info.accepts_text, info.tokenizer)
    want_tokens = [len(json.loads(line)["token_ids"])
                   for line in demo_split.ids_path.read_text().splitlines() if line.strip()]
    logits, tokens = [], []
    start = time.monotonic()
    for i in range(0, len(demo_split.texts), PAGES_PER_REQUEST):
        req = pb.EncodeRequest(request_id=f"pages-{i}", return_logits=True)
        for text in demo_split.texts[i:i + PAGES_PER_REQUEST]:
            req.sequences.add().text = text
        resp = stub.Encode(req, timeout=120)
        logits += [list(e.logits) for e in resp.encodings]
        tokens += [e.num_tokens for e in resp.encodings]
    seconds = time.monotonic() - start
    ours = np.array(logits, dtype=np.float64)
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

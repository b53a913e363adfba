"""KServe v2 over gRPC: inference.GRPCInferenceService's answers to a fixed set of good and bad
requests, against a golden file (issue 33's "behaviour unchanged", with tests/http's and
tests/e2e's goldens; recorded before the serving core is restructured).

Raw protobuf requests through tritonclient's generated stub (so bad requests reach the server
as sent) to a fresh server on the suite's demo model. An answer is the gRPC code's name, its
details and the response as protobuf's JSON mapping, raw output tensors decoded by their
datatype; volatile fields masked and numbers within 1e-3 (tools/fastformer_testing/golden_answers.py).

    FASTFORMER_RECORD_GOLDEN=1 .venv-triton/bin/python -m pytest tests/kserve/test_behaviour_golden.py

writes tests/kserve/behaviour_golden.json anew (an intended change: say which in the commit).
"""

from __future__ import annotations

import base64
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from fastformer_testing.golden_answers import check, rpc_answer  # tools/, on sys.path by conftest

GOLDEN = Path(__file__).with_name("behaviour_golden.json")
IDS = [2, 10, 11, 12, 3]
DTYPES = {"FP32": "<f4", "INT64": "<i8", "INT32": "<i4"}


def _infer(model, inputs, outputs=(), name=None):
    req = pb.ModelInferRequest(model_name=name or model.name, id="golden")
    for inp_name, datatype, shape, data in inputs:
        req.inputs.add(name=inp_name, datatype=datatype, shape=shape)
        req.raw_input_contents.append(data)
    for o in outputs:
        req.outputs.add(name=o)
    return req


def _decode_outputs(body):
    """raw_output_contents (base64 in the JSON mapping) as numbers, by each output's datatype."""
    raws = body.pop("raw_output_contents", None)
    if raws is None:
        return body
    for out, raw in zip(body.get("outputs", []), raws):
        out["data"] = np.frombuffer(base64.b64decode(raw), dtype=DTYPES[out["datatype"]]).tolist()
    return body


def test_every_rpc_answers_as_recorded(start, model):
    srv = start()
    ids = np.array([IDS], dtype=np.int64).tobytes()
    infers = [
        ("infer ids", _infer(model, [("input_ids", "INT64", [1, 5], ids)])),
        ("infer ids, every output of the REST config (num_tokens too)", _infer(model, [("input_ids", "INT64", [1, 5], ids)],
                                           ["embedding", "token_embeddings", "logits", "num_tokens"])),
        ("infer ids with a mask", _infer(model, [("input_ids", "INT64", [1, 5], ids),
                                                 ("attention_mask", "INT64", [1, 5],
                                                  np.array([[1, 1, 1, 0, 0]], dtype=np.int64).tobytes())])),
        ("infer INT32 ids", _infer(model, [("input_ids", "INT32", [1, 5], np.array([IDS], np.int32).tobytes())])),
        ("infer, unknown model", _infer(model, [("input_ids", "INT64", [1, 5], ids)], name="nope")),
        ("infer, wrong datatype", _infer(model, [("input_ids", "FP32", [1, 2], np.ones(2, np.float32).tobytes())])),
        ("infer, unknown input", _infer(model, [("pixels", "INT64", [1, 5], ids)])),
        ("infer, shape and data disagree", _infer(model, [("input_ids", "INT64", [1, 7], ids)])),
        ("infer, unknown output", _infer(model, [("input_ids", "INT64", [1, 5], ids)], ["attention"])),
        ("infer, no inputs", _infer(model, [])),
        ("infer, id over the vocabulary", _infer(model, [("input_ids", "INT64", [1, 2],
                                                          np.array([[1, 100000]], np.int64).tobytes())])),
    ]
    with grpc.insecure_channel(srv.url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        got = {
            "server live": rpc_answer(stub.ServerLive, pb.ServerLiveRequest()),
            "server ready": rpc_answer(stub.ServerReady, pb.ServerReadyRequest()),
            "server metadata": rpc_answer(stub.ServerMetadata, pb.ServerMetadataRequest()),
            "model ready": rpc_answer(stub.ModelReady, pb.ModelReadyRequest(name=model.name)),
            "model ready, unknown": rpc_answer(stub.ModelReady, pb.ModelReadyRequest(name="nope")),
            "model metadata": rpc_answer(stub.ModelMetadata, pb.ModelMetadataRequest(name=model.name)),
            "model metadata, unknown version": rpc_answer(stub.ModelMetadata,
                                                       pb.ModelMetadataRequest(name=model.name, version="9")),
            "model config": rpc_answer(stub.ModelConfig, pb.ModelConfigRequest(name=model.name)),
        }
        for name, req in infers:
            got[name] = rpc_answer(stub.ModelInfer, req, _decode_outputs)
        got["model statistics, after the infers"] = rpc_answer(stub.ModelStatistics,
                                                            pb.ModelStatisticsRequest(name=model.name))
    check(GOLDEN, got)

"""Answers against a golden file, for issue 33's "behaviour unchanged" (tests/http, tests/e2e,
tests/kserve): every protocol's answers to a fixed set of good and bad requests, recorded before
the serving core is restructured, and compared after.

An answer is plain JSON: a status (an HTTP status or a gRPC code's name), what else carries
meaning, and a body. `normalize` replaces what differs from run to run of the same build
(timestamps, durations, the server's version, the CPU the engine runs on) with "<volatile>" and
decodes base64 float32 embeddings; `first_difference` compares numbers within TOL (the engine
matches its float64 reference within 1e-4; CPUs with other vector units round differently) and
everything else exactly; `check` does the whole file, or records it anew when
FASTFORMER_RECORD_GOLDEN=1 (an intended change: say which in the commit).
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
from pathlib import Path

import pytest

TOL = 1e-3
# "device" names the CPU's instruction set and thread count, and "gemm_kernels" the kernels this
# CPU's oneDNN picked (and --cpu-gemm auto's timings); the two TEI counts may follow the
# machine's cores.
VOLATILE = {"created", "last_inference", "version", "sha", "model_sha", "docker_label", "device",
            "gemm_kernels", "max_concurrent_requests", "tokenization_workers", "server_version", "ns",
            "last_inference_timestamp"}


def _floats_b64(s: str):
    raw = base64.b64decode(s)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def normalize(value, key=""):
    if key in VOLATILE or key.endswith(("_ns", "_us", "_ms")):
        return "<volatile>"
    if isinstance(value, dict):
        return {k: normalize(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if key == "embedding" and isinstance(value, str):
        return _floats_b64(value)
    return value


def message_dict(message) -> dict:
    """A protobuf message as its JSON mapping with proto field names and every field, zero values
    included (the keyword was renamed in protobuf 5: Debian's 3.21 and the venvs' 6.x both run)."""
    from google.protobuf.json_format import MessageToDict
    try:
        return MessageToDict(message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    except TypeError:
        return MessageToDict(message, preserving_proto_field_name=True, including_default_value_fields=True)


def rpc_answer(method, request, decode=lambda body: body) -> dict:
    """A gRPC call's answer: the code's name, its details and the response's JSON mapping (passed
    through `decode`, then normalized); None as the body when the call failed."""
    import grpc
    try:
        response = method(request, timeout=30)
    except grpc.RpcError as e:
        return {"code": e.code().name, "details": e.details(), "body": None}
    return {"code": "OK", "details": "", "body": normalize(decode(message_dict(response)))}


def first_difference(want, got, path="body"):
    """None when got matches want (numbers within TOL), else where and how they differ."""
    if isinstance(want, bool) or isinstance(got, bool) or not (
            isinstance(want, (int, float)) and isinstance(got, (int, float))):
        if type(want) is not type(got):
            return f"{path}: {want!r} != {got!r}"
    if isinstance(want, dict):
        if set(want) != set(got):
            return f"{path}: keys {sorted(want)} != {sorted(got)}"
        for k in want:
            d = first_difference(want[k], got[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(want, list):
        if len(want) != len(got):
            return f"{path}: length {len(want)} != {len(got)}"
        for i, (w, g) in enumerate(zip(want, got)):
            d = first_difference(w, g, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, float) or isinstance(got, float):
        ok = math.isclose(float(want), float(got), rel_tol=TOL, abs_tol=TOL)
        return None if ok else f"{path}: {want!r} != {got!r} (tolerance {TOL})"
    return None if want == got else f"{path}: {want!r} != {got!r}"


def check(golden: Path, got: dict):
    """Records `got` ({case: answer}) into `golden` with FASTFORMER_RECORD_GOLDEN=1 (and skips),
    else fails with every case whose answer differs, each with its first difference."""
    if os.environ.get("FASTFORMER_RECORD_GOLDEN") == "1":
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
        pytest.skip(f"recorded {len(got)} answers into {golden}")
    want = json.loads(golden.read_text())
    assert sorted(want) == sorted(got), f"the cases and {golden.name} disagree: record it anew"
    failures = [f"{name}: {d}" for name in want
                if (d := first_difference(want[name], got[name], "answer"))]
    assert not failures, "answers changed:\n" + "\n".join(failures)

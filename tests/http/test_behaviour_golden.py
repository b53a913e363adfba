"""Every HTTP route's answer to a fixed set of good and bad requests, against a golden file
(issue 33's "behaviour unchanged": recorded before the serving core is restructured, so the
restructure can show that each route still answers the same).

Each case is one request to a fresh server on text_model (a classifier with a tokenizer, served
also as alias1 and alias2) or ids_model (token ids only, no label names). What is kept of each
answer: the status, the headers that carry meaning (content-type, retry-after, allow,
www-authenticate) and the body, parsed when it is JSON. Values that change from run to run
(timestamps, durations, the server's version, the CPU the engine runs on) are "<volatile>";
base64 embeddings are decoded to floats. Numbers compare within 1e-3, everything else exactly
(tools/fastformer_testing/golden_answers.py, shared with the gRPC goldens of tests/e2e
and tests/kserve).

    FASTFORMER_RECORD_GOLDEN=1 .venv-http/bin/python -m pytest tests/http/test_behaviour_golden.py

writes tests/http/behaviour_golden.json anew (an intended change of behaviour: say which in the
commit). Without it, a differing answer fails with the case's name and the first difference.
"""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path

from conftest import TEXT, TEXTS, call
from fastformer_testing.golden_answers import check, first_difference, normalize  # tools/, on sys.path by conftest

GOLDEN = Path(__file__).with_name("behaviour_golden.json")
HEADERS = ("content-type", "retry-after", "allow", "www-authenticate")

T = "http-text"  # text_model's name
IDS = TEXTS[TEXT]

# (name, server, method, path, body)
CASES = [
    # OpenAI
    ("openai embeddings, one text", "text", "POST", "/v1/embeddings", {"input": TEXT, "model": T}),
    ("openai embeddings, two texts by alias, base64", "text", "POST", "/v1/embeddings",
     {"input": [TEXT, "the lazy dog"], "model": "alias1", "encoding_format": "base64"}),
    ("openai embeddings, ids, dimensions 8", "text", "POST", "/v1/embeddings",
     {"input": [IDS], "model": T, "dimensions": 8}),
    ("openai embeddings, no model", "text", "POST", "/v1/embeddings", {"input": "zebra"}),
    ("openai embeddings, unknown model", "text", "POST", "/v1/embeddings", {"input": TEXT, "model": "nope"}),
    ("openai embeddings, empty list", "text", "POST", "/v1/embeddings", {"input": [], "model": T}),
    ("openai embeddings, dimensions over hidden", "text", "POST", "/v1/embeddings",
     {"input": TEXT, "model": T, "dimensions": 1000}),
    ("openai embeddings, bad encoding_format", "text", "POST", "/v1/embeddings",
     {"input": TEXT, "encoding_format": "int8"}),
    ("openai embeddings, malformed JSON", "text", "POST", "/v1/embeddings", b"{\"input\": "),
    ("openai embeddings, GET", "text", "GET", "/v1/embeddings", None),
    ("openai models", "text", "GET", "/v1/models", None),
    ("openai model by alias", "text", "GET", "/v1/models/alias2", None),
    ("openai model unknown", "text", "GET", "/v1/models/nope", None),
    ("openai embeddings, text to an ids-only model", "ids", "POST", "/v1/embeddings", {"input": TEXT}),
    # text-embeddings-inference
    ("tei embed", "text", "POST", "/embed", {"inputs": TEXT}),
    ("tei embed, two, not normalized", "text", "POST", "/embed", {"inputs": [TEXT, "zebra"], "normalize": False}),
    ("tei embed_all", "text", "POST", "/embed_all", {"inputs": "the lazy dog"}),
    ("tei predict", "text", "POST", "/predict", {"inputs": TEXT}),
    ("tei predict, raw scores", "text", "POST", "/predict", {"inputs": [[TEXT], ["zebra"]], "raw_scores": True}),
    ("tei predict, a pair", "text", "POST", "/predict", {"inputs": [TEXT, "zebra"]}),
    ("tei predict, token ids as inputs", "ids", "POST", "/predict", {"inputs": [IDS]}),
    ("tei tokenize", "text", "POST", "/tokenize", {"inputs": "Café, HELLO world!"}),
    ("tei info", "text", "GET", "/info", None),
    ("tei health", "text", "GET", "/health", None),
    ("tei root", "text", "POST", "/", {"inputs": TEXT}),
    ("tei embed, no inputs", "text", "POST", "/embed", {}),
    ("tei embed, inputs a number", "text", "POST", "/embed", {"inputs": 5}),
    ("tei embed, empty text", "text", "POST", "/embed", {"inputs": ""}),
    ("tei embed, too long, no truncate", "text", "POST", "/embed", {"inputs": "dog " * 600}),
    ("tei embed, too long, truncate", "text", "POST", "/embed", {"inputs": "dog " * 600, "truncate": True}),
    ("unknown route", "text", "GET", "/nope", None),
    # KServe v2 REST
    ("kserve server metadata", "text", "GET", "/v2", None),
    ("kserve live", "text", "GET", "/v2/health/live", None),
    ("kserve ready", "text", "GET", "/v2/health/ready", None),
    ("kserve model metadata", "text", "GET", f"/v2/models/{T}", None),
    ("kserve model version metadata", "text", "GET", f"/v2/models/{T}/versions/1", None),
    ("kserve model ready", "text", "GET", f"/v2/models/{T}/ready", None),
    ("kserve model config", "text", "GET", f"/v2/models/{T}/config", None),
    ("kserve unknown model", "text", "GET", "/v2/models/nope", None),
    ("kserve infer, text", "text", "POST", f"/v2/models/{T}/infer",
     {"inputs": [{"name": "text", "shape": [2, 1], "datatype": "BYTES", "data": [TEXT, "the lazy dog"]}]}),
    ("kserve infer, ids", "text", "POST", f"/v2/models/{T}/infer",
     {"inputs": [{"name": "input_ids", "shape": [1, len(IDS)], "datatype": "INT64", "data": IDS}],
      "outputs": [{"name": "embedding"}]}),
    ("kserve infer, wrong datatype", "text", "POST", f"/v2/models/{T}/infer",
     {"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 2.0]}]}),
    ("kserve infer, unknown input", "text", "POST", f"/v2/models/{T}/infer",
     {"inputs": [{"name": "pixels", "shape": [1, 1], "datatype": "INT64", "data": [1]}]}),
    ("kserve infer, shape and data disagree", "text", "POST", f"/v2/models/{T}/infer",
     {"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [1, 2]}]}),
]


def answer(reply) -> dict:
    headers = {h: reply.headers[h] for h in HEADERS if h in reply.headers}
    try:
        body = normalize(json.loads(reply.body)) if reply.body else ""
    except ValueError:
        body = reply.body.decode("utf-8", "replace")
    return {"status": reply.status, "headers": headers, "body": body}


def test_every_route_answers_as_recorded(start, text_model, ids_model):
    servers = {"text": start(text_model, served_model_name="alias1,alias2"), "ids": start(ids_model)}
    got = {}
    for name, which, method, path, body in CASES:
        got[name] = answer(call(servers[which].http_port, method, path, body))
    check(GOLDEN, got)


def test_the_comparison_sees_a_change():
    """The comparison is not vacuous: a changed status, message, key or number is reported."""
    rec = {"status": 400, "headers": {"content-type": "application/json"},
           "body": {"error": {"message": "x", "code": None}, "data": [0.5, 1.0]}}
    assert first_difference(rec, json.loads(json.dumps(rec))) is None
    assert first_difference({**rec, "status": 422}, rec)
    assert first_difference(rec["body"], {**rec["body"], "error": {"message": "y", "code": None}})
    assert first_difference(rec["body"], {**rec["body"], "extra": 1})
    assert first_difference(rec["body"], {**rec["body"], "data": [0.5, 1.01]})
    assert first_difference(rec["body"], {**rec["body"], "data": [0.5, 1.0005]}) is None
    assert normalize({"created": 5, "embedding": base64.b64encode(struct.pack("<2f", 1, 2)).decode()}) == \
        {"created": "<volatile>", "embedding": [1.0, 2.0]}

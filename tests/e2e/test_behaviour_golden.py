"""fastformer.v1's answers (Encode, GetModelInfo) to a fixed set of good and bad requests, against
a golden file: issue 33's "behaviour unchanged" for gRPC, recorded before the serving core is
restructured (tests/http/test_behaviour_golden.py does the same for every HTTP route).

Each case is one RPC to a fresh server on the "text" demo model (a tokenizer and a 3-label head)
or "noemb" (input embeddings only). An answer is the gRPC code's name, its details and the
response as protobuf's JSON mapping; volatile fields (queue and compute times, the server's
version, the device) are "<volatile>" and numbers compare within 1e-3
(tools/fastformer_testing/golden_answers.py).

    FASTFORMER_RECORD_GOLDEN=1 python3 -m pytest tests/e2e/test_behaviour_golden.py

writes tests/e2e/behaviour_golden.json anew (an intended change: say which in the commit).
"""

from __future__ import annotations

from pathlib import Path

from fastformer_testing.golden_answers import check, rpc_answer  # tools/, on sys.path by conftest

GOLDEN = Path(__file__).with_name("behaviour_golden.json")
IDS = [2, 10, 11, 12, 3]  # in the vocabulary of every demo model (vocab 1000)


def _seq(pb, ids=None, text=None, emb=None):
    s = pb.Sequence()
    if ids is not None:
        s.token_ids.extend(ids)
    if text is not None:
        s.text = text
    if emb is not None:
        s.input_embeddings.extend(emb)
    return s


def encode_cases(pb):
    """(name, model, EncodeRequest)"""
    def req(seqs, **kw):
        r = pb.EncodeRequest(request_id=kw.pop("request_id", "golden"), **kw)
        r.sequences.extend(seqs)
        return r

    emb = [((i * 7) % 13 - 6) / 10.0 for i in range(3 * 64)]  # 3 rows of hidden 64
    return [
        ("encode ids", "text", req([_seq(pb, IDS)])),
        ("encode ids, tokens, logits, normalized", "text",
         req([_seq(pb, IDS), _seq(pb, IDS[:2])], return_token_embeddings=True, return_logits=True, normalize=True)),
        ("encode text", "text", req([_seq(pb, text="The quick brown foxes jumped.")], return_logits=True)),
        ("encode text truncated left", "text", req([_seq(pb, text="dog " * 600)], truncation=2)),
        ("encode by model name", "text", req([_seq(pb, IDS)], model_name="e2e-text")),
        ("encode embeddings", "noemb", req([_seq(pb, emb=emb)])),
        ("encode, no sequences", "text", req([])),
        ("encode, unknown model", "text", req([_seq(pb, IDS)], model_name="nope")),
        ("encode, unknown version", "text", req([_seq(pb, IDS)], model_version="7")),
        ("encode, id over the vocabulary", "text", req([_seq(pb, IDS), _seq(pb, [1, 5000])])),
        ("encode, negative id", "text", req([_seq(pb, [-1, 4])])),
        ("encode, an empty row", "text", req([_seq(pb, [])])),
        ("encode, text over the positions", "text", req([_seq(pb, text="dog " * 600)])),
        ("encode, empty text", "text", req([_seq(pb, text="")])),
        ("encode, unknown truncation", "text", req([_seq(pb, IDS)], truncation=7)),
        ("encode, logits without a head", "noemb", req([_seq(pb, emb=emb)], return_logits=True)),
        ("encode, ids without a word embedding", "noemb", req([_seq(pb, IDS)])),
        ("encode, embeddings not whole rows", "noemb", req([_seq(pb, emb=emb[:100])])),
        ("encode, text to a model without a tokenizer", "noemb", req([_seq(pb, text="hello")])),
    ]


def test_every_rpc_answers_as_recorded(e2e, servers):
    srv = {"text": servers.start("text"), "noemb": servers.start("noemb")}
    got = {}
    for name, model, request in encode_cases(e2e.pb):
        got[name] = rpc_answer(srv[model].stub.Encode, request)
    for model in ("text", "noemb"):
        got[f"model info, {model}"] = rpc_answer(srv[model].stub.GetModelInfo, e2e.pb.GetModelInfoRequest())
    got["model info, unknown model"] = rpc_answer(srv["text"].stub.GetModelInfo,
                                               e2e.pb.GetModelInfoRequest(model_name="nope"))
    check(GOLDEN, got)

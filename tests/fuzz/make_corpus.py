#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets into tests/fuzz/corpus/<target>/.

    /usr/bin/python3 tests/fuzz/make_corpus.py [--out tests/fuzz/corpus]

Deterministic: the same files every run (the models come from tools/make_demo_model.py
with fixed seeds). Input formats are those of the targets:
  fuzz_model_load   config.json, "\\n--model.safetensors--\\n", model.safetensors
  fuzz_request      one byte (bits 0-1 model, bits 2-3 max_request_tokens), EncodeRequest
  fuzz_infer_request  one byte (bits 0-1 model, 2-3 max_request_tokens, 4-5 max_batch_size),
                    then an inference.ModelInferRequest
  fuzz_batch_queue  three limit bytes, then operations (see fuzz_batch_queue.cc)
  fuzz_http         one byte (bits 0-1 model, 2-3 max_request_tokens, 4-5 max_request_inputs),
                    then an HTTP/1.1 request: one seed for every route
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools"))

MARKER = b"\n--model.safetensors--\n"


# ---- fuzz_model_load ------------------------------------------------------------------------

def tiny_model(dtype="float32", **kw):
    """(config.json bytes, model.safetensors bytes) of a very small demo model."""
    from make_demo_model import make_demo_model  # imports torch: only when needed

    args = dict(hidden=8, heads=2, layers=1, intermediate=8, max_positions=8, vocab=16, num_labels=2)
    args.update(kw)
    with tempfile.TemporaryDirectory() as d:
        make_demo_model(d, preset="tiny", seed=1, dtype=dtype, model_name="fuzz", log=lambda *a, **k: None, **args)
        with open(os.path.join(d, "config.json"), "rb") as f:
            config = f.read()
        with open(os.path.join(d, "model.safetensors"), "rb") as f:
            weights = f.read()
    return config, weights


def split_header(weights):
    n = struct.unpack("<Q", weights[:8])[0]
    return json.loads(weights[8:8 + n]), weights[8 + n:]


def join_header(header, data, size=None):
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text) if size is None else size) + text + data


def model_seeds():
    config, weights = tiny_model()
    cfg = json.loads(config)
    header, data = split_header(weights)
    first = sorted(k for k in header if k != "__metadata__")[0]
    second = sorted(k for k in header if k != "__metadata__")[1]
    seeds = {
        "valid_f32": (config, weights),
        "valid_f16_no_word_embedding": tiny_model("float16", num_labels=0, word_embedding=False),
        "valid_bf16_shared_layers": tiny_model("bfloat16", layers=3, share_layers=True, pad_token_id=3),
        "truncated_data": (config, weights[:-40]),
        "header_size_past_end": (config, join_header(header, data, size=len(weights))),
        "header_not_json": (config, weights[:8] + b"[" + weights[9:]),
        "unknown_dtype": (config, join_header({**header, first: {**header[first], "dtype": "I64"}}, data)),
        "overlapping_tensors": (config, join_header(
            {**header, second: {**header[second], "data_offsets": header[first]["data_offsets"]}}, data)),
        "shape_mismatch": (json.dumps({**cfg, "hidden_size": 16}).encode(), weights),
        "missing_tensor": (config, join_header({k: v for k, v in header.items() if k != second}, data)),
        "config_missing_key": (json.dumps({k: v for k, v in cfg.items() if k != "vocab_size"}).encode(), weights),
        "config_bad_pad": (json.dumps({**cfg, "pad_token_id": 99}).encode(), weights),
        "config_huge_layers_shared": (json.dumps({**cfg, "num_hidden_layers": 2000000000,
                                                  "share_layer_parameters": True}).encode(), weights),
        "empty_weights": (config, b""),
    }
    return {name: c + MARKER + w for name, (c, w) in seeds.items()}


# ---- fuzz_request: protobuf wire format by hand (no generated code needed) -------------------

def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, wire_type, payload):
    key = varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def sequence(ids=(), embeddings=(), text=b"", chunking=b""):
    out = field(3, 2, text) if text else b""
    if ids:
        out += field(1, 2, b"".join(varint(i) for i in ids))
    if embeddings:
        out += field(2, 2, struct.pack(f"<{len(embeddings)}f", *embeddings))
    if chunking:
        out += field(4, 2, chunking)
    return out


def chunking(spans=(), window=0, overlap=0, char_spans=(), sentences=False):
    """Sequence.chunking: TokenSpan {begin 1, end 2} spans (1) and char_spans (4), windows (2, 3),
    sentences (5)."""
    span = lambda b, e: field(1, 0, b) + field(2, 0, e)  # noqa: E731
    out = b"".join(field(1, 2, span(b, e)) for b, e in spans)
    out += b"".join(field(4, 2, span(b, e)) for b, e in char_spans)
    if window:
        out += field(2, 0, window)
    if overlap:
        out += field(3, 0, overlap)
    if sentences:
        out += field(5, 0, 1)
    return out


def request(seqs, request_id="r", token_embeddings=False, logits=False, normalize=False, truncation=0,
            chunk_pooling=0, macro_overlap=None, embedding_types=()):
    out = field(1, 2, request_id.encode())
    for t in embedding_types:  # EncodeRequest.embedding_types (11), EmbeddingType values
        out += field(11, 0, t)
    if chunk_pooling:
        out += field(9, 0, chunk_pooling)
    if macro_overlap is not None:  # google.protobuf.UInt32Value {value 1}
        out += field(10, 2, field(1, 0, macro_overlap) if macro_overlap else b"")
    for s in seqs:
        out += field(2, 2, s)
    if token_embeddings:
        out += field(3, 0, 1)
    if logits:
        out += field(4, 0, 1)
    if normalize:
        out += field(5, 0, 1)
    if truncation:
        out += field(6, 0, truncation)
    return out


def choice(model, limit, spans=0):
    """model 0: ids + 3 labels; 1: embeddings only; 2: pad 5, F16; 3: shared, BF16.
    limit: max_request_tokens 1, 16, 40, 64 (index 0-3); spans: max_request_spans none, 1, 4, 16."""
    return bytes([model | limit << 2 | spans << 4])


def request_seeds():
    row = [0.5, -1.0, 2.0, 0.0, 1.5, -0.25, 3.0, 1.0]
    nan = float("nan")
    return {
        "ids_two_sequences": choice(0, 3) + request([sequence([1, 2, 3]), sequence([4, 5, 6, 7, 8])],
                                                    token_embeddings=True, logits=True, normalize=True),
        "ids_spanning_batches": choice(3, 3) + request([sequence(list(range(1, 12)) + [0]) for _ in range(5)]),
        "truncate_right": choice(0, 2) + request([sequence(list(range(1, 12)) * 2)], truncation=1),
        "truncate_left": choice(2, 2) + request([sequence([5] * 10 + [1] * 20)], truncation=2),
        "embeddings": choice(1, 3) + request([sequence(embeddings=row * 3), sequence(embeddings=row)],
                                             token_embeddings=True),
        "mixed_kinds": choice(0, 3) + request([sequence([3, 0, 4]), sequence(embeddings=row * 2)]),
        "embeddings_truncated": choice(1, 3) + request([sequence(embeddings=row * 20)], truncation=1),
        "embeddings_nan": choice(1, 3) + request([sequence(embeddings=row[:7] + [nan])]),
        "embeddings_partial_row": choice(1, 3) + request([sequence(embeddings=row[:5])]),
        "ids_without_word_embedding": choice(1, 3) + request([sequence([1, 2])]),
        "id_out_of_range": choice(0, 3) + request([sequence([1, 12])]),
        "negative_id": choice(0, 3) + request([sequence([1, -1])]),
        "all_pad": choice(2, 3) + request([sequence([5, 5, 5])]),
        "both_kinds": choice(0, 3) + request([sequence([1], embeddings=row)]),
        "empty_sequence": choice(0, 3) + request([sequence()]),
        "no_sequences": choice(0, 3) + request([]),
        "too_long": choice(0, 3) + request([sequence([1] * 17)]),
        "over_request_tokens": choice(0, 1) + request([sequence([1] * 10), sequence([2] * 10)]),
        "logits_without_head": choice(2, 3) + request([sequence([1])], logits=True),
        "unknown_truncation": choice(0, 3) + request([sequence([1])], truncation=7),
        "not_a_proto": choice(0, 3) + b"\xff\xff\xff\xff",
        "text_wordlevel": choice(0, 3) + request([sequence(text="A b. é!? ab 1 zz".encode()), sequence([1, 2])],
                                                 logits=True),
        "text_truncated_by_tokenizer": choice(0, 3) + request([sequence(text=b"a " * 20)]),
        "text_wordpiece": choice(2, 3) + request([sequence(text=b"ab ba [PAD] e."), sequence(text=b"aaaa bbbb")],
                                                 truncation=2),
        "text_all_pad": choice(2, 3) + request([sequence(text=b"[PAD][PAD]")]),
        "text_too_long": choice(2, 3) + request([sequence(text=b"a " * 30)]),
        "text_whitespace": choice(0, 3) + request([sequence(text=b" \t\n")]),
        "text_not_utf8": choice(0, 3) + request([sequence(text=b"a\xffb")]),
        "text_without_tokenizer": choice(3, 3) + request([sequence(text=b"a b")]),
        "text_and_ids": choice(0, 3) + request([sequence([1], text=b"a")]),
        # late chunking
        "chunk_spans": choice(0, 3, 3) + request([sequence([1, 2, 3, 4, 5], chunking=chunking([(0, 2), (1, 5)]))]),
        "chunk_windows_mean": choice(2, 3, 3) + request(
            [sequence([1, 2, 3, 4, 5, 6], chunking=chunking(window=2, overlap=1))], chunk_pooling=1),
        "chunk_text_chars_sentences": choice(0, 3, 3) + request(
            [sequence(text="A b. é! ab".encode(), chunking=chunking(char_spans=[(0, 3)], sentences=True))]),
        # macro-chunks: 44 tokens over the 16 positions, passes at 0, 12, 24 and 28 (overlap 4;
        # 64 tokens computed), spans and windows in them
        "macro_chunks": choice(0, 3, 3) + request(
            [sequence(list(range(1, 12)) * 4, chunking=chunking([(0, 2), (14, 18), (30, 44)], window=5))],
            macro_overlap=4, token_embeddings=True),
        "macro_no_overlap_crossing": choice(0, 3, 3) + request(
            [sequence(list(range(1, 12)) * 2, chunking=chunking([(14, 18)]))], macro_overlap=0),
        "macro_logits": choice(0, 3) + request([sequence([1] * 20)], macro_overlap=2, logits=True),
        # embedding types: binary ones answered (no ranges needed), int8 refused (no ranges here)
        "types_binary": choice(0, 3, 2) + request(
            [sequence([1, 2, 3], chunking=chunking([(0, 2)]))], normalize=True, embedding_types=[0, 3, 4]),
        "types_int8_refused": choice(0, 3) + request([sequence([1, 2])], embedding_types=[1]),
        "types_unknown": choice(0, 3) + request([sequence([1, 2])], embedding_types=[9]),
        "chunk_bad_span": choice(0, 3, 3) + request([sequence([1, 2], chunking=chunking([(1, 9)]))]),
        "chunk_over_spans": choice(0, 3, 1) + request([sequence([1, 2, 3], chunking=chunking([(0, 1), (1, 2)]))]),
        "chunk_embeddings": choice(1, 3, 2) + request([sequence(embeddings=row * 3, chunking=chunking([(0, 3)], window=2))]),
    }


# ---- fuzz_infer_request: inference.ModelInferRequest, by hand too ------------------------------

MODEL_NAMES = ["ids_head", "embeddings_only", "pad5_f16", "shared_bf16"]


def tensor(name, datatype, shape, int64s=None, int32s=None, floats=None, strings=None):
    """An InferInputTensor; typed contents when given (else the values go raw)."""
    out = field(1, 2, name.encode()) + field(2, 2, datatype.encode())
    out += field(3, 2, b"".join(varint(d) for d in shape))
    contents = b""
    if int32s is not None:
        contents += field(2, 2, b"".join(varint(v) for v in int32s))
    if int64s is not None:
        contents += field(3, 2, b"".join(varint(v) for v in int64s))
    if floats is not None:
        contents += field(6, 2, struct.pack(f"<{len(floats)}f", *floats))
    for e in strings or ():
        contents += field(8, 2, e)
    if contents:
        out += field(5, 2, contents)
    return out


def parameter(key, value):
    if isinstance(value, bool):
        v = field(1, 0, int(value))
    elif isinstance(value, int):
        v = field(2, 0, value)
    else:
        v = field(3, 2, value.encode())
    return field(4, 2, field(1, 2, key.encode()) + field(2, 2, v))


def infer(model, inputs, raw=(), outputs=(), params=(), version="", request_id="i"):
    out = field(1, 2, MODEL_NAMES[model].encode()) + field(3, 2, request_id.encode())
    if version:
        out += field(2, 2, version.encode())
    for k, v in params:
        out += parameter(k, v)
    for t in inputs:
        out += field(5, 2, t)
    for name in outputs:
        out += field(6, 2, field(1, 2, name.encode()))
    for r in raw:
        out += field(7, 2, r)
    return out


def infer_choice(model, limit, batch):
    """model and limit as choice(); batch: max_batch_size 0 (none), 1, 3, 8 (index 0-3)."""
    return bytes([model | limit << 2 | batch << 4])


def infer_seeds():
    i64 = lambda *v: struct.pack(f"<{len(v)}q", *v)  # noqa: E731
    i32 = lambda *v: struct.pack(f"<{len(v)}i", *v)  # noqa: E731
    row = [0.5, -1.0, 2.0, 0.0, 1.5, -0.25, 3.0, 1.0]
    ids = tensor("input_ids", "INT64", [2, 4])
    mask = tensor("attention_mask", "INT64", [2, 4])
    return {
        "raw_batch_with_mask": infer_choice(0, 3, 3) + infer(0, [ids, mask], raw=[
            i64(1, 2, 3, 4, 5, 6, 0, 0), i64(1, 1, 1, 1, 1, 1, 0, 0)], outputs=["embedding", "logits"]),
        "typed_int64": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 3], int64s=[3, 4, 5])]),
        "typed_int32_interior_mask": infer_choice(3, 3, 2) + infer(3, [
            tensor("input_ids", "INT32", [1, 5], int32s=[1, 2, 3, 4, 5]),
            tensor("attention_mask", "INT32", [1, 5], int32s=[1, 0, 1, 1, 0])]),
        "embeddings_trailing_mask": infer_choice(1, 3, 3) + infer(1, [
            tensor("input_embeddings", "FP32", [2, 2, 8]), tensor("attention_mask", "INT64", [2, 2])],
            raw=[struct.pack("<32f", *(row * 4)), i64(1, 1, 1, 0)], outputs=["token_embeddings"]),
        "embeddings_interior_mask": infer_choice(1, 3, 3) + infer(1, [
            tensor("input_embeddings", "FP32", [1, 2, 8]), tensor("attention_mask", "INT64", [1, 2])],
            raw=[struct.pack("<16f", *(row * 2)), i64(0, 1)]),
        "truncate_left": infer_choice(2, 3, 0) + infer(2, [tensor("input_ids", "INT64", [1, 20])],
                                                       raw=[i64(*([1] * 10 + [7] * 10))],
                                                       params=[("truncation", "left"), ("normalize", True)]),
        "too_long": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 17])], raw=[i64(*[1] * 17)]),
        "raw_size_wrong": infer_choice(0, 3, 0) + infer(0, [ids], raw=[i64(1, 2, 3)]),
        "raw_count_wrong": infer_choice(0, 3, 0) + infer(0, [ids, mask], raw=[i64(*[1] * 8)]),
        "int32_raw": infer_choice(0, 2, 1) + infer(0, [tensor("input_ids", "INT32", [1, 4])], raw=[i32(1, 2, 3, 11)]),
        "out_of_vocab": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 2])], raw=[i64(1, 12)]),
        "wrong_model": infer_choice(1, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 1])], raw=[i64(1)]),
        "wrong_version": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 1])], raw=[i64(1)],
                                                       version="2"),
        "batch_over": infer_choice(0, 3, 1) + infer(0, [ids], raw=[i64(*[1] * 8)]),
        "unknown_output": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 1])], raw=[i64(1)],
                                                        outputs=["pooled"]),
        "bad_parameter": infer_choice(0, 3, 0) + infer(0, [tensor("input_ids", "INT64", [1, 1])], raw=[i64(1)],
                                                       params=[("truncation", 3)]),
        "not_a_proto": infer_choice(0, 3, 0) + b"\xff\xff\xff\xff",
        "text_raw": infer_choice(0, 3, 3) + infer(0, [tensor("text", "BYTES", [2])], raw=[strings(b"A b.", b"e!? 1")],
                                                  outputs=["embedding", "num_tokens"]),
        "text_typed_wordpiece": infer_choice(2, 3, 0) + infer(2, [tensor("text", "BYTES", [2, 1],
                                                                         strings=[b"ab ba", b"[PAD] e"])],
                                                               params=[("truncation", "right")]),
        "text_short_raw": infer_choice(0, 3, 0) + infer(0, [tensor("text", "BYTES", [2])], raw=[strings(b"a")]),
        "text_not_utf8": infer_choice(2, 3, 0) + infer(2, [tensor("text", "BYTES", [1])], raw=[strings(b"a\xc3(")]),
    }


def strings(*elements):
    """BYTES raw contents: each element as its 4-byte little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


# ---- fuzz_batch_queue ----------------------------------------------------------------------

ARRIVE, DEADLINE, CANCEL, TAKE, COMPLETE, CLOSE = 0, 2, 3, 4, 6, 7


def limits(batch_tokens, batch_sequences, queue_tokens):
    return bytes([batch_tokens - 1, batch_sequences - 1, queue_tokens - 1])


def arrive(*lengths, embeddings=False):
    return bytes([ARRIVE, len(lengths) - 1] + [(n - 1) | (0x80 if embeddings else 0) for n in lengths])


def take():
    return bytes([TAKE])


def complete(which=0, fail=False):
    return bytes([COMPLETE, which, 0 if fail else 1])


def queue_seeds():
    return {
        "share_a_batch": limits(50, 4, 200) + arrive(10, 20) + arrive(30) + take() + take() + complete() + complete(),
        "long_sequence_alone": limits(10, 8, 255) + arrive(5) + arrive(39) + arrive(5) + take() * 3 + complete(1),
        "sequence_budget": limits(64, 2, 255) + arrive(1, 1, 1, 1) + arrive(2, embeddings=True) + take() * 3,
        "queue_full": limits(64, 8, 30) + arrive(20) + arrive(5, 6) + take() + arrive(10, 10) + complete(),
        "deadline_and_cancel": limits(40, 8, 255) + arrive(10, 10) + arrive(5) + arrive(7)
        + bytes([DEADLINE, 0, CANCEL, 1]) + take() + complete(),
        "engine_failure_mid_request": limits(20, 8, 255) + arrive(20, 20, 20) + arrive(3) + take()
        + complete(0, fail=True) + take() + take() + complete() + complete(),
        "close_then_drain": limits(16, 8, 255) + arrive(8, 8, 8) + bytes([CLOSE, 0]) + arrive(1) + take() + complete(),
        "deadline_after_partial_batch": limits(10, 8, 255) + arrive(10, 10, 10) + take()
        + bytes([DEADLINE, 0]) + take() + complete(),
    }


def http_seeds() -> dict:
    """One request for every HTTP route, on model 0 ("ids_head": ids, text, a classifier head)."""
    def req(method, path, body=None, headers=(), model=0):
        b = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        head = [f"{method} {path} HTTP/1.1", "Host: fuzz"] + list(headers)
        if body is not None:
            head += ["Content-Type: application/json", f"Content-Length: {len(b)}"]
        return bytes([0x3C | model]) + ("\r\n".join(head) + "\r\n\r\n").encode() + b

    binary_ids = struct.pack("<3q", 1, 2, 3)
    binary_header = json.dumps({"inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT64",
                                            "parameters": {"binary_data_size": len(binary_ids)}}],
                                "outputs": [{"name": "embedding", "parameters": {"binary_data": True}}]}).encode()
    return {
        "openai_text": req("POST", "/v1/embeddings", {"input": ["a b", "c"], "model": "ids_head"}),
        "openai_ids_base64": req("POST", "/v1/embeddings", {"input": [[1, 2, 3]], "encoding_format": "base64",
                                                             "dimensions": 4, "model": "alias"}),
        "openai_ubinary": req("POST", "/v1/embeddings", {"input": "a b", "embedding_type": "ubinary"}),
        "cohere_v2": req("POST", "/v2/embed", {"texts": ["a b", "c"], "input_type": "search_query",
                                               "embedding_types": ["float", "binary", "base64"]}),
        "cohere_v1": req("POST", "/v1/embed", {"texts": ["a"], "truncate": "START"}),
        "openai_prompt": req("POST", "/v1/embeddings", {"input": ["a b"], "prompt_name": "query",
                                                         "encoding_format": "float", "late_chunking": True}),
        "tei_chunks_prompt": req("POST", "/embed_chunks", {"inputs": "a b c", "prompt_name": "query",
                                                           "chunking": {"spans": [[0, 2]], "window_tokens": 2}}),
        "openai_models": req("GET", "/v1/models"),
        "openai_model": req("GET", "/v1/models/alias"),
        "tei_embed": req("POST", "/embed", {"inputs": "a b c", "normalize": False, "truncate": True,
                                            "truncation_direction": "left"}),
        "tei_embed_all": req("POST", "/embed_all", {"inputs": [[1, 2], [3]]}),
        "tei_predict": req("POST", "/predict", {"inputs": [["a"], ["b c"]], "raw_scores": True}),
        "tei_tokenize": req("POST", "/tokenize", {"inputs": ["a b"], "add_special_tokens": False}),
        "tei_root": req("POST", "/", {"inputs": "a"}),
        "tei_info": req("GET", "/info"),
        "tei_health": req("GET", "/health"),
        "kserve_server": req("GET", "/v2"),
        "kserve_live": req("GET", "/v2/health/live"),
        "kserve_ready": req("GET", "/v2/health/ready"),
        "kserve_metadata": req("GET", "/v2/models/ids_head/versions/1"),
        "kserve_config": req("GET", "/v2/models/ids_head/config"),
        "kserve_stats": req("GET", "/v2/models/ids_head/stats"),
        "kserve_infer_json": req("POST", "/v2/models/ids_head/infer",
                                 {"id": "x", "parameters": {"normalize": True},
                                  "inputs": [{"name": "input_ids", "shape": [2, 2], "datatype": "INT64",
                                              "data": [[1, 2], [3, 4]]}],
                                  "outputs": [{"name": "embedding"}, {"name": "logits"}]}),
        "kserve_infer_text": req("POST", "/v2/models/ids_head/infer",
                                 {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a b"]}]}),
        "kserve_infer_binary": req("POST", "/v2/models/ids_head/infer", binary_header + binary_ids,
                                   [f"Inference-Header-Content-Length: {len(binary_header)}"]),
        "embeddings_model": req("POST", "/v2/models/embeddings_only/infer",
                                {"inputs": [{"name": "input_embeddings", "shape": [1, 1, 8], "datatype": "FP32",
                                             "data": [0.5] * 8}]}, model=1),
        "chunked": bytes([0x3C]) + b"POST /embed HTTP/1.1\r\nHost: fuzz\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   b"e\r\n{\"inputs\":\"a\"}\r\n0\r\n\r\n",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "corpus"))
    args = ap.parse_args(argv)
    for target, seeds in (("fuzz_request", request_seeds()), ("fuzz_infer_request", infer_seeds()),
                          ("fuzz_batch_queue", queue_seeds()), ("fuzz_model_load", model_seeds()),
                          ("fuzz_http", http_seeds())):
        d = os.path.join(args.out, target)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        for name, data in seeds.items():
            with open(os.path.join(d, name), "wb") as f:
                f.write(data)
        print(f"{d}: {len(seeds)} seeds, {sum(len(v) for v in seeds.values())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Wire-format codecs that bypass protobuf message objects where that is slow or needs extra stubs.

* EncodeResponse is decoded straight from its bytes: the packed float fields become numpy arrays
  with one copy (going through the protobuf repeated field costs about 0.2 s per million floats).
  Field numbers are pinned by the API (proto/fastformer/v1/encoder.proto); unpacked encodings and
  unknown fields are handled as protobuf would.
* Input embeddings are appended to a Sequence message as a ready-made packed field.
* grpc.health.v1 HealthCheckRequest/Response are two one-field messages, coded by hand so that no
  grpcio-health-checking package is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

_F32 = np.dtype("<f4")


def varint_bytes(v: int) -> bytes:
    if v < 0:
        v += 1 << 64
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _varint(buf, pos: int) -> Tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ValueError("malformed varint")


def _fields(buf, start: int, end: int):
    """(field number, wire type, value) where value is an int (varint, fixed), or a (begin, end)
    span for length-delimited fields."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _varint(buf, pos)
        elif wt == 2:
            n, pos = _varint(buf, pos)
            v = (pos, pos + n)
            pos += n
        elif wt == 5:
            v = (pos, pos + 4)
            pos += 4
        elif wt == 1:
            v = (pos, pos + 8)
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wt} (field {num})")
        if pos > end:
            raise ValueError("truncated message")
        yield num, wt, v


class _Floats:
    """Accumulates one repeated float field (packed chunks or single unpacked values)."""
    __slots__ = ("chunks",)

    def __init__(self):
        self.chunks = []

    def add(self, buf, wt, v):
        b, e = v
        if wt not in (2, 5) or (e - b) % 4:
            raise ValueError("malformed float field")
        self.chunks.append(np.frombuffer(buf, dtype=_F32, count=(e - b) // 4, offset=b))

    def array(self) -> np.ndarray:
        if not self.chunks:
            return np.empty(0, dtype=np.float32)
        if len(self.chunks) == 1:
            return self.chunks[0].astype(np.float32)  # a writable, native-order copy
        return np.concatenate(self.chunks).astype(np.float32, copy=False)


@dataclass
class RawEncoding:
    embedding: np.ndarray
    token_embeddings: np.ndarray
    logits: np.ndarray
    num_tokens: int
    # (embedding, token begin, token end, character range (begin, end) or None)
    chunks: List[Tuple[np.ndarray, int, int, Optional[Tuple[int, int]]]] = field(default_factory=list)
    # the quantized types asked for (embedding_types): type name -> its bytes; per chunk likewise
    quantized: Dict[str, bytes] = field(default_factory=dict)
    chunks_quantized: List[Dict[str, bytes]] = field(default_factory=list)


@dataclass
class RawResponse:
    request_id: str = ""
    encodings: List[RawEncoding] = field(default_factory=list)
    queue_time_us: int = 0
    compute_time_us: int = 0
    model_name: str = ""  # the model and version that answered
    model_version: str = ""
    error: Optional[Tuple[int, str]] = None  # (code, message) of EncodeStream's in-band error


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _span(buf, v) -> Tuple[int, int]:
    """A TokenSpan: begin (field 1) and end (field 2)."""
    begin = stop = 0
    for n2, w2, v2 in _fields(buf, *v):
        if n2 == 1 and w2 == 0:
            begin = v2 & 0xFFFFFFFF
        elif n2 == 2 and w2 == 0:
            stop = v2 & 0xFFFFFFFF
    return begin, stop


QUANTIZED_FIELDS = {1: "int8", 2: "uint8", 3: "binary", 4: "ubinary"}  # QuantizedEmbedding


def _quantized(buf, v) -> Dict[str, bytes]:
    """A QuantizedEmbedding: each type's bytes."""
    out = {}
    for n2, w2, v2 in _fields(buf, *v):
        if w2 == 2 and n2 in QUANTIZED_FIELDS:
            out[QUANTIZED_FIELDS[n2]] = bytes(buf[v2[0]:v2[1]])
    return out


def _chunk(buf, start, end):
    """A Chunk: its embedding (field 1), token range (field 2), character range (field 3) and
    quantized embedding (field 4)."""
    emb = _Floats()
    tokens, chars, quantized = (0, 0), None, {}
    for num, wt, v in _fields(buf, start, end):
        if num == 1:
            emb.add(buf, wt, v)
        elif num == 2 and wt == 2:
            tokens = _span(buf, v)
        elif num == 3 and wt == 2:
            chars = _span(buf, v)
        elif num == 4 and wt == 2:
            quantized = _quantized(buf, v)
    return (emb.array(), tokens[0], tokens[1], chars), quantized


def _encoding(buf, start, end) -> RawEncoding:
    emb, tok, lg = _Floats(), _Floats(), _Floats()
    num_tokens = 0
    chunks, chunks_quantized, quantized = [], [], {}
    for num, wt, v in _fields(buf, start, end):
        if num == 1:
            emb.add(buf, wt, v)
        elif num == 2:
            tok.add(buf, wt, v)
        elif num == 3:
            lg.add(buf, wt, v)
        elif num == 4 and wt == 0:
            num_tokens = v & 0xFFFFFFFF
        elif num == 5 and wt == 2:
            chunk, q = _chunk(buf, *v)
            chunks.append(chunk)
            chunks_quantized.append(q)
        elif num == 6 and wt == 2:
            quantized = _quantized(buf, v)
    return RawEncoding(emb.array(), tok.array(), lg.array(), num_tokens, chunks, quantized, chunks_quantized)


def _string(buf, v) -> str:
    return bytes(buf[v[0]:v[1]]).decode("utf-8", errors="replace")


def decode_encode_response(data: bytes) -> RawResponse:
    """An EncodeResponse from its serialized bytes."""
    buf = memoryview(data)
    r = RawResponse()
    for num, wt, v in _fields(buf, 0, len(buf)):
        if num == 1 and wt == 2:
            r.request_id = _string(buf, v)
        elif num == 2 and wt == 2:
            r.encodings.append(_encoding(buf, *v))
        elif num == 3 and wt == 0:
            r.queue_time_us = v
        elif num == 4 and wt == 0:
            r.compute_time_us = v
        elif num == 5 and wt == 2:
            code, msg = r.error or (0, "")
            for n2, w2, v2 in _fields(buf, *v):
                if n2 == 1 and w2 == 0:
                    code = _int32(v2)
                elif n2 == 2 and w2 == 2:
                    msg = _string(buf, v2)
            r.error = (code, msg)
        elif num == 6 and wt == 2:
            r.model_name = _string(buf, v)
        elif num == 7 and wt == 2:
            r.model_version = _string(buf, v)
    return r


def packed_floats_field(field_number: int, values: np.ndarray) -> bytes:
    """The serialized packed repeated-float field `field_number` holding values (any shape)."""
    raw = np.ascontiguousarray(values, dtype=_F32).tobytes()
    return varint_bytes(field_number << 3 | 2) + varint_bytes(len(raw)) + raw


# grpc.health.v1
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
SERVING_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def encode_health_request(service: str) -> bytes:
    raw = service.encode("utf-8")
    return (b"\x0a" + varint_bytes(len(raw)) + raw) if raw else b""


def decode_health_response(data: bytes) -> str:
    status = 0
    buf = memoryview(data)
    for num, wt, v in _fields(buf, 0, len(buf)):
        if num == 1 and wt == 0:
            status = v
    return SERVING_STATUS.get(status, f"UNKNOWN({status})")

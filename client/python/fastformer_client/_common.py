"""What Client and AsyncClient share: configuration, request building, result assembly."""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import grpc
import numpy as np

from . import _wire
from ._stubs import pb
from .errors import FastformerError, Internal, InvalidArgument

__version__ = "0.1.0"

DEFAULT_TARGET = "127.0.0.1:50051"
DEFAULT_MAX_MESSAGE_BYTES = 256 << 20

_SERVICE = pb.DESCRIPTOR.services_by_name["Encoder"]


def method_path(name: str) -> str:
    """'/fastformer.v1.Encoder/Encode' from the descriptor."""
    return f"/{_SERVICE.full_name}/{_SERVICE.methods_by_name[name].name}"


_TRUNCATION = {None: 0, "none": 0, "": 0, "right": 1, "left": 2}
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def truncation_value(truncation) -> int:
    """None | "right" | "left" (any case), or the enum's number (sent as is: the server validates)."""
    if isinstance(truncation, (bool, np.bool_)):
        raise TypeError(f"truncation: expected None, 'right' or 'left', got {truncation!r}")
    if isinstance(truncation, (int, np.integer)):
        return int(truncation)
    key = truncation.lower() if isinstance(truncation, str) else truncation
    if key not in _TRUNCATION:
        raise ValueError(f"truncation: expected None, 'right' or 'left', got {truncation!r}")
    return _TRUNCATION[key]


# ----------------------------------------------------------------------------- sequences


def _ids(i: int, values) -> List[int]:
    arr = np.asarray(values)
    if arr.ndim != 1 or not (arr.dtype.kind in "iu" or arr.size == 0):
        raise TypeError(f"sequence {i}: token_ids: expected a 1-D sequence of integers, got "
                        f"{_describe(arr)}")
    if arr.size == 0:
        return []
    lo, hi = int(arr.min()), int(arr.max())
    if lo < _INT32_MIN or hi > _INT32_MAX:
        bad = int(np.flatnonzero((arr < _INT32_MIN) | (arr > _INT32_MAX))[0])
        raise InvalidArgument(f"sequence {i}: token_ids: token {bad} has id {int(arr[bad])}, which does not "
                              f"fit int32 (the wire type of token_ids)")
    return arr.astype(np.int64, copy=False).tolist()


def _embeddings(i: int, values, flat_ok: bool) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise TypeError(f"sequence {i}: input_embeddings: not a numeric array ({e})") from None
    if arr.ndim != 2 and not (flat_ok and arr.ndim == 1):
        raise TypeError(f"sequence {i}: input_embeddings: expected a 2-D [n, hidden] array, got "
                        f"{arr.ndim}-D shape {arr.shape}")
    return arr


def _describe(arr: np.ndarray) -> str:
    if arr.dtype.kind == "f" and arr.ndim == 1:
        return "a 1-D float array (token ids are integers; input embeddings are a 2-D [n, hidden] array)"
    if arr.dtype.kind in "iu" and arr.ndim == 2:
        return ("a 2-D integer array (token ids are 1-D; input embeddings are a 2-D float array; "
                "several id sequences go in a list)")
    return f"dtype {arr.dtype} shape {arr.shape}"


def _add_sequence(req, i: int, s) -> None:
    q = req.sequences.add()
    if isinstance(s, Mapping):
        unknown = set(s) - {"token_ids", "input_embeddings"}
        if unknown:
            raise TypeError(f"sequence {i}: unknown keys {sorted(unknown)} (token_ids, input_embeddings)")
        if s.get("token_ids") is not None:
            q.token_ids.extend(_ids(i, s["token_ids"]))
        if s.get("input_embeddings") is not None:
            q.MergeFromString(_wire.packed_floats_field(2, _embeddings(i, s["input_embeddings"], True)))
        return
    if isinstance(s, (str, bytes)) or np.isscalar(s):
        raise TypeError(f"sequence {i}: expected a list of token ids or a 2-D array of input embeddings, got "
                        f"{type(s).__name__} (pass a list of sequences: encode([[1, 2, 3]]))")
    arr = s if isinstance(s, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(s)
        except ValueError as e:  # ragged nested lists
            raise TypeError(f"sequence {i}: not a rectangular array ({e})") from None
    if arr.dtype == object:
        raise TypeError(f"sequence {i}: expected a list of token ids or a 2-D array of input embeddings, got "
                        f"elements of mixed or non-numeric types")
    if arr.ndim == 2 and arr.dtype.kind == "f":
        q.MergeFromString(_wire.packed_floats_field(2, arr))
    elif arr.ndim == 1 and (arr.dtype.kind in "iu" or arr.size == 0):
        q.token_ids.extend(_ids(i, arr))
    else:
        raise TypeError(f"sequence {i}: {_describe(arr)}")


def build_request(sequences, *, return_token_embeddings=False, return_logits=False, normalize=False,
                  truncation=None, request_id=None):
    """An EncodeRequest. sequences: a list of token-id sequences (lists or 1-D integer arrays),
    input embeddings (2-D float arrays [n, hidden]), or dicts {"token_ids": ..., "input_embeddings":
    ...} (input_embeddings may be flat there), mixed as needed."""
    if isinstance(sequences, (str, bytes, Mapping)) or np.isscalar(sequences):
        raise TypeError(f"sequences: expected a list of sequences, got {type(sequences).__name__}")
    req = pb.EncodeRequest(request_id="" if request_id is None else str(request_id),
                           return_token_embeddings=bool(return_token_embeddings),
                           return_logits=bool(return_logits), normalize=bool(normalize),
                           truncation=truncation_value(truncation))
    for i, s in enumerate(sequences):
        _add_sequence(req, i, s)
    return req


_REQUEST_KEYS = {"sequences", "request_id", "return_token_embeddings", "return_logits", "normalize",
                 "truncation"}


def stream_request(item, index: int, defaults: Dict[str, Any]):
    """One message of encode_stream: a list of sequences, a dict of encode() arguments (with
    "sequences" and optionally "request_id"), or an EncodeRequest. Without a request_id it gets
    str(index), its position in the stream."""
    if isinstance(item, pb.EncodeRequest):
        req = item
        if not req.request_id:
            req = pb.EncodeRequest()
            req.CopyFrom(item)
            req.request_id = str(index)
        return req
    if isinstance(item, Mapping):
        unknown = set(item) - _REQUEST_KEYS
        if unknown:
            raise TypeError(f"stream message {index}: unknown keys {sorted(unknown)} (allowed: "
                            f"{sorted(_REQUEST_KEYS)}; the deadline covers the whole stream)")
        if "sequences" not in item:
            raise TypeError(f"stream message {index}: no 'sequences'")
        kw = dict(defaults)
        kw.update(item)
    else:
        kw = dict(defaults)
        kw["sequences"] = item
    if kw.get("request_id") in (None, ""):
        kw["request_id"] = str(index)
    seqs = kw.pop("sequences")
    try:
        return build_request(seqs, **kw)
    except FastformerError as e:
        e.request_id = kw["request_id"]
        raise
    except (TypeError, ValueError) as e:
        raise type(e)(f"stream message {index} (request_id {kw['request_id']!r}): {e}") from None


# ----------------------------------------------------------------------------- results


@dataclass
class EncodeResult:
    """The answer to one request.

    embeddings        float32 [n_sequences, hidden] (L2-normalised when asked)
    token_embeddings  list of float32 [num_tokens_i, hidden], or None when not asked
    logits            float32 [n_sequences, num_labels], or None when not asked
    num_tokens        tokens of each sequence after truncation, pad tokens included
    queue_time_us, compute_time_us   the server's timings (docs/api.md)
    request_id        the request's id (EncodeStream: the message's, maybe assigned)
    """
    embeddings: np.ndarray
    token_embeddings: Optional[List[np.ndarray]]
    logits: Optional[np.ndarray]
    num_tokens: List[int]
    queue_time_us: int
    compute_time_us: int
    request_id: str = ""

    def __len__(self) -> int:
        return len(self.embeddings)


def result_from_raw(raw: _wire.RawResponse, n_sequences: Optional[int], tokens: bool, logits: bool
                    ) -> EncodeResult:
    encs = raw.encodings
    rid = raw.request_id

    def bad(msg):
        return Internal(f"malformed response: {msg}", request_id=rid or None)

    if n_sequences is not None and len(encs) != n_sequences:
        raise bad(f"{len(encs)} encodings for {n_sequences} sequences")
    hidden = len(encs[0].embedding) if encs else 0
    emb = np.empty((len(encs), hidden), dtype=np.float32)
    for i, e in enumerate(encs):
        if len(e.embedding) != hidden:
            raise bad(f"sequence {i}: embedding of {len(e.embedding)} values, sequence 0 has {hidden}")
        emb[i] = e.embedding
    tok = None
    if tokens:
        tok = []
        for i, e in enumerate(encs):
            if e.token_embeddings.size != e.num_tokens * hidden:
                raise bad(f"sequence {i}: {e.token_embeddings.size} token_embeddings values for "
                          f"{e.num_tokens} tokens of hidden size {hidden}")
            tok.append(e.token_embeddings.reshape(e.num_tokens, hidden))
    lg = None
    if logits:
        labels = len(encs[0].logits) if encs else 0
        lg = np.empty((len(encs), labels), dtype=np.float32)
        for i, e in enumerate(encs):
            if len(e.logits) != labels:
                raise bad(f"sequence {i}: {len(e.logits)} logits, sequence 0 has {labels}")
            lg[i] = e.logits
    return EncodeResult(emb, tok, lg, [e.num_tokens for e in encs], raw.queue_time_us, raw.compute_time_us, rid)


def model_info_dict(info) -> Dict[str, Any]:
    return {f.name: getattr(info, f.name) for f in info.DESCRIPTOR.fields}


# ----------------------------------------------------------------------------- configuration


def _pem(name: str, value) -> Optional[bytes]:
    """bytes as they are, a str holding PEM text, or a path (str / PathLike) to read."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str) and value.lstrip().startswith("-----BEGIN"):
        return value.encode("ascii")
    if isinstance(value, (str, os.PathLike)):
        with open(value, "rb") as f:
            return f.read()
    raise TypeError(f"{name}: expected bytes, PEM text or a file path, got {type(value).__name__}")


class _TokenFile:
    """Reads a bearer-token file, again whenever it changes (rotated tokens)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._stamp = None
        self._token = None
        self.get()  # fail early on a missing or empty file

    def get(self) -> str:
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        with self._lock:
            if stamp != self._stamp:
                with open(self.path, "r", encoding="utf-8") as f:
                    token = f.read().strip()
                if not token:
                    raise ValueError(f"token_file {self.path}: empty")
                self._token, self._stamp = token, stamp
            return self._token


class ClientConfig:
    def __init__(self, target=DEFAULT_TARGET, *, deadline_s=30.0, tls=False, root_certificates=None,
                 certificate_chain=None, private_key=None, token=None, token_file=None,
                 max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, channel_options=None):
        if token is not None and token_file is not None:
            raise ValueError("token and token_file: give one of them")
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("certificate_chain and private_key: give both (client certificate) or neither")
        self.target = target
        self.default_deadline_s = self._check_deadline(deadline_s, allow_none=True)
        self.root_certificates = _pem("root_certificates", root_certificates)
        self.certificate_chain = _pem("certificate_chain", certificate_chain)
        self.private_key = _pem("private_key", private_key)
        self.tls = bool(tls) or any(x is not None for x in (self.root_certificates, self.certificate_chain))
        if token is not None and not str(token).strip():
            raise ValueError("token: empty")
        self._token = None if token is None else str(token).strip()
        self._token_file = None if token_file is None else _TokenFile(token_file)
        if int(max_message_bytes) <= 0:
            raise ValueError(f"max_message_bytes: must be positive, got {max_message_bytes}")
        opts = {"grpc.max_receive_message_length": int(max_message_bytes),
                "grpc.max_send_message_length": int(max_message_bytes),
                "grpc.primary_user_agent": f"fastformer-client-python/{__version__}"}
        opts.update(dict(channel_options or ()))
        self.channel_options: List[Tuple[str, Any]] = list(opts.items())

    @staticmethod
    def _check_deadline(d, allow_none):
        if d is None:
            if allow_none:
                return None
            raise ValueError("deadline_s: None")
        d = float(d)
        if not d > 0:
            raise ValueError(f"deadline_s: must be positive (math.inf: none), got {d}")
        return None if math.isinf(d) else d

    def timeout(self, deadline_s) -> Optional[float]:
        """The gRPC timeout of a call: its own deadline_s, else the client's; math.inf: none."""
        if deadline_s is None:
            return self.default_deadline_s
        return self._check_deadline(deadline_s, allow_none=False)

    def credentials(self):
        return grpc.ssl_channel_credentials(root_certificates=self.root_certificates,
                                            private_key=self.private_key,
                                            certificate_chain=self.certificate_chain)

    def metadata(self) -> Optional[Tuple[Tuple[str, str], ...]]:
        token = self._token if self._token_file is None else self._token_file.get()
        return (("authorization", f"Bearer {token}"),) if token else None


STREAM_ERRORS = ("raise", "yield")


def check_stream_errors(errors: str) -> None:
    if errors not in STREAM_ERRORS:
        raise ValueError(f"errors: expected 'raise' or 'yield', got {errors!r}")


def stream_defaults(return_token_embeddings, return_logits, normalize, truncation) -> Dict[str, Any]:
    truncation_value(truncation)  # fail early
    return dict(return_token_embeddings=return_token_embeddings, return_logits=return_logits,
                normalize=normalize, truncation=truncation)


def stream_answer(raw: _wire.RawResponse, sent: Dict[str, List[Tuple[int, bool, bool]]]):
    """An EncodeResult or the typed error of one EncodeStream answer. `sent` maps each request_id
    to the (n_sequences, tokens, logits) of the messages sent with it; with a request_id used
    more than once, the answer's own contents decide."""
    from .errors import error_for
    shapes = sent.get(raw.request_id)
    if shapes and len(shapes) == 1:
        n, tokens, logits = shapes[0]
        del sent[raw.request_id]
    else:
        if shapes:
            shapes.pop()
        n = None
        tokens = any(e.token_embeddings.size for e in raw.encodings)
        logits = any(e.logits.size for e in raw.encodings)
    if raw.error is not None and raw.error[0] != 0:
        return error_for(raw.error[0], raw.error[1], raw.request_id)
    return result_from_raw(raw, n, tokens, logits)


__all__ = ["EncodeResult", "FastformerError"]

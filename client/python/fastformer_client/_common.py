"""What Client and AsyncClient share: configuration, request building, result assembly, and
every call's argument handling (ClientBase: each call is a generator of steps that a blocking
or an awaiting driver runs, so only the waiting differs between the two classes)."""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, List, Mapping, Optional, Tuple

import grpc
import numpy as np

from . import _wire
from ._stubs import pb, pb_grpc
from .errors import DeadlineExceeded, FastformerError, Internal, InvalidArgument, error_for, from_rpc_error

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


_KINDS = "text (a str), token ids (a list of ints or a 1-D integer array) or input embeddings (a 2-D float array)"


def _set_text(q, i: int, value) -> None:
    if not isinstance(value, str):
        hint = " (decode bytes to str first)" if isinstance(value, (bytes, bytearray)) else ""
        raise TypeError(f"sequence {i}: text: expected a str, got {type(value).__name__}{hint}")
    try:
        q.text = value
    except UnicodeEncodeError as e:  # lone surrogates: the wire carries UTF-8
        raise InvalidArgument(f"sequence {i}: text: not valid UTF-8 ({e.reason} at character {e.start})") from None


def _set_chunking(q, i: int, s) -> None:
    """Late chunking: a sequence dict's "spans" (token ranges [begin, end)) and server windows
    ("window_tokens", "overlap_tokens"), into Sequence.chunking."""
    spans, window, overlap = s.get("spans"), s.get("window_tokens"), s.get("overlap_tokens")
    chars, sentences = s.get("char_spans"), s.get("sentences")
    if spans is None and window is None and overlap is None and chars is None and not sentences:
        return
    for name, values, field in (("spans", spans, q.chunking.spans), ("char_spans", chars, q.chunking.char_spans)):
        for k, (b, e) in enumerate(values or []):
            if isinstance(b, bool) or isinstance(e, bool) or int(b) != b or int(e) != e or b < 0 or e < 0:
                raise TypeError(f"sequence {i}: {name}: element {k} is ({b!r}, {e!r}), expected two non-negative ints")
            span = field.add()
            span.begin, span.end = int(b), int(e)
    if sentences is not None:
        if not isinstance(sentences, bool):
            raise TypeError(f"sequence {i}: sentences: expected a bool, got {sentences!r}")
        q.chunking.sentences = sentences
    for name, value in (("window_tokens", window), ("overlap_tokens", overlap)):
        if value is not None:
            if isinstance(value, bool) or int(value) != value or value < 0:
                raise TypeError(f"sequence {i}: {name}: expected a non-negative int, got {value!r}")
            setattr(q.chunking, name, int(value))
    q.chunking.SetInParent()


def _add_sequence(req, i: int, s) -> None:
    q = req.sequences.add()
    if isinstance(s, str):
        _set_text(q, i, s)
        return
    if isinstance(s, Mapping):
        unknown = set(s) - {"token_ids", "input_embeddings", "text", "spans", "window_tokens", "overlap_tokens",
                            "char_spans", "sentences"}
        if unknown:
            raise TypeError(f"sequence {i}: unknown keys {sorted(unknown)} (token_ids, input_embeddings, text) "
                            "(late chunking: spans, char_spans, sentences, window_tokens, overlap_tokens)")
        _set_chunking(q, i, s)
        if s.get("token_ids") is not None:
            q.token_ids.extend(_ids(i, s["token_ids"]))
        if s.get("input_embeddings") is not None:
            q.MergeFromString(_wire.packed_floats_field(2, _embeddings(i, s["input_embeddings"], True)))
        if s.get("text") is not None:
            _set_text(q, i, s["text"])
        return
    if isinstance(s, (bytes, bytearray)):
        raise TypeError(f"sequence {i}: expected {_KINDS}, got {type(s).__name__} (decode text to str first)")
    if np.isscalar(s) or s is None:
        raise TypeError(f"sequence {i}: expected {_KINDS}, got {type(s).__name__} (pass a list of sequences: "
                        f"encode([[1, 2, 3]]) or encode([\"some text\"]))")
    arr = s if isinstance(s, np.ndarray) else None
    if arr is None:
        try:
            arr = np.asarray(s)
        except ValueError as e:  # ragged nested lists
            raise TypeError(f"sequence {i}: not a rectangular array ({e})") from None
    if arr.dtype == object:
        raise TypeError(f"sequence {i}: expected {_KINDS}, got elements of mixed or non-numeric types")
    if arr.dtype.kind in "US":
        raise TypeError(f"sequence {i}: a list of strings; a text is one str (encode([\"some text\", ...]))")
    if arr.ndim == 2 and arr.dtype.kind == "f":
        q.MergeFromString(_wire.packed_floats_field(2, arr))
    elif arr.ndim == 1 and (arr.dtype.kind in "iu" or arr.size == 0):
        q.token_ids.extend(_ids(i, arr))
    else:
        raise TypeError(f"sequence {i}: {_describe(arr)}")


def _routing(name: str, value) -> str:
    """model_name / model_version as the request carries them: "" for None; a version may be an int."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(f"{name}: expected a str (or an int version), got {type(value).__name__}")
    return str(value)


_CHUNK_POOLING = {"model": 0, "mean": 1}
# EmbeddingType's values, and the numpy type each quantized one decodes to (docs/api.md,
# "Embedding types": int8 and binary signed, uint8 and ubinary unsigned; binary types pack 8
# dimensions a byte).
EMBEDDING_TYPES = {"float": 0, "int8": 1, "uint8": 2, "binary": 3, "ubinary": 4}
_PRIORITIES = {"interactive": 1, "bulk": 2}  # EncodeRequest.priority (0: the model's default)
_QUANTIZED_DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}


def _embedding_types(types) -> List[int]:
    if types is None:
        return []
    if isinstance(types, str):
        types = [types]
    out = []
    for t in types:
        if t not in EMBEDDING_TYPES:
            raise ValueError(f"embedding_types: expected some of {', '.join(EMBEDDING_TYPES)}, got {t!r}")
        out.append(EMBEDDING_TYPES[t])
    return out


def build_request(sequences, *, return_token_embeddings=False, return_logits=False, normalize=False,
                  truncation=None, request_id=None, model_name=None, model_version=None, chunk_pooling="model",
                  macro_overlap_tokens=None, embedding_types=None, priority=None, prompt_name=None):
    """An EncodeRequest. sequences: a list whose items are each one kind: a text (str, tokenized
    by the server), token ids (a list or 1-D integer array), input embeddings (a 2-D float array
    [n, hidden]), or a dict {"text": ...} / {"token_ids": ...} / {"input_embeddings": ...}
    (input_embeddings may be flat there); the kinds may be mixed within a request.
    model_name / model_version: which model and version answers (None: the server's default
    model, its newest READY version)."""
    if isinstance(sequences, (str, bytes, Mapping)) or np.isscalar(sequences):
        hint = " (pass a list of texts: encode([\"some text\"]))" if isinstance(sequences, str) else ""
        raise TypeError(f"sequences: expected a list of sequences, got {type(sequences).__name__}{hint}")
    req = pb.EncodeRequest(request_id="" if request_id is None else str(request_id),
                           return_token_embeddings=bool(return_token_embeddings),
                           return_logits=bool(return_logits), normalize=bool(normalize),
                           truncation=truncation_value(truncation),
                           model_name=_routing("model_name", model_name),
                           model_version=_routing("model_version", model_version))
    if chunk_pooling not in _CHUNK_POOLING:
        raise ValueError(f"chunk_pooling: expected \"model\" or \"mean\", got {chunk_pooling!r}")
    req.chunk_pooling = _CHUNK_POOLING[chunk_pooling]
    if macro_overlap_tokens is not None:
        if isinstance(macro_overlap_tokens, bool) or not isinstance(macro_overlap_tokens, (int, np.integer)) \
                or not 0 <= int(macro_overlap_tokens) < 2**31:
            raise ValueError(f"macro_overlap_tokens: expected a non-negative integer, got {macro_overlap_tokens!r}")
        req.macro_overlap_tokens.value = int(macro_overlap_tokens)
    req.embedding_types.extend(_embedding_types(embedding_types))
    if priority is not None:
        if priority not in _PRIORITIES:
            raise ValueError(f"priority: expected \"interactive\" or \"bulk\", got {priority!r}")
        req.priority = _PRIORITIES[priority]
    if prompt_name is not None:
        if not isinstance(prompt_name, str) or not prompt_name:
            raise ValueError(f"prompt_name: expected a prompt's name (model_info()[\"prompts\"]), got {prompt_name!r}")
        req.prompt_name = prompt_name
    for i, s in enumerate(sequences):
        _add_sequence(req, i, s)
    return req


_REQUEST_KEYS = {"sequences", "request_id", "return_token_embeddings", "return_logits", "normalize",
                 "truncation", "model_name", "model_version"}


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
    num_tokens        tokens of each sequence after truncation, pad tokens included (a text:
                      the tokens the server's tokenizer made of it, special tokens included)
    queue_time_us, compute_time_us   the server's timings (docs/api.md)
    request_id        the request's id (EncodeStream: the message's, maybe assigned)
    model_name, model_version   the model and version that answered
    chunks            late chunking: per sequence, (embeddings float32 [k, hidden], token ranges
                      int64 [k, 2], character ranges int64 [k, 2] for a text, else None) of its
                      chunks (spans, character spans, sentences, windows); None when no
                      sequence was chunked
    quantized         with embedding_types: each quantized type asked for -> [n_sequences, bytes]
                      (int8 / binary as int8, uint8 / ubinary as uint8; binary types 8
                      dimensions a byte); None without
    chunks_quantized  the same per sequence for its chunks ({type: [k, bytes]}); None without
    """
    embeddings: np.ndarray
    token_embeddings: Optional[List[np.ndarray]]
    logits: Optional[np.ndarray]
    num_tokens: List[int]
    queue_time_us: int
    compute_time_us: int
    request_id: str = ""
    model_name: str = ""
    model_version: str = ""
    chunks: Optional[List[Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]]] = None
    quantized: Optional[Dict[str, np.ndarray]] = None
    chunks_quantized: Optional[List[Dict[str, np.ndarray]]] = None

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
    chunks = None
    if any(e.chunks for e in encs):
        chunks = []
        for i, e in enumerate(encs):
            rows = np.empty((len(e.chunks), hidden), dtype=np.float32)
            ranges = np.empty((len(e.chunks), 2), dtype=np.int64)
            chars = np.empty((len(e.chunks), 2), dtype=np.int64) if e.chunks and e.chunks[0][3] else None
            for k, (vec, b, end, ch) in enumerate(e.chunks):
                if len(vec) != hidden:
                    raise bad(f"sequence {i}: chunk {k} of {len(vec)} values, the embedding has {hidden}")
                rows[k], ranges[k] = vec, (b, end)
                if chars is not None:
                    chars[k] = ch or (0, 0)
            chunks.append((rows, ranges, chars))
    quantized = chunks_quantized = None
    if any(e.quantized for e in encs):
        quantized = {}
        for name, dtype in _QUANTIZED_DTYPES.items():
            if name not in encs[0].quantized:
                continue
            rows = [np.frombuffer(e.quantized.get(name, b""), dtype=dtype) for e in encs]
            if any(len(r) != len(rows[0]) for r in rows):
                raise bad(f"{name} embeddings of different sizes")
            quantized[name] = np.stack(rows)
        if chunks is not None:
            chunks_quantized = [
                {name: (np.stack([np.frombuffer(q.get(name, b""), dtype=dtype) for q in e.chunks_quantized])
                        if e.chunks_quantized else np.empty((0, 0), dtype=dtype))
                 for name, dtype in _QUANTIZED_DTYPES.items() if name in quantized}
                for e in encs]
    return EncodeResult(emb, tok, lg, [e.num_tokens for e in encs], raw.queue_time_us, raw.compute_time_us, rid,
                        raw.model_name, raw.model_version, chunks, quantized, chunks_quantized)


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


def stream_defaults(return_token_embeddings, return_logits, normalize, truncation, model_name=None,
                    model_version=None) -> Dict[str, Any]:
    truncation_value(truncation)  # fail early
    _routing("model_name", model_name)
    _routing("model_version", model_version)
    return dict(return_token_embeddings=return_token_embeddings, return_logits=return_logits,
                normalize=normalize, truncation=truncation, model_name=model_name, model_version=model_version)


def stream_answer(raw: _wire.RawResponse, sent: Dict[str, List[Tuple[int, bool, bool]]]):
    """An EncodeResult or the typed error of one EncodeStream answer. `sent` maps each request_id
    to the (n_sequences, tokens, logits) of the messages sent with it; with a request_id used
    more than once, the answer's own contents decide."""
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


class EncodeStream:
    """One encode_stream call, all but its iteration: the arguments, the requests sent (recorded
    to shape their answers), a failure of the caller's `requests` (kept; it cancels the call and
    is raised in the stream's place) and the answers."""

    def __init__(self, cfg: ClientConfig, deadline_s, errors: str, **defaults):
        check_stream_errors(errors)
        self.errors = errors
        self.defaults = stream_defaults(**defaults)
        self.timeout = cfg.timeout(deadline_s)
        self.sent: Dict[str, list] = {}
        self.failure: list = []
        self.call = None

    def message(self, item, index: int):
        req = stream_request(item, index, self.defaults)
        self.sent.setdefault(req.request_id, []).append(
            (len(req.sequences), req.return_token_embeddings, req.return_logits))
        return req

    def messages(self, requests):
        """The EncodeRequests of an iterable of requests; one that fails ends them (fail)."""
        try:
            for i, item in enumerate(requests):
                yield self.message(item, i)
        except Exception as e:  # noqa: BLE001 - handed to the consumer
            self.fail(e)

    def fail(self, e: BaseException) -> None:
        self.failure.append(e)
        if self.call is not None:
            self.call.cancel()

    def start(self, rpc, messages, metadata):
        """The call of rpc (EncodeStream) on messages; cancelled at once when `requests` failed
        before it was known (Client: they are consumed on a gRPC thread)."""
        self.call = rpc(messages, timeout=self.timeout, metadata=metadata)
        if self.failure:
            self.call.cancel()
        return self.call

    def answer(self, raw):
        """The EncodeResult of an answer; its in-band error yielded (errors="yield") or raised."""
        answer = stream_answer(raw, self.sent)
        if isinstance(answer, FastformerError) and self.errors == "raise":
            raise answer
        return answer

    def raise_failure(self) -> None:
        """Raises the failure of `requests`, if any."""
        if self.failure:
            raise self.failure[0] from None

    def rpc_failed(self, e: grpc.RpcError):
        """The stream failed: raises the failure of `requests` that caused it, else its error."""
        self.raise_failure()
        raise from_rpc_error(e) from e


# ----------------------------------------------------------------------------- the calls

# What a call's steps yield: a thunk that starts one gRPC call, or a pause. The blocking driver
# (Client) calls it and sends the result back; the awaiting one (AsyncClient) awaits it. A failed
# gRPC call is thrown back into the steps as its grpc.RpcError.
Steps = Generator[Callable[[], Any], Any, Any]


def advance(steps: Steps, value=None, error: Optional[BaseException] = None):
    """Resumes `steps` with the outcome of the thunk it yielded: (False, the next thunk), or
    (True, the call's return value) once it has finished."""
    try:
        return False, (steps.send(value) if error is None else steps.throw(error))
    except StopIteration as stop:
        return True, stop.value


def rpc_methods(channel) -> Dict[str, Any]:
    """The methods the clients call, on a grpc or a grpc.aio channel."""
    return {
        "encode": channel.unary_unary(method_path("Encode"), request_serializer=pb.EncodeRequest.SerializeToString,
                                      response_deserializer=_wire.decode_encode_response),
        "encode_stream": channel.stream_stream(method_path("EncodeStream"),
                                               request_serializer=pb.EncodeRequest.SerializeToString,
                                               response_deserializer=_wire.decode_encode_response),
        "model_info": pb_grpc.EncoderStub(channel).GetModelInfo,
        "health": channel.unary_unary(_wire.HEALTH_CHECK_METHOD, request_serializer=_wire.encode_health_request,
                                      response_deserializer=_wire.decode_health_response),
    }


class ClientBase:
    """Client and AsyncClient: configuration, channel, and each call's steps (build and check the
    request, make the gRPC call, map its failure to a FastformerError, convert the reply)."""

    _channel_api: Any = grpc  # grpc (Client) or grpc.aio (AsyncClient)
    _open_at_init = True      # AsyncClient: on first use, inside the running event loop
    _sleep: Callable[[float], Any] = staticmethod(time.sleep)

    def __init__(self, target: str = DEFAULT_TARGET, *, deadline_s: Optional[float] = 30.0, tls: bool = False,
                 root_certificates=None, certificate_chain=None, private_key=None, token: Optional[str] = None,
                 token_file=None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, channel_options=None):
        self._cfg = ClientConfig(target, deadline_s=deadline_s, tls=tls, root_certificates=root_certificates,
                                 certificate_chain=certificate_chain, private_key=private_key, token=token,
                                 token_file=token_file, max_message_bytes=max_message_bytes,
                                 channel_options=channel_options)
        self._channel = None
        self._rpcs: Dict[str, Any] = {}
        if self._open_at_init:
            self._open()

    def _open(self):
        opts = self._cfg.channel_options
        if self._cfg.tls:
            ch = self._channel_api.secure_channel(self._cfg.target, self._cfg.credentials(), options=opts)
        else:
            ch = self._channel_api.insecure_channel(self._cfg.target, options=opts)
        self._rpcs = rpc_methods(ch)
        self._channel = ch
        return ch

    @property
    def channel(self):
        """The gRPC channel (AsyncClient: opened on first use)."""
        return self._channel if self._channel is not None else self._open()

    def _rpc(self, name: str):
        _ = self.channel
        return self._rpcs[name]

    @property
    def target(self) -> str:
        return self._cfg.target

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._cfg.target!r}{', tls' if self._cfg.tls else ''})"

    def _stream(self, deadline_s, errors: str, **defaults) -> EncodeStream:
        return EncodeStream(self._cfg, deadline_s, errors, **defaults)

    # ------------------------------------------------------------------ the steps of each call
    def _unary(self, name: str, request, timeout, request_id=None, **kwargs) -> Steps:
        """One unary call: its reply, or the FastformerError of its status (health: NOT_FOUND
        is the answer "SERVICE_UNKNOWN")."""
        try:
            return (yield lambda: self._rpc(name)(request, timeout=timeout, metadata=self._cfg.metadata(),
                                                  **kwargs))
        except grpc.RpcError as e:
            if name == "health" and e.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise from_rpc_error(e, request_id) from e

    def _encode_steps(self, sequences, *, return_token_embeddings, return_logits, normalize, truncation,
                      request_id, deadline_s, return_result, model_name=None, model_version=None,
                      chunk_pooling="model", macro_overlap_tokens=None, embedding_types=None,
                      priority=None, prompt_name=None) -> Steps:
        req = build_request(sequences, return_token_embeddings=return_token_embeddings,
                            return_logits=return_logits, normalize=normalize, truncation=truncation,
                            request_id=request_id, model_name=model_name, model_version=model_version,
                            chunk_pooling=chunk_pooling, macro_overlap_tokens=macro_overlap_tokens,
                            embedding_types=embedding_types, priority=priority, prompt_name=prompt_name)
        raw = yield from self._unary("encode", req, self._cfg.timeout(deadline_s), request_id)
        if raw.error is not None and raw.error[0] != 0:
            raise error_for(raw.error[0], raw.error[1], request_id)
        res = result_from_raw(raw, len(req.sequences), req.return_token_embeddings, req.return_logits)
        if return_token_embeddings or return_logits or return_result or res.chunks is not None \
                or res.quantized is not None:
            return res
        return res.embeddings

    def _model_info_steps(self, deadline_s, model_name=None, model_version=None) -> Steps:
        req = pb.GetModelInfoRequest(model_name=_routing("model_name", model_name),
                                     model_version=_routing("model_version", model_version))
        info = yield from self._unary("model_info", req, self._cfg.timeout(deadline_s))
        return model_info_dict(info)

    def _health_steps(self, service: str, timeout, wait_for_ready: bool = False) -> Steps:
        return (yield from self._unary("health", service, timeout, wait_for_ready=wait_for_ready))

    def _wait_for_serving_steps(self, timeout_s: float, service: str) -> Steps:
        end = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{self._cfg.target} not SERVING after {timeout_s:g} s (last: {last})")
            try:
                last = yield from self._health_steps(service, min(left, 2.0), True)
                if last == "SERVING":
                    return
            except FastformerError as e:
                last = str(e)
            pause = min(0.05, max(0.0, end - time.monotonic()))
            yield lambda: self._sleep(pause)


__all__ = ["EncodeResult", "FastformerError"]

"""The blocking client."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, Optional, Sequence, Union

import grpc
import numpy as np

from ._common import ClientBase, EncodeResult, Steps, advance
from .errors import FastformerError


class Client(ClientBase):
    """A blocking client of one fastformer-server; thread-safe (one channel, shared by all calls).

    target             "host:port" (any gRPC target string)
    deadline_s         default deadline of each call, in seconds (None or math.inf: none); for
                       encode_stream it covers the whole stream
    tls                use TLS (implied by root_certificates or certificate_chain)
    root_certificates  PEM bytes, PEM text or a file path (default: the system's roots)
    certificate_chain, private_key   a client certificate (mutual TLS): PEM bytes, text or paths
    token              sent as `authorization: Bearer <token>` with every call
    token_file         the same, read from a file (re-read when it changes)
    max_message_bytes  send and receive limit of the channel (default 256 MiB: token embeddings of
                       a long document exceed gRPC's default 4 MiB)
    channel_options    extra gRPC channel arguments, [(name, value), ...]

    The arguments are handled, and the requests and replies built, in ClientBase (_common.py),
    which AsyncClient shares; here each call's steps run blocking.
    """

    @staticmethod
    def _run(steps: Steps):
        """Runs a call's steps (ClientBase), each gRPC call or pause blocking."""
        done, out = advance(steps)
        while not done:
            try:
                value = out()
            except grpc.RpcError as e:
                done, out = advance(steps, error=e)
            else:
                done, out = advance(steps, value)
        return out

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ calls
    def encode(self, sequences, *, return_token_embeddings: bool = False, return_logits: bool = False,
               normalize: bool = False, truncation: Union[None, str, int] = None,
               request_id: Optional[str] = None, deadline_s: Optional[float] = None,
               return_result: bool = False, model_name: Optional[str] = None,
               model_version: Union[None, str, int] = None,
               chunk_pooling: str = "model",
               macro_overlap_tokens: Optional[int] = None,
               embedding_types: Optional[Sequence[str]] = None,
               priority: Optional[str] = None,
               prompt_name: Optional[str] = None) -> Union[np.ndarray, EncodeResult]:
        """Encodes the sequences of one request.

        sequences: a list whose items are each a text (a str, tokenized by the server with the
        model's tokenizer.json: model_info()["accepts_text"]), token ids (a list of ints or a 1-D
        integer array), input embeddings (a 2-D float array [n, hidden]), or a dict {"text": ...}
        / {"token_ids": ...} / {"input_embeddings": ...}; kinds may be mixed within one call.
        Returns the float32 embeddings [n_sequences, hidden]; an EncodeResult instead when token
        embeddings or logits are asked for, or return_result.
        truncation: None (an over-long sequence is an error), "right" (keep the first
        max_position_embeddings tokens) or "left" (keep the last ones); a text's special tokens
        ([CLS], [SEP], ...) are kept either way.
        model_name, model_version: the model and version that should answer, on a server with a
        model repository (None: the default model, its newest READY version); the EncodeResult
        says which answered (.model_name, .model_version).
        Late chunking: a dict sequence may carry "spans" (token ranges [begin, end), special tokens
        counted) and "window_tokens" / "overlap_tokens" (the server's windows); each chunk is
        pooled from the sequence's one pass, by chunk_pooling "model" (the model's pooler over
        the chunk) or "mean", and the EncodeResult's .chunks holds them.
        macro_overlap_tokens: a sequence longer than max_position_embeddings P runs as passes of
        P tokens overlapping by this many (macro-chunks) instead of being refused; each chunk is
        pooled from the pass that holds it with the most context, and the sequence's embedding is
        the mean of its passes' (None: refused).
        embedding_types: some of "float", "int8", "uint8", "binary", "ubinary" (docs/api.md,
        "Embedding types"); the EncodeResult's .quantized holds each quantized type (and
        .embeddings the floats, empty without "float").
        priority: "interactive" (batched first) or "bulk" (fills the rest of each batch); None:
        the model's default (docs/operations.md, "Priority classes").
        prompt_name: one of the model's prompts (model_info()["prompts"]), put before every text
        (docs/api.md, "Prompts"); None: the model's default prompt, if it has one.
        Raises the FastformerError subclass of the status (InvalidArgument, ResourceExhausted, ...).
        """
        return self._run(self._encode_steps(
            sequences, return_token_embeddings=return_token_embeddings, return_logits=return_logits,
            normalize=normalize, truncation=truncation, request_id=request_id, deadline_s=deadline_s,
            return_result=return_result, model_name=model_name, model_version=model_version,
            chunk_pooling=chunk_pooling, macro_overlap_tokens=macro_overlap_tokens,
            embedding_types=embedding_types, priority=priority, prompt_name=prompt_name))

    def encode_stream(self, requests: Iterable, *, return_token_embeddings: bool = False,
                      return_logits: bool = False, normalize: bool = False, truncation=None,
                      deadline_s: Optional[float] = None, errors: str = "raise",
                      model_name: Optional[str] = None, model_version: Union[None, str, int] = None
                      ) -> Iterator[Union[EncodeResult, FastformerError]]:
        """Sends every request of `requests` on one EncodeStream and yields an EncodeResult per
        request, in completion order (match them by .request_id).

        Each request is a list of sequences (as for encode), a dict of encode() arguments
        ({"sequences": ..., "request_id": ..., "normalize": ...}; the keyword arguments here are
        the defaults), or an EncodeRequest. A request without request_id gets str(its index).
        A request that fails in-band (invalid, queue full, ...) raises its typed error carrying
        .request_id (errors="raise", which ends the stream) or is yielded as that error object
        (errors="yield"; the stream goes on). A failure of the whole stream (its deadline, an
        oversize message) raises. `requests` is consumed lazily, on a gRPC thread.
        """
        stream = self._stream(deadline_s, errors, return_token_embeddings=return_token_embeddings,
                              return_logits=return_logits, normalize=normalize, truncation=truncation,
                              model_name=model_name, model_version=model_version)
        call = stream.start(self._rpc("encode_stream"), stream.messages(requests), self._cfg.metadata())
        try:
            for raw in call:
                yield stream.answer(raw)
        except grpc.RpcError as e:
            stream.rpc_failed(e)
        finally:
            call.cancel()  # no-op once finished; ends the stream when the caller stops early
        stream.raise_failure()

    def model_info(self, *, deadline_s: Optional[float] = None, model_name: Optional[str] = None,
                   model_version: Union[None, str, int] = None) -> Dict[str, Any]:
        """The served model and the server's limits (ModelInfo as a dict: hidden_size, num_labels,
        accepts_text (the model has a tokenizer.json), tokenizer (its description), ...)."""
        return self._run(self._model_info_steps(deadline_s, model_name, model_version))

    def health(self, service: str = "", *, deadline_s: Optional[float] = None) -> str:
        """grpc.health.v1 status of `service` ("" = the server): "SERVING", "NOT_SERVING",
        "SERVICE_UNKNOWN" or "UNKNOWN". Raises (e.g. Unavailable) when the check itself fails."""
        return self._run(self._health_steps(service, self._cfg.timeout(deadline_s)))

    def wait_for_serving(self, timeout_s: float = 30.0, service: str = "") -> None:
        """Blocks until health(service) is SERVING (the server listens before its model is loaded and
        warmed up); raises DeadlineExceeded after timeout_s."""
        return self._run(self._wait_for_serving_steps(timeout_s, service))

"""The blocking client."""

from __future__ import annotations

import time
from typing import Any, Dict, Iterable, Iterator, Optional, Union

import grpc
import numpy as np

from . import _wire
from ._common import (DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_TARGET, ClientConfig, EncodeResult, build_request,
                      check_stream_errors, method_path, model_info_dict, result_from_raw, stream_answer,
                      stream_defaults, stream_request)
from ._stubs import pb, pb_grpc
from .errors import DeadlineExceeded, FastformerError, error_for, from_rpc_error


class Client:
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
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, deadline_s: Optional[float] = 30.0, tls: bool = False,
                 root_certificates=None, certificate_chain=None, private_key=None, token: Optional[str] = None,
                 token_file=None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, channel_options=None):
        self._cfg = ClientConfig(target, deadline_s=deadline_s, tls=tls, root_certificates=root_certificates,
                                 certificate_chain=certificate_chain, private_key=private_key, token=token,
                                 token_file=token_file, max_message_bytes=max_message_bytes,
                                 channel_options=channel_options)
        if self._cfg.tls:
            self.channel = grpc.secure_channel(target, self._cfg.credentials(), options=self._cfg.channel_options)
        else:
            self.channel = grpc.insecure_channel(target, options=self._cfg.channel_options)
        self._encode = self.channel.unary_unary(method_path("Encode"),
                                                request_serializer=pb.EncodeRequest.SerializeToString,
                                                response_deserializer=_wire.decode_encode_response)
        self._encode_stream = self.channel.stream_stream(method_path("EncodeStream"),
                                                         request_serializer=pb.EncodeRequest.SerializeToString,
                                                         response_deserializer=_wire.decode_encode_response)
        self._stub = pb_grpc.EncoderStub(self.channel)
        self._health = self.channel.unary_unary(_wire.HEALTH_CHECK_METHOD,
                                                request_serializer=_wire.encode_health_request,
                                                response_deserializer=_wire.decode_health_response)

    @property
    def target(self) -> str:
        return self._cfg.target

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self._cfg.target!r}{', tls' if self._cfg.tls else ''})"

    # ------------------------------------------------------------------ calls
    def encode(self, sequences, *, return_token_embeddings: bool = False, return_logits: bool = False,
               normalize: bool = False, truncation: Union[None, str, int] = None,
               request_id: Optional[str] = None, deadline_s: Optional[float] = None,
               return_result: bool = False) -> Union[np.ndarray, EncodeResult]:
        """Encodes the sequences of one request.

        sequences: a list whose items are token ids (a list of ints or a 1-D integer array),
        input embeddings (a 2-D float array [n, hidden]), or a dict {"token_ids": ...} /
        {"input_embeddings": ...}. Returns the float32 embeddings [n_sequences, hidden]; an
        EncodeResult instead when token embeddings or logits are asked for, or return_result.
        truncation: None (an over-long sequence is an error), "right" (keep the first
        max_position_embeddings tokens) or "left" (keep the last ones).
        Raises the FastformerError subclass of the status (InvalidArgument, ResourceExhausted, ...).
        """
        req = build_request(sequences, return_token_embeddings=return_token_embeddings,
                            return_logits=return_logits, normalize=normalize, truncation=truncation,
                            request_id=request_id)
        try:
            raw = self._encode(req, timeout=self._cfg.timeout(deadline_s), metadata=self._cfg.metadata())
        except grpc.RpcError as e:
            raise from_rpc_error(e, request_id) from e
        if raw.error is not None and raw.error[0] != 0:
            raise error_for(raw.error[0], raw.error[1], request_id)
        res = result_from_raw(raw, len(req.sequences), req.return_token_embeddings, req.return_logits)
        if return_token_embeddings or return_logits or return_result:
            return res
        return res.embeddings

    def encode_stream(self, requests: Iterable, *, return_token_embeddings: bool = False,
                      return_logits: bool = False, normalize: bool = False, truncation=None,
                      deadline_s: Optional[float] = None, errors: str = "raise"
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
        check_stream_errors(errors)
        defaults = stream_defaults(return_token_embeddings, return_logits, normalize, truncation)
        timeout = self._cfg.timeout(deadline_s)
        sent: Dict[str, list] = {}
        failure: list = []
        call_box: list = []

        def messages():
            try:
                for i, item in enumerate(requests):
                    req = stream_request(item, i, defaults)
                    sent.setdefault(req.request_id, []).append(
                        (len(req.sequences), req.return_token_embeddings, req.return_logits))
                    yield req
            except Exception as e:  # noqa: BLE001 - handed to the consumer
                failure.append(e)
                if call_box:
                    call_box[0].cancel()

        call = self._encode_stream(messages(), timeout=timeout, metadata=self._cfg.metadata())
        call_box.append(call)
        if failure:
            call.cancel()
        try:
            for raw in call:
                answer = stream_answer(raw, sent)
                if isinstance(answer, FastformerError) and errors == "raise":
                    raise answer
                yield answer
        except grpc.RpcError as e:
            if failure:
                raise failure[0] from None
            raise from_rpc_error(e) from e
        finally:
            call.cancel()  # no-op once finished; ends the stream when the caller stops early
        if failure:
            raise failure[0]

    def model_info(self, *, deadline_s: Optional[float] = None) -> Dict[str, Any]:
        """The served model and the server's limits (ModelInfo as a dict: hidden_size, num_labels, ...)."""
        try:
            info = self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._cfg.timeout(deadline_s),
                                           metadata=self._cfg.metadata())
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        return model_info_dict(info)

    def health(self, service: str = "", *, deadline_s: Optional[float] = None) -> str:
        """grpc.health.v1 status of `service` ("" = the server): "SERVING", "NOT_SERVING",
        "SERVICE_UNKNOWN" or "UNKNOWN". Raises (e.g. Unavailable) when the check itself fails."""
        return self._health_call(service, self._cfg.timeout(deadline_s), False)

    def _health_call(self, service, timeout, wait_for_ready) -> str:
        try:
            return self._health(service, timeout=timeout, metadata=self._cfg.metadata(),
                                wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise from_rpc_error(e) from e

    def wait_for_serving(self, timeout_s: float = 30.0, service: str = "") -> None:
        """Blocks until health(service) is SERVING (the server listens before its model is loaded and
        warmed up); raises DeadlineExceeded after timeout_s."""
        end = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{self._cfg.target} not SERVING after {timeout_s:g} s (last: {last})")
            try:
                last = self._health_call(service, min(left, 2.0), True)
                if last == "SERVING":
                    return
            except FastformerError as e:
                last = str(e)
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

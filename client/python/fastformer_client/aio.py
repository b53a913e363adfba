"""The asyncio client, on grpc.aio: the methods of Client as coroutines."""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator, Dict, Optional, Union

import grpc
import grpc.aio
import numpy as np

from . import _wire
from ._common import (DEFAULT_MAX_MESSAGE_BYTES, DEFAULT_TARGET, ClientConfig, EncodeResult, build_request,
                      check_stream_errors, method_path, model_info_dict, result_from_raw, stream_answer,
                      stream_defaults, stream_request)
from ._stubs import pb, pb_grpc
from .errors import DeadlineExceeded, FastformerError, error_for, from_rpc_error


class AsyncClient:
    """Client's asyncio twin (same arguments, same methods, awaited). The grpc.aio channel is
    opened on first use, inside the running event loop; use one AsyncClient per loop.

        async with AsyncClient("127.0.0.1:50051") as client:
            emb = await client.encode([[101, 2023, 102]])
    """

    def __init__(self, target: str = DEFAULT_TARGET, *, deadline_s: Optional[float] = 30.0, tls: bool = False,
                 root_certificates=None, certificate_chain=None, private_key=None, token: Optional[str] = None,
                 token_file=None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, channel_options=None):
        self._cfg = ClientConfig(target, deadline_s=deadline_s, tls=tls, root_certificates=root_certificates,
                                 certificate_chain=certificate_chain, private_key=private_key, token=token,
                                 token_file=token_file, max_message_bytes=max_message_bytes,
                                 channel_options=channel_options)
        self._channel = None

    @property
    def target(self) -> str:
        return self._cfg.target

    @property
    def channel(self) -> grpc.aio.Channel:
        if self._channel is None:
            opts = self._cfg.channel_options
            if self._cfg.tls:
                ch = grpc.aio.secure_channel(self._cfg.target, self._cfg.credentials(), options=opts)
            else:
                ch = grpc.aio.insecure_channel(self._cfg.target, options=opts)
            self._encode = ch.unary_unary(method_path("Encode"), request_serializer=pb.EncodeRequest.SerializeToString,
                                          response_deserializer=_wire.decode_encode_response)
            self._encode_stream = ch.stream_stream(method_path("EncodeStream"),
                                                   request_serializer=pb.EncodeRequest.SerializeToString,
                                                   response_deserializer=_wire.decode_encode_response)
            self._stub = pb_grpc.EncoderStub(ch)
            self._health = ch.unary_unary(_wire.HEALTH_CHECK_METHOD, request_serializer=_wire.encode_health_request,
                                          response_deserializer=_wire.decode_health_response)
            self._channel = ch
        return self._channel

    # ------------------------------------------------------------------ lifecycle
    async def close(self) -> None:
        if self._channel is not None:
            ch, self._channel = self._channel, None
            await ch.close()

    async def __aenter__(self) -> "AsyncClient":
        _ = self.channel
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncClient({self._cfg.target!r}{', tls' if self._cfg.tls else ''})"

    # ------------------------------------------------------------------ calls
    async def encode(self, sequences, *, return_token_embeddings: bool = False, return_logits: bool = False,
                     normalize: bool = False, truncation: Union[None, str, int] = None,
                     request_id: Optional[str] = None, deadline_s: Optional[float] = None,
                     return_result: bool = False) -> Union[np.ndarray, EncodeResult]:
        """See Client.encode."""
        req = build_request(sequences, return_token_embeddings=return_token_embeddings,
                            return_logits=return_logits, normalize=normalize, truncation=truncation,
                            request_id=request_id)
        _ = self.channel
        try:
            raw = await self._encode(req, timeout=self._cfg.timeout(deadline_s), metadata=self._cfg.metadata())
        except grpc.RpcError as e:
            raise from_rpc_error(e, request_id) from e
        if raw.error is not None and raw.error[0] != 0:
            raise error_for(raw.error[0], raw.error[1], request_id)
        res = result_from_raw(raw, len(req.sequences), req.return_token_embeddings, req.return_logits)
        if return_token_embeddings or return_logits or return_result:
            return res
        return res.embeddings

    async def encode_stream(self, requests, *, return_token_embeddings: bool = False, return_logits: bool = False,
                            normalize: bool = False, truncation=None, deadline_s: Optional[float] = None,
                            errors: str = "raise") -> AsyncIterator[Union[EncodeResult, FastformerError]]:
        """See Client.encode_stream; `requests` may be an iterable or an async iterable.

            async for result in client.encode_stream(requests):
                ...
        """
        check_stream_errors(errors)
        defaults = stream_defaults(return_token_embeddings, return_logits, normalize, truncation)
        timeout = self._cfg.timeout(deadline_s)
        sent: Dict[str, list] = {}
        failure: list = []
        call_box: list = []

        def record(item, i):
            req = stream_request(item, i, defaults)
            sent.setdefault(req.request_id, []).append(
                (len(req.sequences), req.return_token_embeddings, req.return_logits))
            return req

        async def messages():
            try:
                if hasattr(requests, "__aiter__"):
                    i = 0
                    async for item in requests:
                        yield record(item, i)
                        i += 1
                else:
                    for i, item in enumerate(requests):
                        yield record(item, i)
            except Exception as e:  # noqa: BLE001 - handed to the consumer
                failure.append(e)
                if call_box:
                    call_box[0].cancel()

        _ = self.channel
        call = self._encode_stream(messages(), timeout=timeout, metadata=self._cfg.metadata())
        call_box.append(call)
        try:
            async for raw in call:
                answer = stream_answer(raw, sent)
                if isinstance(answer, FastformerError) and errors == "raise":
                    raise answer
                yield answer
        except asyncio.CancelledError:
            if failure:
                raise failure[0] from None
            raise
        except grpc.RpcError as e:
            if failure:
                raise failure[0] from None
            raise from_rpc_error(e) from e
        finally:
            call.cancel()
        if failure:
            raise failure[0]

    async def model_info(self, *, deadline_s: Optional[float] = None) -> Dict[str, Any]:
        """See Client.model_info."""
        _ = self.channel
        try:
            info = await self._stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=self._cfg.timeout(deadline_s),
                                                 metadata=self._cfg.metadata())
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
        return model_info_dict(info)

    async def health(self, service: str = "", *, deadline_s: Optional[float] = None) -> str:
        """See Client.health."""
        return await self._health_call(service, self._cfg.timeout(deadline_s), False)

    async def _health_call(self, service, timeout, wait_for_ready) -> str:
        _ = self.channel
        try:
            return await self._health(service, timeout=timeout, metadata=self._cfg.metadata(),
                                      wait_for_ready=wait_for_ready)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise from_rpc_error(e) from e

    async def wait_for_serving(self, timeout_s: float = 30.0, service: str = "") -> None:
        """See Client.wait_for_serving."""
        end = time.monotonic() + timeout_s
        last = "no answer"
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise DeadlineExceeded(f"{self._cfg.target} not SERVING after {timeout_s:g} s (last: {last})")
            try:
                last = await self._health_call(service, min(left, 2.0), True)
                if last == "SERVING":
                    return
            except FastformerError as e:
                last = str(e)
            await asyncio.sleep(min(0.05, max(0.0, end - time.monotonic())))

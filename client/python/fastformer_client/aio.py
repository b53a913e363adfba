"""The asyncio client, on grpc.aio: the methods of Client as coroutines."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Dict, Optional, Sequence, Union

import grpc
import grpc.aio
import numpy as np

from ._common import ClientBase, EncodeResult, Steps, advance
from .errors import FastformerError


class AsyncClient(ClientBase):
    """Client's asyncio twin (same arguments, same methods, awaited). The grpc.aio channel is
    opened on first use, inside the running event loop; use one AsyncClient per loop.

        async with AsyncClient("127.0.0.1:50051") as client:
            emb = await client.encode([[101, 2023, 102]])

    The arguments are handled, and the requests and replies built, in ClientBase (_common.py),
    which Client shares; here each call's steps are awaited.
    """

    _channel_api = grpc.aio
    _open_at_init = False
    _sleep = staticmethod(asyncio.sleep)

    @staticmethod
    async def _run(steps: Steps):
        """Runs a call's steps (ClientBase), each gRPC call or pause awaited."""
        done, out = advance(steps)
        while not done:
            try:
                value = await out()
            except grpc.RpcError as e:
                done, out = advance(steps, error=e)
            else:
                done, out = advance(steps, value)
        return out

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

    # ------------------------------------------------------------------ calls
    async def encode(self, sequences, *, return_token_embeddings: bool = False, return_logits: bool = False,
                     normalize: bool = False, truncation: Union[None, str, int] = None,
                     request_id: Optional[str] = None, deadline_s: Optional[float] = None,
                     return_result: bool = False, model_name: Optional[str] = None,
                     model_version: Union[None, str, int] = None,
                     chunk_pooling: str = "model",
                     macro_overlap_tokens: Optional[int] = None,
                     embedding_types: Optional[Sequence[str]] = None,
                     priority: Optional[str] = None,
                     prompt_name: Optional[str] = None) -> Union[np.ndarray, EncodeResult]:
        """See Client.encode."""
        return await self._run(self._encode_steps(
            sequences, return_token_embeddings=return_token_embeddings, return_logits=return_logits,
            normalize=normalize, truncation=truncation, request_id=request_id, deadline_s=deadline_s,
            return_result=return_result, model_name=model_name, model_version=model_version,
            chunk_pooling=chunk_pooling, macro_overlap_tokens=macro_overlap_tokens,
            embedding_types=embedding_types, priority=priority, prompt_name=prompt_name))

    async def encode_stream(self, requests, *, return_token_embeddings: bool = False, return_logits: bool = False,
                            normalize: bool = False, truncation=None, deadline_s: Optional[float] = None,
                            errors: str = "raise", model_name: Optional[str] = None,
                            model_version: Union[None, str, int] = None) -> AsyncIterator[Union[EncodeResult, FastformerError]]:
        """See Client.encode_stream; `requests` may be an iterable or an async iterable.

            async for result in client.encode_stream(requests):
                ...
        """
        stream = self._stream(deadline_s, errors, return_token_embeddings=return_token_embeddings,
                              return_logits=return_logits, normalize=normalize, truncation=truncation,
                              model_name=model_name, model_version=model_version)

        async def messages():
            if not hasattr(requests, "__aiter__"):
                for req in stream.messages(requests):
                    yield req
                return
            try:
                i = 0
                async for item in requests:
                    yield stream.message(item, i)
                    i += 1
            except Exception as e:  # noqa: BLE001 - handed to the consumer
                stream.fail(e)

        call = stream.start(self._rpc("encode_stream"), messages(), self._cfg.metadata())
        try:
            async for raw in call:
                yield stream.answer(raw)
        except grpc.RpcError as e:
            stream.rpc_failed(e)
        except asyncio.CancelledError:
            stream.raise_failure()
            raise
        finally:
            call.cancel()
        stream.raise_failure()

    async def model_info(self, *, deadline_s: Optional[float] = None, model_name: Optional[str] = None,
                         model_version: Union[None, str, int] = None) -> Dict[str, Any]:
        """See Client.model_info."""
        return await self._run(self._model_info_steps(deadline_s, model_name, model_version))

    async def health(self, service: str = "", *, deadline_s: Optional[float] = None) -> str:
        """See Client.health."""
        return await self._run(self._health_steps(service, self._cfg.timeout(deadline_s)))

    async def wait_for_serving(self, timeout_s: float = 30.0, service: str = "") -> None:
        """See Client.wait_for_serving."""
        return await self._run(self._wait_for_serving_steps(timeout_s, service))

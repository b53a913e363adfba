"""Typed errors: one class per gRPC status code the server uses (docs/api.md, "Status codes").

Every error is a FastformerError carrying `.code` (grpc.StatusCode), `.details` (the server's
message) and `.request_id` (set for the in-band errors of EncodeStream, else None). Codes without
a class of their own (NOT_FOUND, UNKNOWN, ...) raise FastformerError itself.
"""

from __future__ import annotations

from typing import Optional, Union

import grpc

_CODE_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def status_code(code: Union[grpc.StatusCode, int]) -> grpc.StatusCode:
    """A grpc.StatusCode from itself or its number (as in EncodeResponse.error.code)."""
    if isinstance(code, grpc.StatusCode):
        return code
    return _CODE_BY_NUMBER.get(int(code), grpc.StatusCode.UNKNOWN)


class FastformerError(Exception):
    """A failed call: `.code` (grpc.StatusCode), `.details` (str), `.request_id` (str or None)."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, code: Union[grpc.StatusCode, int], message: str = "", *,
                 request_id: Optional[str] = None):
        self.code = status_code(code)
        self.details = message
        self.request_id = request_id
        super().__init__(self.code, message)

    @property
    def message(self) -> str:
        return self.details

    def __str__(self) -> str:
        rid = f" [request_id {self.request_id!r}]" if self.request_id is not None else ""
        return f"{self.code.name}: {self.details}{rid}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code.name}, {self.details!r}, request_id={self.request_id!r})"

    def __reduce__(self):
        return (error_for, (self.code.value[0], self.details, self.request_id))


class _Typed(FastformerError):
    """A FastformerError whose code is fixed by the class: `InvalidArgument(message)`."""

    def __init__(self, message: str = "", *, request_id: Optional[str] = None):
        super().__init__(type(self).code, message, request_id=request_id)


class InvalidArgument(_Typed):
    """The request can never succeed; the message names the field and, for a sequence, its index."""
    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(_Typed):
    """The queue is full (retry with backoff), or the message is over the size limit (split it)."""
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(_Typed):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(_Typed):
    """The server is starting, draining or unreachable; retry after a moment."""
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(_Typed):
    code = grpc.StatusCode.CANCELLED


class Internal(_Typed):
    """The engine failed on a batch (the server keeps serving), or the response was malformed."""
    code = grpc.StatusCode.INTERNAL


class Unauthenticated(_Typed):
    code = grpc.StatusCode.UNAUTHENTICATED


_CLASS_BY_CODE = {cls.code: cls for cls in (InvalidArgument, ResourceExhausted, DeadlineExceeded, Unavailable,
                                           Cancelled, Internal, Unauthenticated)}


def error_for(code: Union[grpc.StatusCode, int], message: str = "", request_id: Optional[str] = None
              ) -> FastformerError:
    """The typed error for a status code (a number or a grpc.StatusCode)."""
    code = status_code(code)
    cls = _CLASS_BY_CODE.get(code)
    if cls is None:
        return FastformerError(code, message, request_id=request_id)
    return cls(message, request_id=request_id)


def from_rpc_error(e: grpc.RpcError, request_id: Optional[str] = None) -> FastformerError:
    """The typed error for a failed call (grpc.RpcError or grpc.aio.AioRpcError)."""
    try:
        code, details = e.code(), e.details()
    except Exception:  # noqa: BLE001 - an RpcError that is not a Call
        code, details = grpc.StatusCode.UNKNOWN, str(e)
    return error_for(code if code is not None else grpc.StatusCode.UNKNOWN, details or "", request_id)


__all__ = ["FastformerError", "InvalidArgument", "ResourceExhausted", "DeadlineExceeded", "Unavailable",
           "Cancelled", "Internal", "Unauthenticated", "error_for", "from_rpc_error", "status_code"]

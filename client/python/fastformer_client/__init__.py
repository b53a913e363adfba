"""fastformer_client: Python client of fastformer-server (the fastformer.v1.Encoder gRPC API).

    from fastformer_client import Client
    with Client("127.0.0.1:50051") as client:
        emb = client.encode([[101, 2023, 2003, 102], [101, 7592, 102]])   # float32 [2, hidden]
        emb = client.encode(["some text", "more text"])   # when model_info()["accepts_text"]

Client (blocking) and AsyncClient (asyncio, grpc.aio) have the same methods: encode,
encode_stream, model_info, health, wait_for_serving. Failed calls raise a FastformerError
subclass (InvalidArgument, ResourceExhausted, DeadlineExceeded, Unavailable, Cancelled, Internal,
Unauthenticated) carrying .code (grpc.StatusCode) and .details. See README.md.
"""

from ._common import __version__, EncodeResult
from ._stubs import pb as encoder_pb2, pb_grpc as encoder_pb2_grpc
from .aio import AsyncClient
from .client import Client
from .errors import (Cancelled, DeadlineExceeded, FastformerError, Internal, InvalidArgument, ResourceExhausted,
                     Unauthenticated, Unavailable)

__all__ = ["Client", "AsyncClient", "EncodeResult", "FastformerError", "InvalidArgument", "ResourceExhausted",
           "DeadlineExceeded", "Unavailable", "Cancelled", "Internal", "Unauthenticated", "encoder_pb2",
           "encoder_pb2_grpc", "__version__"]

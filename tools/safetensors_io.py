#!/usr/bin/env python3
"""Minimal safetensors reader/writer (no dependency on the `safetensors` package).

File layout (https://github.com/huggingface/safetensors, "Format"):

    [8 bytes]  N, little-endian uint64: size of the JSON header
    [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                      ..., "__metadata__": {"format": "pt"}}
    [rest]     tensor data, little-endian, row-major; offsets are relative to the
               first byte after the header.

What this writer does beyond the minimum (all of it still valid safetensors):
  * tensors are laid out in sorted-name order;
  * the header is padded with spaces so that the data section starts at a file
    offset that is a multiple of 64 (hence N is a multiple of 8);
  * every tensor's data starts at a multiple of 64 bytes (relative to the data
    section, and therefore also absolute in the file); the gaps are zero bytes,
    so data_offsets are not contiguous but are in range and non-overlapping.

Supported dtypes: F32, F16, BF16 (the model formats), plus F64, I64, I32, I16,
I8, U8, BOOL for completeness.  bfloat16 data is moved as raw 16-bit words.

Public API:
    write_safetensors(path, tensors, metadata=None) -> int   (bytes written)
    read_safetensors(path) -> dict[str, torch.Tensor]
    read_safetensors_with_metadata(path) -> (dict[str, torch.Tensor], dict)
    read_header(path) -> (header_dict, data_start)
"""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch

ALIGN = 64
MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype tag -> (torch dtype, little-endian numpy dtype used for the bytes)
_DTYPES = {
    "F64": (torch.float64, np.dtype("<f8")),
    "F32": (torch.float32, np.dtype("<f4")),
    "F16": (torch.float16, np.dtype("<f2")),
    "BF16": (torch.bfloat16, np.dtype("<u2")),  # raw 16-bit words
    "I64": (torch.int64, np.dtype("<i8")),
    "I32": (torch.int32, np.dtype("<i4")),
    "I16": (torch.int16, np.dtype("<i2")),
    "I8": (torch.int8, np.dtype("i1")),
    "U8": (torch.uint8, np.dtype("u1")),
    "BOOL": (torch.bool, np.dtype("?")),
}
_TORCH_TO_TAG = {v[0]: k for k, v in _DTYPES.items()}


class SafetensorsError(ValueError):
    """A malformed safetensors file or an unsupported tensor."""


def dtype_tag(dtype: torch.dtype) -> str:
    try:
        return _TORCH_TO_TAG[dtype]
    except KeyError:
        raise SafetensorsError(f"unsupported tensor dtype {dtype}") from None


def _round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def _tensor_to_numpy_le(t: torch.Tensor) -> np.ndarray:
    """The tensor's data as a contiguous little-endian numpy array (no copy when possible)."""
    t = t.detach().cpu().contiguous()
    tag = dtype_tag(t.dtype)
    np_dtype = _DTYPES[tag][1]
    if t.dtype == torch.bfloat16:
        arr = t.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = t.numpy()
    if arr.dtype != np_dtype:  # only differs in byte order on big-endian hosts
        arr = arr.astype(np_dtype)
    return np.ascontiguousarray(arr).reshape(-1)


def write_safetensors(path, tensors: Mapping[str, torch.Tensor],
                      metadata: Optional[Mapping[str, str]] = None) -> int:
    """Write `tensors` to `path`; returns the file size in bytes."""
    if metadata is None:
        metadata = {"format": "pt"}
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SafetensorsError("__metadata__ must map strings to strings")
    names = sorted(tensors)
    header: Dict[str, object] = {"__metadata__": dict(metadata)}
    layout = []
    offset = 0
    for name in names:
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is not a valid tensor name")
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise SafetensorsError(f"{name}: not a tensor ({type(t).__name__})")
        tag = dtype_tag(t.dtype)
        nbytes = t.numel() * t.element_size()
        begin = _round_up(offset, ALIGN)
        end = begin + nbytes
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [begin, end]}
        layout.append((name, begin, end))
        offset = end
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    # pad with spaces so that 8 + N is a multiple of ALIGN (N is then a multiple of 8)
    n = _round_up(8 + len(hjson), ALIGN) - 8
    hjson = hjson + b" " * (n - len(hjson))
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", n))
        f.write(hjson)
        pos = 0
        for name, begin, end in layout:
            if begin > pos:
                f.write(b"\0" * (begin - pos))
            arr = _tensor_to_numpy_le(tensors[name])
            if arr.nbytes != end - begin:
                raise SafetensorsError(f"{name}: internal size mismatch")
            f.write(memoryview(arr).cast("B"))
            pos = end
    os.replace(tmp, path)
    return 8 + n + offset


def read_header(path) -> Tuple[dict, int]:
    """Parse and validate the header; returns (header dict, absolute data start)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise SafetensorsError(f"{path}: file too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or 8 + n > size:
            raise SafetensorsError(f"{path}: header size {n} is out of range (file is {size} bytes)")
        hbytes = f.read(n)
    try:
        header = json.loads(hbytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    data_len = size - 8 - n
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict):
                raise SafetensorsError(f"{path}: __metadata__ is not an object")
            continue
        if not isinstance(info, dict) or set(info) - {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError(f"{path}: {name}: bad tensor entry {info!r}")
        tag = info.get("dtype")
        shape = info.get("shape")
        offs = info.get("data_offsets")
        if tag not in _DTYPES:
            raise SafetensorsError(f"{path}: {name}: unsupported dtype {tag!r}")
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise SafetensorsError(f"{path}: {name}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs)
                or not 0 <= offs[0] <= offs[1] <= data_len):
            raise SafetensorsError(f"{path}: {name}: data_offsets {offs!r} out of range "
                                   f"(data section is {data_len} bytes)")
        numel = 1
        for s in shape:
            numel *= s
        expect = numel * _DTYPES[tag][1].itemsize
        if offs[1] - offs[0] != expect:
            raise SafetensorsError(f"{path}: {name}: data_offsets span {offs[1] - offs[0]} bytes, "
                                   f"shape {shape} of {tag} needs {expect}")
        spans.append((offs[0], offs[1], name))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise SafetensorsError(f"{path}: tensors {n0} and {n1} overlap")
    return header, 8 + n


def read_safetensors_with_metadata(path) -> Tuple[Dict[str, torch.Tensor], dict]:
    header, data_start = read_header(path)
    out: Dict[str, torch.Tensor] = {}
    with open(path, "rb") as f:
        for name in sorted(k for k in header if k != "__metadata__"):
            info = header[name]
            tdtype, npdtype = _DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            f.seek(data_start + begin)
            count = (end - begin) // npdtype.itemsize
            arr = np.fromfile(f, dtype=npdtype, count=count)
            if arr.size != count:
                raise SafetensorsError(f"{path}: {name}: truncated data")
            arr = arr.astype(npdtype.newbyteorder("="), copy=False)
            if info["dtype"] == "BF16":
                t = torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(arr)
            out[name] = t.reshape(info["shape"])
    return out, dict(header.get("__metadata__", {}))


def read_safetensors(path) -> Dict[str, torch.Tensor]:
    return read_safetensors_with_metadata(path)[0]


if __name__ == "__main__":  # tiny inspector: safetensors_io.py FILE
    if len(sys.argv) != 2:
        print("usage: safetensors_io.py FILE.safetensors", file=sys.stderr)
        sys.exit(2)
    h, start = read_header(sys.argv[1])
    print(f"data starts at byte {start}; metadata {h.get('__metadata__', {})}")
    for k in sorted(x for x in h if x != "__metadata__"):
        print(f"{k:70s} {h[k]['dtype']:5s} {h[k]['shape']} {h[k]['data_offsets']}")

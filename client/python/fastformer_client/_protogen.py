"""Generates the Python stubs of proto/fastformer/v1/encoder.proto.

Used by setup.py at build time (the generated modules go into the wheel as
`fastformer_client._generated`) and by `_stubs.py` at import time when the package runs from a
source tree (they go into a per-user cache directory). Standard library only, so setup.py can
load this file before grpcio or numpy are importable.

The generator is `python -m grpc_tools.protoc` when grpc_tools is importable, else `protoc`
with `grpc_python_plugin` from PATH. The output is flattened into one directory holding
`__init__.py`, `encoder_pb2.py` and `encoder_pb2_grpc.py`, the latter importing the former
relatively. The descriptor keeps its file name `fastformer/v1/encoder.proto`, so these modules
coexist with stubs that other code generated from the same file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional

PROTO_REL = Path("fastformer") / "v1" / "encoder.proto"
PROTO_ENV = "FASTFORMER_PROTO_PATH"
# Bump when the layout of the generated directory changes (part of the source-tree cache key).
LAYOUT_VERSION = "1"


class ProtoGenError(RuntimeError):
    pass


def proto_root_from_env() -> Optional[Path]:
    """$FASTFORMER_PROTO_PATH: the include root holding fastformer/v1/encoder.proto, or that file."""
    value = os.environ.get(PROTO_ENV)
    if not value:
        return None
    p = Path(value).expanduser()
    if p.is_file() and p.name == PROTO_REL.name:
        return p.resolve().parents[len(PROTO_REL.parts) - 1]
    if (p / PROTO_REL).is_file():
        return p.resolve()
    raise ProtoGenError(f"{PROTO_ENV}={value!r}: neither {PROTO_REL} under it nor that file itself")


def find_proto_root(candidates: Iterable[Path]) -> Optional[Path]:
    """The include root for protoc: $FASTFORMER_PROTO_PATH, else the first candidate that holds
    fastformer/v1/encoder.proto."""
    root = proto_root_from_env()
    if root is not None:
        return root
    for c in candidates:
        if (Path(c) / PROTO_REL).is_file():
            return Path(c).resolve()
    return None


def _generator() -> List[str]:
    if importlib.util.find_spec("grpc_tools") is not None:
        return [sys.executable, "-m", "grpc_tools.protoc"]
    protoc = shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if protoc and plugin:
        return [protoc, f"--plugin=protoc-gen-grpc_python={plugin}"]
    raise ProtoGenError("cannot generate the gRPC stubs: neither grpc_tools (pip: grpcio-tools, Debian: "
                        "python3-grpc-tools) nor protoc with grpc_python_plugin (Debian: protobuf-compiler, "
                        "protobuf-compiler-grpc) is available")


def generator_id() -> str:
    """Identifies the generator, for the source-tree cache key."""
    cmd = _generator()
    if cmd[0] == sys.executable:
        try:
            from importlib.metadata import version
            return "grpc_tools " + version("grpcio-tools")
        except Exception:  # noqa: BLE001 - metadata missing: fall back to the module path
            return "grpc_tools " + str(importlib.util.find_spec("grpc_tools").origin)
    return " ".join(cmd)


def cache_key(proto_root: Path) -> str:
    h = hashlib.sha256()
    h.update((proto_root / PROTO_REL).read_bytes())
    h.update(f"\0{generator_id()}\0{LAYOUT_VERSION}\0{sys.version_info[:2]}".encode())
    try:
        from importlib.metadata import version
        h.update(version("protobuf").encode())
    except Exception:  # noqa: BLE001
        pass
    return h.hexdigest()[:20]


_GRPC_IMPORT = re.compile(r"^from fastformer\.v1 import encoder_pb2 as ", re.M)


def generate(proto_root: Path, out_dir: Path) -> None:
    """Writes __init__.py, encoder_pb2.py and encoder_pb2_grpc.py into out_dir (created)."""
    proto_root = Path(proto_root)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fastformer-protoc-") as tmp:
        cmd = _generator() + [f"-I{proto_root}", f"--python_out={tmp}", f"--grpc_python_out={tmp}",
                              PROTO_REL.as_posix()]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise ProtoGenError(f"stub generation failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr}")
        gen = Path(tmp) / PROTO_REL.parent
        pb2 = (gen / "encoder_pb2.py").read_text(encoding="utf-8")
        grpc_src = (gen / "encoder_pb2_grpc.py").read_text(encoding="utf-8")
    grpc_src, n = _GRPC_IMPORT.subn("from . import encoder_pb2 as ", grpc_src)
    if n != 1:
        raise ProtoGenError("unexpected encoder_pb2_grpc.py from the generator: no "
                            "'from fastformer.v1 import encoder_pb2' line to make relative")
    (out_dir / "encoder_pb2.py").write_text(pb2, encoding="utf-8")
    (out_dir / "encoder_pb2_grpc.py").write_text(grpc_src, encoding="utf-8")
    (out_dir / "__init__.py").write_text(
        f'"""Generated from {PROTO_REL.as_posix()} by {generator_id()}. DO NOT EDIT."""\n', encoding="utf-8")

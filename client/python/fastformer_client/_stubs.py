"""The generated protobuf and gRPC modules: `pb` (encoder_pb2) and `pb_grpc` (encoder_pb2_grpc).

An installed package carries them as `fastformer_client._generated` (setup.py's build_py runs
the generator; nothing generated is committed). Imported from a source tree, where that
subpackage does not exist, they are generated on first import from the .proto file, found at
$FASTFORMER_PROTO_PATH (the include root, or the file itself), else at <repo>/proto relative to
this file (or <sdist>/proto), into a per-user cache directory:

    $XDG_CACHE_HOME/fastformer_client/stubs-<key>     (default ~/.cache/fastformer_client/...)
    <tempdir>/fastformer_client-<uid>/stubs-<key>     when the former is not writable

<key> hashes the .proto, the generator and the protobuf version, so an edited .proto or another
runtime regenerates. Either way the modules are importable as `fastformer_client._generated.*`.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

from . import _protogen

_PKG = __name__.rsplit(".", 1)[0]
_GEN = _PKG + "._generated"
_HERE = Path(__file__).resolve().parent


def _cache_roots():
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    yield Path(xdg) / "fastformer_client"
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    yield Path(tempfile.gettempdir()) / f"fastformer_client-{uid}"


def _private_dir(root: Path) -> bool:
    """Creates root (mode 0700) if needed; True when it is ours and not writable by others (the
    cache holds code that we import)."""
    try:
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = root.stat()
        if hasattr(os, "getuid") and st.st_uid != os.getuid():
            return False
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
        return os.access(root, os.W_OK)
    except OSError:
        return False


def _generate_into_cache(proto_root: Path) -> Path:
    key = _protogen.cache_key(proto_root)
    errors = []
    for root in _cache_roots():
        if not _private_dir(root):
            errors.append(f"{root}: not a private writable directory")
            continue
        final = root / f"stubs-{key}"
        if (final / "encoder_pb2_grpc.py").is_file():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-stubs-", dir=root))
        try:
            _protogen.generate(proto_root, tmp)
            try:
                os.rename(tmp, final)
            except OSError:  # another process got there first
                if not (final / "encoder_pb2_grpc.py").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final
    raise ImportError("fastformer_client: no cache directory for the generated stubs: " + "; ".join(errors))


def _load():
    if importlib.util.find_spec(_GEN) is None:
        try:
            proto_root = _protogen.find_proto_root([_HERE.parents[2] / "proto", _HERE.parent / "proto"])
        except _protogen.ProtoGenError as e:
            raise ImportError(f"fastformer_client: {e}") from None
        if proto_root is None:
            raise ImportError(
                "fastformer_client: the generated stubs are missing (this is not an installed package) and "
                f"{_protogen.PROTO_REL} was not found next to it; install the package "
                f"(pip install ./client/python) or set {_protogen.PROTO_ENV} to the directory holding "
                f"{_protogen.PROTO_REL.parts[0]}/")
        try:
            gen_dir = _generate_into_cache(proto_root)
        except _protogen.ProtoGenError as e:
            raise ImportError(f"fastformer_client: {e}") from None
        spec = importlib.util.spec_from_file_location(_GEN, gen_dir / "__init__.py",
                                                      submodule_search_locations=[str(gen_dir)])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[_GEN] = mod
        try:
            spec.loader.exec_module(mod)
        except BaseException:
            del sys.modules[_GEN]
            raise
    return importlib.import_module(_GEN + ".encoder_pb2"), importlib.import_module(_GEN + ".encoder_pb2_grpc")


pb, pb_grpc = _load()

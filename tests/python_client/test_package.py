"""Packaging of client/python: `pip install` generates the stubs at build time (nothing generated in
the tree), the installed package works against a real server; the source tree generates its stubs
into the cache on first import (from the repository's proto/ or $FASTFORMER_PROTO_PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PY_CLIENT = REPO / "client" / "python"
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FASTFORMER_PROTO_PATH")}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _copy_checkout(dst: Path) -> Path:
    """client/python and proto/ in the repository's layout (pip builds in-tree: keep the real tree
    clean of build/ and *.egg-info)."""
    ignore = shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__", "_generated")
    shutil.copytree(PY_CLIENT, dst / "client" / "python", ignore=ignore)
    shutil.copytree(REPO / "proto", dst / "proto")
    return dst / "client" / "python"


def test_no_generated_code_in_the_tree():
    tracked = subprocess.run(["git", "ls-files", "client/python"], cwd=REPO, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    names = tracked.stdout.split()
    assert not [n for n in names if n.endswith(("_pb2.py", "_pb2_grpc.py")) or "/_generated/" in n], names


def test_pip_install_target_and_use(tmp_path, head, models):
    src = _copy_checkout(tmp_path / "checkout")
    target = tmp_path / "site"
    p = subprocess.run([PYTHON, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--no-cache-dir", "--disable-pip-version-check", "--target", str(target), str(src)],
                       capture_output=True, text=True, timeout=180, env=_env())
    assert p.returncode == 0, f"pip install failed:\n{p.stdout}\n{p.stderr}"
    gen = target / "fastformer_client" / "_generated"
    assert sorted(x.name for x in gen.glob("*.py")) == ["__init__.py", "encoder_pb2.py", "encoder_pb2_grpc.py"]
    assert (target / "fastformer_client" / "py.typed").is_file()
    # The installed package: its own stubs (no proto, no cache needed), a real call.
    script = textwrap.dedent(f"""
        import numpy as np, fastformer_client as ffc
        assert ffc.__file__.startswith({str(target)!r}), ffc.__file__
        assert ffc.encoder_pb2.__file__.startswith({str(gen)!r}), ffc.encoder_pb2.__file__
        with ffc.Client({head.target!r}) as c:
            assert c.health() == "SERVING"
            e = c.encode([[5, 6, 0, 7], np.arange(1, 20)])
            assert e.dtype == np.float32 and e.shape == (2, 64)
            try:
                c.encode([[5, 1000]])
            except ffc.InvalidArgument as err:
                assert "sequence 0" in err.details
            else:
                raise AssertionError("no InvalidArgument")
            print(c.model_info()["model_name"])
    """)
    p = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env=_env(PYTHONPATH=target, FASTFORMER_PROTO_PATH=tmp_path / "nowhere",
                                XDG_CACHE_HOME=tmp_path / "unused-cache"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "e2e-head"
    assert not (tmp_path / "unused-cache").exists(), "the installed package generated stubs at run time"


def test_source_tree_generates_stubs_into_cache(tmp_path):
    src = _copy_checkout(tmp_path / "checkout")
    cache = tmp_path / "cache"
    script = ("import fastformer_client as f; print(f.encoder_pb2.__file__); "
              "print(f.encoder_pb2.EncodeRequest.DESCRIPTOR.full_name)")
    # from the repository layout (<repo>/proto relative to the package)
    p = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=src,
                       env=_env(XDG_CACHE_HOME=cache))
    assert p.returncode == 0, p.stderr
    path, name = p.stdout.split()
    assert Path(path).parent.parent == cache / "fastformer_client" and name == "fastformer.v1.EncodeRequest"
    assert oct((cache / "fastformer_client").stat().st_mode & 0o777) == oct(0o700)
    # a second import reuses the cache
    p2 = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=src,
                        env=_env(XDG_CACHE_HOME=cache))
    assert p2.returncode == 0 and p2.stdout == p.stdout
    # without the repository's proto/: $FASTFORMER_PROTO_PATH (the include root, or the file)
    alone = tmp_path / "alone"
    shutil.copytree(src, alone)
    proto = tmp_path / "checkout" / "proto"
    for value in (proto, proto / "fastformer" / "v1" / "encoder.proto"):
        p = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=alone,
                           env=_env(XDG_CACHE_HOME=tmp_path / "cache2", FASTFORMER_PROTO_PATH=value))
        assert p.returncode == 0, p.stderr
    # neither: a clear ImportError
    p = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=alone,
                       env=_env(XDG_CACHE_HOME=tmp_path / "cache3"))
    assert p.returncode != 0 and "FASTFORMER_PROTO_PATH" in p.stderr and "ImportError" in p.stderr
    # an edited .proto regenerates (the cache key hashes it)
    edited = tmp_path / "edited"
    shutil.copytree(proto, edited)
    f = edited / "fastformer" / "v1" / "encoder.proto"
    f.write_text(f.read_text() + "\n// edited\n")
    p3 = subprocess.run([PYTHON, "-c", script], capture_output=True, text=True, timeout=60, cwd=alone,
                        env=_env(XDG_CACHE_HOME=cache, FASTFORMER_PROTO_PATH=edited))
    assert p3.returncode == 0 and p3.stdout.split()[0] != path

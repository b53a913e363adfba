"""Build hooks (the metadata is in pyproject.toml).

build_py generates the gRPC stubs from fastformer/v1/encoder.proto into the build directory as
the subpackage fastformer_client._generated (nothing generated is committed). The .proto is taken
from $FASTFORMER_PROTO_PATH, else ./proto (an sdist), else ../../proto (the repository).
sdist copies the .proto into ./proto of the archive, so an sdist builds on its own.
"""

import importlib.util
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def _protogen():
    # Loaded by path: importing the package would need grpcio and numpy at build time.
    spec = importlib.util.spec_from_file_location("_fastformer_protogen", HERE / "fastformer_client" / "_protogen.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _proto_root(pg):
    root = pg.find_proto_root([HERE / "proto", HERE.parent.parent / "proto"])
    if root is None:
        raise SystemExit(f"fastformer-client: {pg.PROTO_REL} not found under ./proto or ../../proto; "
                         f"set {pg.PROTO_ENV} to the directory holding fastformer/")
    return root


class BuildPyWithStubs(build_py):
    def run(self):
        super().run()
        pg = _protogen()
        out = Path(self.build_lib) / "fastformer_client" / "_generated"
        if out.exists():
            shutil.rmtree(out)
        pg.generate(_proto_root(pg), out)
        self.announce(f"generated gRPC stubs in {out}", level=2)


class SdistWithProto(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        pg = _protogen()
        dst = Path(base_dir) / "proto" / pg.PROTO_REL
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_proto_root(pg) / pg.PROTO_REL, dst)


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto})

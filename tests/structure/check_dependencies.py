#!/usr/bin/env python3
"""The dependency rule: every include points down.

    client -> common
    server/cmd -> server/grpc, server/http (the two front doors, side by side)
      -> server/serving (the protocol-neutral core) -> server/repository -> server/request
      -> server/batching -> server/engine -> kernels -> common
    server/repository and above -> server/text -> server/engine (the tokenizer, on ICU, and the
                                                  text rules: beside the batching, above the
                                                  engine)
    server/repository and above -> server/metrics -> common
    server/serving and above -> server/jobs -> common (bulk jobs' durable state, SQLite: no
                                                 protocol, no model)

A layer may include itself and any layer below it, never one above or beside it: server/grpc
and server/http never include each other; server/metrics knows none of the others (the
batching reports to it through callbacks that server/cmd connects). Nothing under
server/serving or server/http includes a gRPC header (<grpcpp/...>, <grpc/...>, a
*.grpc.pb.h stub): the generated protobuf messages (*.pb.h) are theirs to use. Nothing
shipped includes tests/. The client programs must not link the engine, OpenBLAS, oneDNN or
CUDA; the programs built on server/serving and server/http alone must not link gRPC. Exit
status 1 names every offending include (file:line) or binary.

    check_dependencies.py --root REPO              the include rule over the source tree
    check_dependencies.py --self-test              a client file that includes a server header
                                                   (and other breaches) must be caught
    check_dependencies.py --client-binaries B...   what the client programs link
    check_dependencies.py --engine-binaries B...   the engine's programs link no ICU, no text layer
    check_dependencies.py --grpc-free-binaries B...  programs on serving/ and http/ link no gRPC
"""

import argparse
import pathlib
import re
import subprocess
import sys
import tempfile

# Bottom first. A file's layer is the longest of these prefixes its path starts with.
SERVER_LAYERS = ["common", "kernels", "server/engine", "server/text", "server/batching", "server/request",
                 "server/repository", "server/serving", "server/grpc", "server/http", "server/cmd"]
# Generated from proto/ (the public API and gRPC health): usable by the RPC layers and clients.
PROTO = ["fastformer/v1/", "grpc/health/"]
# The Open Inference Protocol's generated headers: the messages (protobuf only) and, for
# server/grpc alone, the service stubs (*.grpc.pb.h, refused to GRPC_FREE layers).
INFERENCE_MESSAGES = "inference/"
# The client library's public header directory (client/include).
CLIENT_PUBLIC = ["fastformer/client.h"]

ALLOWED = {layer: SERVER_LAYERS[: i + 1] for i, layer in enumerate(SERVER_LAYERS)}
# The batching never sees text: requests reach it as token ids.
ALLOWED["server/batching"] = [l for l in ALLOWED["server/batching"] if l != "server/text"]
ALLOWED["server/metrics"] = ["common", "server/metrics"]
ALLOWED["server/jobs"] = ["common", "server/jobs"]
ALLOWED["server/repository"] = ALLOWED["server/repository"] + ["server/metrics", INFERENCE_MESSAGES]
ALLOWED["server/serving"] = ALLOWED["server/serving"] + ["server/metrics", "server/jobs", INFERENCE_MESSAGES]
ALLOWED["server/grpc"] = ALLOWED["server/grpc"] + ["server/metrics", "server/jobs", INFERENCE_MESSAGES] + PROTO
# The front doors stand side by side over the serving core: HTTP never includes gRPC's.
ALLOWED["server/http"] = [l for l in ALLOWED["server/http"] if l != "server/grpc"] + [
    "server/metrics", "server/jobs", INFERENCE_MESSAGES]
ALLOWED["server/cmd"] = ALLOWED["server/cmd"] + ["server/metrics", "server/jobs", INFERENCE_MESSAGES] + PROTO
ALLOWED["client"] = ["client", "common"] + PROTO + CLIENT_PUBLIC

SOURCE_SUFFIXES = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
# First path components that name a directory of this repository.
PROJECT_ROOTS = {"common", "kernels", "server", "client", "tests"}


def is_project_header(target: str) -> bool:
    """A header of this repository (or generated from its proto/), not a system one."""
    return (target.split("/", 1)[0] in PROJECT_ROOTS and "/" in target) or target.startswith(
        tuple(PROTO + CLIENT_PUBLIC + ["fastformer/", INFERENCE_MESSAGES]))


# Layers that must not see gRPC: its headers (system ones included) and generated stubs.
GRPC_FREE = {"server/serving", "server/http"}
GRPC_HEADER = re.compile(r"^(grpcpp|grpc|grpc\+\+)/|\.grpc\.pb\.h$")


def layer_of(relpath: str) -> str | None:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if relpath == layer or relpath.startswith(layer + "/"):
            return layer
    return None


def allowed(layer: str, target: str) -> bool:
    for prefix in ALLOWED[layer]:
        if prefix.endswith("/") or prefix.endswith(".h"):
            if target.startswith(prefix) or target == prefix:
                return True
        elif target == prefix or target.startswith(prefix + "/"):
            return True
    return False


def check_tree(root: pathlib.Path) -> list[str]:
    problems = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("build", ".git/")):
            continue
        layer = layer_of(rel)
        if layer is None:  # tests/, tools/: free to include anything
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = m.group(1)
            if layer in GRPC_FREE and GRPC_HEADER.search(target):
                problems.append(f"{rel}:{number}: {layer}/ may not include \"{target}\" (no gRPC "
                                f"under {', '.join(sorted(GRPC_FREE))}/: map to it in server/grpc/)")
                continue
            if not is_project_header(target):
                continue  # a system or third-party header
            if not allowed(layer, target):
                problems.append(f"{rel}:{number}: {layer}/ may not include \"{target}\" "
                                f"(allowed: {', '.join(ALLOWED[layer])})")
    return problems


def self_test() -> list[str]:
    """The rule must fail on known breaches and pass on a clean tree."""
    cases = {
        "client/cmd/bad.cc": ('#include "server/engine/model.h"', "client/cmd/bad.cc:2"),
        "kernels/bad.cu": ('#include "server/engine/half.h"', "kernels/bad.cu:2"),
        "common/bad.h": ('#include "client/loadgen/load_spec.h"', "common/bad.h:2"),
        "server/engine/bad.cc": ('#include "server/batching/queue.h"', "server/engine/bad.cc:2"),
        "server/engine/bad_text.h": ('#include "server/text/tokenizer/tokenizer.h"',
                                     "server/engine/bad_text.h:2"),
        "server/batching/bad_text.cc": ('#include "server/text/text.h"', "server/batching/bad_text.cc:2"),
        "server/batching/bad.cc": ('#include "tests/support/test_models.h"',
                                   "server/batching/bad.cc:2"),
        "server/metrics/bad.cc": ('#include "server/batching/queue.h"', "server/metrics/bad.cc:2"),
        # The front doors side by side over the serving core, which knows neither.
        "server/http/bad_door.cc": ('#include "server/grpc/status.h"', "server/http/bad_door.cc:2"),
        "server/grpc/bad_door.cc": ('#include "server/http/api.h"', "server/grpc/bad_door.cc:2"),
        "server/serving/bad_up.h": ('#include "server/grpc/status.h"', "server/serving/bad_up.h:2"),
        "server/serving/bad_grpc.cc": ("#include <grpcpp/grpcpp.h>", "server/serving/bad_grpc.cc:2"),
        "server/http/bad_grpc.h": ("#include <grpcpp/support/status.h>", "server/http/bad_grpc.h:2"),
        "server/http/bad_stub.cc": ('#include "inference/grpc_service.grpc.pb.h"',
                                    "server/http/bad_stub.cc:2"),
    }
    clean = {
        "client/cmd/good.cc": '#include "common/jsonl_io.h"\n#include "fastformer/client.h"',
        "server/cmd/good.cc": '#include "server/grpc/status.h"\n#include "server/http/api.h"',
        "server/grpc/good.cc": ('#include "server/serving/intake.h"\n#include <grpcpp/grpcpp.h>\n'
                                '#include "inference/grpc_service.grpc.pb.h"'),
        "server/serving/good.cc": ('#include "server/text/text.h"\n#include "server/batching/queue.h"\n'
                                   '#include "inference/grpc_service.pb.h"'),
        "server/http/good.cc": '#include "server/serving/intake.h"\n#include "inference/model_config.pb.h"',
        "server/text/good.cc": '#include "server/engine/model.h"\n#include "server/text/tokenizer/unicode.h"',
        "kernels/good.cu": '#include "common/half.h"\n#include <cuda_runtime.h>',
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for rel, text in clean.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("// clean\n" + text + "\n")
        if problems := check_tree(root):
            failures.append(f"a clean tree was rejected: {problems}")
        for rel, (text, _) in cases.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text("// breach\n" + text + "\n")
        found = check_tree(root)
        for rel, (text, where) in cases.items():
            if not any(p.startswith(where + ":") for p in found):
                failures.append(f"{where} ({text}) was not reported; reported: {found}")
    return failures


# What a client program must not carry: the engine's code and its libraries.
FORBIDDEN_LIBS = re.compile(r"openblas|blas|dnnl|cublas|cudart|libcuda|nvrtc")
FORBIDDEN_SYMBOLS = re.compile(r"fastformer::(engine|batching|serving|rpc|metrics|kernels)::|cblas_|dnnl_")


def check_binaries(binaries: list[str], libs: re.Pattern = FORBIDDEN_LIBS,
                   symbols_re: re.Pattern = FORBIDDEN_SYMBOLS,
                   what: str = "server/engine code") -> list[str]:
    """Each binary's NEEDED libraries must not match `libs`, nor its symbols `symbols_re`."""
    problems = []
    for binary in binaries:
        dynamic = subprocess.run(["readelf", "-d", binary], capture_output=True, text=True,
                                 check=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
        if not needed:
            problems.append(f"{binary}: readelf found no NEEDED entries (not a dynamic binary?)")
        problems += [f"{binary}: links {lib}" for lib in needed if libs.search(lib)]
        symbols = subprocess.run(["nm", "-C", binary], capture_output=True, text=True,
                                 check=True).stdout
        bad = sorted({m.group(0) for m in symbols_re.finditer(symbols)})
        if bad:
            problems.append(f"{binary}: carries {what} ({', '.join(bad)})")
    return problems


# What the engine's programs (fastformer-bench, the CUDA plugin, the GPU tests) must not carry:
# the text layer and ICU, which a bare GPU machine does not have (issue 21).
ENGINE_FORBIDDEN_LIBS = re.compile(r"libicu")
ENGINE_FORBIDDEN_SYMBOLS = re.compile(r"fastformer::(tokenizer|text|batching|serving|rpc)::|\bicu_[0-9]+::")


def check_engine_binaries(binaries: list[str]) -> list[str]:
    return check_binaries(binaries, ENGINE_FORBIDDEN_LIBS, ENGINE_FORBIDDEN_SYMBOLS,
                          "text-layer or ICU code")


# What the programs built on server/serving and server/http alone (the HTTP tests, the JSON
# benchmark, the serving core's tests) must not carry: gRPC's libraries and code, ours
# included (fastformer::rpc is server/grpc's namespace).
GRPC_LIBS = re.compile(r"libgrpc|libgpr|libaddress_sorting|libupb")
GRPC_SYMBOLS = re.compile(r"fastformer::rpc::|\bgrpc::|\bgrpc_core::")


def check_grpc_free_binaries(binaries: list[str]) -> list[str]:
    return check_binaries(binaries, GRPC_LIBS, GRPC_SYMBOLS, "gRPC code")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=pathlib.Path)
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--client-binaries", nargs="+")
    parser.add_argument("--engine-binaries", nargs="+")
    parser.add_argument("--grpc-free-binaries", nargs="+")
    args = parser.parse_args()
    problems = []
    if args.root:
        problems += check_tree(args.root)
    if args.self_test:
        problems += self_test()
    if args.client_binaries:
        problems += check_binaries(args.client_binaries)
    if args.engine_binaries:
        problems += check_engine_binaries(args.engine_binaries)
    if args.grpc_free_binaries:
        problems += check_grpc_free_binaries(args.grpc_free_binaries)
    for p in problems:
        print(p)
    if not (args.root or args.self_test or args.client_binaries or args.engine_binaries
            or args.grpc_free_binaries):
        parser.error("nothing to check")
    print(f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

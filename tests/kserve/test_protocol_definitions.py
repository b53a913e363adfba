"""Our proto/inference/*.proto against Triton's own definitions, as tritonclient ships them:
every service, RPC, message and field we declare has the same name, number, type, label and
streaming as Triton's, so the two are wire- and reflection-compatible."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from conftest import REPO


def our_files(tmp_path):
    protoc = shutil.which("protoc")
    if protoc is None:
        pytest.fail("protoc not found (Debian protobuf-compiler, installed by deploy/install-deps.sh)")
    out = tmp_path / "inference.desc"
    subprocess.run([protoc, f"--proto_path={REPO / 'proto'}", f"--descriptor_set_out={out}", "--include_imports",
                    "inference/grpc_service.proto"], check=True)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    assert {f.name for f in files} == {"inference/grpc_service.proto", "inference/model_config.proto"}
    return files


def theirs():
    """Triton's messages, enums and services by full name (".inference.X")."""
    by_name = {}
    for module in (service_pb2, model_config_pb2):
        fd = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(fd)
        collect(fd, by_name)
    return by_name


def collect(fd, by_name):
    def walk(prefix, messages, enums):
        for e in enums:
            by_name[f"{prefix}.{e.name}"] = e
        for m in messages:
            name = f"{prefix}.{m.name}"
            by_name[name] = m
            walk(name, m.nested_type, m.enum_type)

    walk("." + fd.package, fd.message_type, fd.enum_type)
    for s in fd.service:
        by_name[f".{fd.package}.{s.name}"] = s


def test_every_declaration_matches_triton(tmp_path):
    ours = {}
    for f in our_files(tmp_path):
        assert f.package == "inference"
        collect(f, ours)
    triton = theirs()
    checked_fields = 0
    for name, decl in ours.items():
        assert name in triton, f"{name} is not in Triton's protocol"
        other = triton[name]
        if isinstance(decl, descriptor_pb2.ServiceDescriptorProto):
            methods = {m.name: m for m in other.method}
            for m in decl.method:
                assert m.name in methods, f"{name}.{m.name} is not an RPC of Triton's service"
                t = methods[m.name]
                assert (m.input_type, m.output_type, m.client_streaming, m.server_streaming) == \
                    (t.input_type, t.output_type, t.client_streaming, t.server_streaming), f"{name}.{m.name}"
        elif isinstance(decl, descriptor_pb2.EnumDescriptorProto):
            values = {v.name: v.number for v in other.value}
            for v in decl.value:
                assert values.get(v.name) == v.number, f"{name}.{v.name} = {v.number}, Triton: {values.get(v.name)}"
        else:
            fields = {f.name: f for f in other.field}
            for f in decl.field:
                assert f.name in fields, f"{name}.{f.name} is not a field of Triton's {name}"
                t = fields[f.name]
                assert (f.number, f.type, f.label, f.type_name) == (t.number, t.type, t.label, t.type_name), \
                    f"{name}.{f.name}: ours {(f.number, f.type, f.label, f.type_name)}, " \
                    f"Triton's {(t.number, t.type, t.label, t.type_name)}"
                checked_fields += 1
    assert checked_fields > 80, "the comparison walked too few fields to mean anything"


def test_the_rpcs_we_serve_are_all_declared(tmp_path):
    service = next(s for f in our_files(tmp_path) for s in f.service)
    assert service.name == "GRPCInferenceService"
    assert {m.name for m in service.method} == {
        "ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
        "ModelStreamInfer", "ModelConfig", "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad",
        "RepositoryModelUnload"}

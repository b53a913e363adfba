"""--dtype auto, the server's default (issue 34, item 4: the speed by default). A server started
without --dtype serves bfloat16 exactly where this CPU has bfloat16 GEMMs in hardware (the
avx512_bf16 or amx_bf16 flag of /proc/cpuinfo, unless ONEDNN_MAX_CPU_ISA caps oneDNN below them;
read here, not asked of the engine), float32 elsewhere. What it serves, never "auto", is what
GetModelInfo, TEI's /info, KServe's model config and the fastformer_model_info gauge report, and
its start-up log names the choice and the reason. ONEDNN_MAX_CPU_ISA=AVX2 makes any CPU one without
bfloat16 GEMMs, so the float32 branch runs through the server on every machine, and the bfloat16
branch on every machine that has them.

Every other suite pins --dtype float32 (fastformer_testing.server.TEST_ENGINE): its 1e-4 parity
is float32's.
"""

from __future__ import annotations

import json
import re
import urllib.request

import numpy as np
import pytest
from fastformer_testing.cpu_features import cpu_flags, has_bf16_gemms

# The server's environment: as the test runner's (whose ONEDNN_MAX_CPU_ISA, if any, it inherits),
# or capped to AVX2.
ISA_CAPS = {"this-cpu": None, "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"}}


def _expected(env) -> str:
    return "bfloat16" if has_bf16_gemms(None if env is None else env) else "float32"


def _get_json(srv, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}{path}", timeout=10) as r:
        return json.loads(r.read().decode("utf-8"))


@pytest.mark.parametrize("cap", list(ISA_CAPS))
def test_auto_serves_bfloat16_exactly_where_the_cpu_has_bfloat16_gemms(e2e, servers, cap):
    env = ISA_CAPS[cap]
    want = _expected(env)
    srv = servers.start("head", extra_env=env, dtype=None)  # no --dtype: the default
    model = srv.model

    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    assert info.dtype == want, f"GetModelInfo.dtype {info.dtype!r}, this CPU ({cap}) wants {want!r}"
    assert f", {want}, oneDNN" in info.device, f"GetModelInfo.device {info.device!r}"
    assert _get_json(srv, "/info")["model_dtype"] == want
    config = _get_json(srv, f"/v2/models/{info.model_name}/config")
    assert config["parameters"]["dtype"]["string_value"] == want, config["parameters"]
    (labels, _), = srv.metrics().series("fastformer_model_info")
    assert labels["dtype"] == want, f"fastformer_model_info labels {labels}"

    # It serves: bfloat16's pooled embeddings keep a cosine of 0.999 to the float64 reference
    # (the reduced-precision rule), float32's are within the engine's 1e-4.
    rng = np.random.default_rng(34)
    seqs = [e2e.make_ids(rng, n, model.vocab) for n in (3, 40, 300)]
    reply = srv.stub.Encode(e2e.make_request(seqs, "ids"), timeout=e2e.RPC_TIMEOUT_S)
    assert len(reply.encodings) == len(seqs)
    for i, (seq, got) in enumerate(zip(seqs, reply.encodings)):
        ours = np.asarray(got.embedding, dtype=np.float64)
        ref = np.asarray(model.reference(seq).embedding, dtype=np.float64)
        if want == "float32":
            e2e.assert_close(f"seq {i}", ours, ref)
        else:
            cosine = float(ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)))
            assert cosine >= 0.999, f"seq {i}: cosine {cosine:.6f} to the float64 reference"


@pytest.mark.parametrize("cap", list(ISA_CAPS))
def test_the_start_up_log_names_the_choice_and_the_reason(servers, cap):
    env = ISA_CAPS[cap]
    want = _expected(env)
    srv = servers.start("head", extra_env=env, dtype=None)
    line = re.search(r"dtype auto: .*", srv.log_text())
    assert line, f"no 'dtype auto:' line in the log:\n{srv.log_tail()}"
    if want == "bfloat16":
        reason = r"oneDNN [0-9.]+ finds avx512_core_(bf16|amx): bfloat16 GEMMs on (AVX512_BF16, no AMX|AMX)"
    else:
        reason = r"oneDNN [0-9.]+ finds \w+: no AVX512_BF16 or AMX on this CPU"
        if env:
            reason += r" \(ONEDNN_MAX_CPU_ISA is set\)"
    assert re.fullmatch(rf"dtype auto: {want} \({reason}\)", line.group(0)), line.group(0)


def test_a_named_dtype_is_served_as_named_without_a_choice_to_log(servers):
    srv = servers.start("head")  # the suites' --dtype float32
    assert "dtype auto" not in srv.log_text(), srv.log_tail()
    (labels, _), = srv.metrics().series("fastformer_model_info")
    assert labels["dtype"] == "float32", labels


def _bf16_env():
    # bfloat16 on any CPU: the emulated bfloat16 where there are no bfloat16 GEMMs (tests only).
    return None if has_bf16_gemms() else {"FASTFORMER_CPU_BFLOAT16": "emulate"}


def _assert_serves_bf16(e2e, srv):
    rng = np.random.default_rng(35)
    seqs = [e2e.make_ids(rng, n, srv.model.vocab) for n in (5, 300)]
    reply = srv.stub.Encode(e2e.make_request(seqs, "ids"), timeout=e2e.RPC_TIMEOUT_S)
    for i, (seq, got) in enumerate(zip(seqs, reply.encodings)):
        ours = np.asarray(got.embedding, dtype=np.float64)
        ref = np.asarray(srv.model.reference(seq).embedding, dtype=np.float64)
        cosine = float(ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)))
        assert cosine >= 0.999, f"seq {i}: cosine {cosine:.6f} to the float64 reference"


def test_cpu_gemm_amx_runs_the_tiles_where_the_cpu_has_amx_and_says_why_not_elsewhere(e2e, servers):
    """--cpu-gemm amx (issue 34: the hand-written AMX kernel, opt-in): the engine takes it where
    /proc/cpuinfo has amx_bf16 and amx_tile (and the kernel grants the tiles), else keeps oneDNN and
    its device string, GetModelInfo's too, says why; either way the server answers."""
    srv = servers.start("head", extra_env=_bf16_env(), dtype="bfloat16", cpu_gemm="amx")
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    if {"amx_bf16", "amx_tile"} <= cpu_flags():
        assert "GEMMs on the hand-written AMX kernel" in info.device, info.device
    else:
        assert re.search(r"--cpu-gemm amx refused \(no AMX on this CPU [^)]*\)\): oneDNN's GEMMs",
                         info.device), info.device
    _assert_serves_bf16(e2e, srv)


def test_the_amx_kernel_serves_through_the_server_on_the_tile_model(e2e, servers):
    """The same kernel over the portable model of the tile instructions (FASTFORMER_AMX_TILES=model,
    tests only), on any CPU: its packing, blocking and epilogues behind every protocol."""
    env = dict(_bf16_env() or {}, FASTFORMER_AMX_TILES="model")
    srv = servers.start("head", extra_env=env, dtype="bfloat16")
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    assert "GEMMs on the AMX kernel over the tile model (tests)" in info.device, info.device
    _assert_serves_bf16(e2e, srv)


def test_cpu_gemm_auto_is_the_default_and_says_its_choice(e2e, servers):
    """--cpu-gemm auto (issue 51), the default: per GEMM shape the faster of oneDNN and the AMX
    kernel, timed at load, where the kernel can run; elsewhere oneDNN, the device string saying
    why. GetModelInfo's gemm_kernels says which kernel runs each GEMM site, and the load's log
    has the same lines."""
    srv = servers.start("head", extra_env=_bf16_env(), dtype="bfloat16")
    info = srv.stub.GetModelInfo(e2e.pb.GetModelInfoRequest(), timeout=e2e.RPC_TIMEOUT_S)
    if {"amx_bf16", "amx_tile"} <= cpu_flags():
        assert "GEMMs picked per shape by measurement at load" in info.device, info.device
        assert all("auto: " in line for line in info.gemm_kernels), info.gemm_kernels
    else:
        assert re.search(r"--cpu-gemm auto: oneDNN's GEMMs \(the AMX kernel cannot run: no AMX on this CPU",
                         info.device), info.device
    names = [line.split(" ", 1)[0] for line in info.gemm_kernels]
    assert "ffn_in_gemm" in names and "ffn_out_gemm" in names, info.gemm_kernels
    for line in info.gemm_kernels:
        assert f"GEMM {line}" in srv.log_text(), (line, srv.log_tail())
    _assert_serves_bf16(e2e, srv)


def test_a_cpu_gemm_outside_auto_onednn_and_amx_is_refused_at_start_up(servers):
    srv = servers.start("head", wait=False, cpu_gemm="tiles")
    assert srv.wait_exit(timeout=30) != 0
    assert "--cpu-gemm: tiles not in {auto,onednn,amx}" in srv.log_text(), srv.log_tail()

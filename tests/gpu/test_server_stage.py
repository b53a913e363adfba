"""tests/gpu/server_stage.py, the GPU check's server stages (issue 47), run here on the CPU.

A lent GPU machine runs the driver once, with no second chance, so it is run end to end here
first: the real fastformer-server, fastformer-client, fastformer-loadgen, fastformer-encode and
fastformer-bench of this build, the tiny model in both roles (the `smoke` set of
server_expected.py), `--backend cpu --dtype float32`.

- parity: the answers over gRPC, HTTP and text against fastformer-encode's (float32 on both
  sides: cosine 1 to rounding, the same argmax); and with carried answers of which one was
  planted wrong, the parity fails, naming the group and the request, while the others hold; and
  with carried answers for another model file (its SHA-256 changed), they are not used: the
  stage computes its own and says so.
- load: the saturation's tokens/s against fastformer-bench's, batches from /metrics, the low
  load's percentiles and the server's own timings, and the drain: SIGTERM under load, every
  request answered or refused with UNAVAILABLE, the server's "drained" line and exit 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tools"))  # fastformer_testing
sys.path.insert(0, str(HERE))
from fastformer_testing.binaries import binary, bin_dir, child_env  # noqa: E402
import server_expected  # noqa: E402

STAGE = HERE / "server_stage.py"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The smoke set's model, made as gpu-check.sh makes it (make_demo_model.py --seed 1 --tokenizer)."""
    for name in ("fastformer-server", "fastformer-client", "fastformer-loadgen", "fastformer-encode", "fastformer-bench"):
        binary(name)
    out = tmp_path_factory.mktemp("models")
    server_expected.make_model("tiny", True, out / "tiny", sys.executable)
    return out


def run_stage(what, models, tmp, *extra):
    out = tmp / f"{what}.json"
    cmd = [sys.executable, str(STAGE), what, "--set", "smoke", "--backend", "cpu", "--dtype", "float32",
           "--bin-dir", str(bin_dir()), "--models", str(models), "--out", str(out), "--log-dir", str(tmp / "logs"),
           *extra]
    run = subprocess.run(cmd, capture_output=True, text=True, env=child_env(), timeout=240)
    assert out.exists(), f"{what}: no JSON written; exit {run.returncode}: {run.stderr[-2000:]}"
    return run.returncode, json.loads(out.read_text()), run.stderr


def carried(models, tmp) -> Path:
    """server_expected.py's smoke set, as a carry writes it (not from the cache)."""
    out = tmp / "expected"
    subprocess.run([sys.executable, str(HERE / "server_expected.py"), "--set", "smoke", "--out", str(out),
                    "--encode", str(binary("fastformer-encode")), "--models", str(models), "--no-cache"],
                   check=True, capture_output=True, env=child_env())
    return out


def test_parity_through_the_server_matches_the_cpu_reference(models, tmp_path):
    rc, result, err = run_stage("parity", models, tmp_path)
    assert rc == 0 and result["ok"], (result, err[-2000:])
    names = [g["name"] for g in result["groups"]]
    assert names == ["grpc", "http", "text-grpc", "text-http"], names
    by = {g["name"]: g for g in result["groups"]}
    # 16 token-id sequences: the 8 even ones over gRPC, the odd ones over HTTP but the longest
    # (the last, 512 tokens), which goes over gRPC; 8 texts likewise (the longest the last).
    assert (by["grpc"]["requests"], by["http"]["requests"]) == (9, 7)
    assert (by["text-grpc"]["requests"], by["text-http"]["requests"]) == (5, 3)
    for g in result["groups"]:
        assert g["failed_requests"] == 0 and g["min_cosine"] > 0.99999, g  # float32 both sides
    assert by["text-grpc"]["argmax"] == {"same": 5, "of": 5}
    assert "computed here on the CPU" in result["expected_from"]  # none carried
    assert result["dtype"] == "float32"


def test_parity_fails_on_a_wrong_answer_and_ignores_answers_for_another_model(models, tmp_path):
    expected = carried(models, tmp_path)
    # A planted wrong answer: the 4th token-id line (odd: over HTTP) gets its embedding negated.
    path = expected / "tiny.expected.jsonl.gz"
    lines = server_expected.read_jsonl_gz(path)
    lines[3]["embedding"] = [-x for x in lines[3]["embedding"]]
    server_expected.write_jsonl_gz(path, lines)
    rc, result, _ = run_stage("parity", models, tmp_path, "--expected", str(expected))
    by = {g["name"]: g for g in result["groups"]}
    assert rc == 1 and not result["ok"]
    assert not by["http"]["ok"] and by["http"]["worst"].startswith("request 1 "), by["http"]  # 4th line = 2nd over HTTP
    assert by["http"]["min_cosine"] < -0.99
    assert by["grpc"]["ok"] and by["text-grpc"]["ok"] and by["text-http"]["ok"]
    assert "tiny: carried" in result["expected_from"]

    # The same answers said to be for another model file: not used, computed on the spot.
    manifest = json.loads((expected / "manifest.json").read_text())
    manifest["models"]["tiny"]["sha256"] = "0" * 64
    (expected / "manifest.json").write_text(json.dumps(manifest))
    rc, result, _ = run_stage("parity", models, tmp_path, "--expected", str(expected))
    assert rc == 0 and result["ok"], result
    assert "tiny: computed here on the CPU in float32 (the carried ones are for another model file" in result["expected_from"]


def test_load_saturation_low_load_and_drain(models, tmp_path):
    rc, result, err = run_stage("load", models, tmp_path, "--max-batch-tokens", "2048", "--lengths", "uniform:16:256",
                                "--concurrency", "4", "--sequences-per-request", "2", "--seconds", "1.5",
                                "--warmup", "0.5", "--drain-seconds", "3")
    assert result["error"] is None, (result, err[-2000:])
    sat, low, drain = result["saturation"], result["low_load"], result["drain"]
    assert sat["engine_tokens_per_s"] > 0 and sat["server_tokens_per_s"] > 0
    assert sat["ratio"] == pytest.approx(sat["server_tokens_per_s"] / sat["engine_tokens_per_s"])
    assert sat["errors"] == {} and sat["succeeded"] == sat["requests"] > 0
    assert sat["batches"] > 0 and 1 <= sat["batch_tokens_mean"] <= 2048
    assert low["requests"] > 0 and low["errors"] == {}
    assert 0 < low["latency_ms"]["p50"] <= low["latency_ms"]["p99"]
    assert low["server_compute_ms"]["p50"] is not None and low["server_compute_ms"]["p50"] <= low["latency_ms"]["p99"]
    assert drain["server_exit"] == 0 and drain["drained_line"] and not drain["hung"], drain
    assert drain["unclear"] == 0 and drain["succeeded"] > 0, drain
    assert drain["succeeded"] + sum(drain["errors"].values()) == drain["requests"], drain
    # UNAVAILABLE: refused by the draining server, or its closed port; CANCELLED: calls the
    # load generator was still retrying when its run ended.
    assert set(drain["errors"]) <= {"UNAVAILABLE", "CANCELLED"} and drain["ok"], drain
    assert drain["errors"].get("UNAVAILABLE", 0) > 0  # the load went on past the signal
    # The verdict: on the CPU the tiny model's server runs below its engine (a request costs
    # more than its compute), so the stage holds only when the ratio reaches 0.90.
    assert result["ok"] == (sat["ratio"] >= 0.90)
    assert (rc == 0) == result["ok"]
    assert os.path.exists(tmp_path / "logs" / "server-load.log")


def test_expected_inputs_are_pinned():
    """The inputs come from random.Random(seed).random() only, the part of Python's generator
    kept the same across versions, so the lease (Python 3.12) draws what this machine drew; the
    first lengths and ids are pinned here, so a change to the generator is seen (it would make
    the carried answers another input's)."""
    spec = server_expected.SETS["gpu"]["base-long"]
    lines = server_expected.inputs_for("base-long", spec)
    lengths = [len(x["token_ids"]) for x in lines]
    assert lengths[:8] == [1, 1623, 67, 254, 2, 350, 9, 2]
    assert lines[1]["token_ids"][:3] == [2281, 2674, 8418]
    assert len(lines) == 65 and lengths[63] == 8192 and lengths[64] == 65536 and sum(lengths) == 125063
    assert all(1 <= i < 30522 for x in lines for i in x["token_ids"])


def test_the_harness_imports_under_a_bare_python():
    """The lease's Python has no pytest and no site-packages of ours: the stage (and the tools)
    import tools/fastformer_testing there. Every module but golden_answers (pytest's, for the
    behaviour goldens) imports with `python3 -S` (no site-packages, so no pytest, no numpy), and
    pytest is not among what they loaded; outside pytest a failure raises HarnessError."""
    code = ("import sys\n"
            f"sys.path.insert(0, {str(ROOT / 'tools')!r})\n"
            "import fastformer_testing as ft\n"
            "from fastformer_testing import binaries, cpu_features, outcome, sanitizers, server, server_ports\n"
            "assert 'pytest' not in sys.modules, 'pytest imported'\n"
            "assert 0 < ft.free_port() < 65536\n"
            "try:\n"
            "    ft.binary('no-such-program')\n"
            "except ft.HarnessError as e:\n"
            "    print('HarnessError:', e)\n")
    run = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                         env=child_env())
    assert run.returncode == 0, run.stderr
    assert "HarnessError: no-such-program not found at" in run.stdout
    run = subprocess.run([sys.executable, "-S", str(STAGE), "--help"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "parity" in run.stdout, run.stderr

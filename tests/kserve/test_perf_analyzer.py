"""Triton's load tester, perf_analyzer (C++, from the tritonclient 2.41.0 wheel: mk/kserve.mk),
against our server with no change on either side: unary and --streaming, concurrency 1 to 4,
variable lengths from a JSON input file. It must finish with exit 0, and what it measured on
the server side (from our ModelStatistics) must agree with what it sent, and with /metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient


def perf_analyzer() -> Path:
    path = Path(sys.executable).parent / "perf_analyzer"
    if not path.is_file():
        pytest.fail(f"{path} missing: make kserve-venv installs it (mk/kserve.mk)", pytrace=False)
    return path


def cuda_runtime_dir() -> str:
    """libcudart.so.12, which perf_analyzer links, from the nvidia-cuda-runtime-cu12 wheel."""
    import nvidia.cuda_runtime

    return str(Path(list(nvidia.cuda_runtime.__path__)[0]) / "lib")


def input_file(model, path: Path, count=24, seed=3):
    """`count` sequences of 8 to 200 real token ids, as perf_analyzer's --input-data JSON
    (shapes without the batch dimension, since max_batch_size > 0)."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(count):
        n = int(rng.integers(8, 201))
        data.append({"input_ids": {"content": rng.integers(1, model.vocab, n).tolist(), "shape": [n]}})
    path.write_text(json.dumps({"data": data}))
    return path


def run(server, model, tmp_path, concurrency: str, streaming: bool):
    cmd = [str(perf_analyzer()), "-m", model.name, "-u", server.url, "-i", "grpc",
           "--input-data", str(input_file(model, tmp_path / "input.json")),
           "--concurrency-range", concurrency, "--measurement-interval", "800", "--max-trials", "8",
           # What this checks is the counts, not a stable rate: windows may differ up to 5x
           # (a sanitizer build on a shared 2-core machine; 60% failed there).
           "--stability-percentage", "400", "-f", str(tmp_path / "report.csv")]
    if streaming:
        cmd.append("--streaming")
    env = {**os.environ, "LD_LIBRARY_PATH": cuda_runtime_dir()}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, f"perf_analyzer exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def windows(stdout: str):
    """Per concurrency: (client request count, server successful request count)."""
    blocks = re.split(r"Request concurrency: (\d+)", stdout)[1:]
    found = {}
    for level, body in zip(blocks[0::2], blocks[1::2]):
        client = int(re.search(r"Client:\s+Request count: (\d+)", body).group(1))
        server = int(re.search(r"Successful request count: (\d+)", body).group(1))
        found[int(level)] = (client, server)
    return found


@pytest.mark.parametrize("streaming,concurrency,levels", [(False, "1:4", [1, 2, 3, 4]), (True, "1:2", [1, 2])],
                         ids=["unary", "streaming"])
def test_perf_analyzer_runs_and_counts_agree(start, model, tmp_path, streaming, concurrency, levels):
    srv = start()
    stdout = run(srv, model, tmp_path, concurrency, streaming)
    found = windows(stdout)
    assert sorted(found) == levels, stdout[-2000:]
    for level, (client, server) in found.items():
        assert client > 0, f"concurrency {level}: no requests measured"
        # Requests in flight at a window's edges may fall on either side of it: at most `level`
        # at each of its two edges (the server's counts are read by RPCs of their own, a moment
        # off the client's window; one streaming run counted 3,015 against 3,017 at level 1).
        assert abs(client - server) <= 2 * level, f"concurrency {level}: sent {client}, server counted {server}"

    c = grpcclient.InferenceServerClient(srv.url)
    try:
        stats = c.get_inference_statistics(model.name, as_json=True)["model_stats"][0]
    finally:
        c.close()
    method = "ModelStreamInfer" if streaming else "ModelInfer"
    served = srv.metric("fastformer_requests_total", method=method, code="OK")
    assert served > sum(client for client, _ in found.values()) * 0.9
    assert int(stats["inference_stats"]["success"]["count"]) == served
    assert int(stats["inference_count"]) == served  # one row per request
    assert srv.metric("fastformer_requests_total", method=method, code="INVALID_ARGUMENT") == 0
    # Its ModelStatistics calls (before and after every window) were served too.
    assert srv.metric("fastformer_requests_total", method="ModelStatistics", code="OK") >= 2 * len(levels)

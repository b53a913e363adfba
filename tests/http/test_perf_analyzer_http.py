"""Triton's load tester, perf_analyzer (C++, from the tritonclient 2.41.0 wheel that
mk/kserve.mk extracts), over KServe v2 REST (-i http) with no change on either side: concurrency
1 to 4 from a JSON input file of variable-length token ids, a short bounded measurement. It must
exit 0, report a throughput above 0 at every level, and the server's statistics must have grown
by what it sent.

The binary: $PERF_ANALYZER (mk/http.mk passes .venv-triton/bin/perf_analyzer), else
<repo>/.venv-triton/bin/perf_analyzer; missing, the tests are skipped saying so."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, call


def perf_analyzer() -> Path:
    path = Path(os.environ.get("PERF_ANALYZER") or REPO / ".venv-triton" / "bin" / "perf_analyzer")
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.skip(f"perf_analyzer not found at {path} (make kserve-venv extracts it; set PERF_ANALYZER)")
    return path


def cuda_runtime_dir(pa: Path) -> str:
    """libcudart.so.12, which perf_analyzer links, from the nvidia-cuda-runtime-cu12 wheel in the
    venv perf_analyzer sits in (no GPU is used)."""
    found = sorted(pa.parent.parent.glob("lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    if not found:
        pytest.skip(f"no nvidia/cuda_runtime/lib (libcudart.so.12) in the venv of {pa}")
    return str(found[0])


def input_file(model, path: Path, count=16, seed=3):
    """`count` sequences of 4 to 48 real token ids (shapes without the batch dimension)."""
    rng = np.random.default_rng(seed)
    data = []
    for _ in range(count):
        n = int(rng.integers(4, 49))
        data.append({"input_ids": {"content": rng.integers(4, model.vocab, n).tolist(), "shape": [n]}})
    path.write_text(json.dumps({"data": data}))
    return path


def success_count(srv, model) -> int:
    r = call(srv.http_port, "GET", f"/v2/models/{model.name}/stats")
    assert r.status == 200, r.body[:300]
    # .get: a zero count is left out of the JSON (test_routes.py's stats test holds that against it)
    return int(r.json()["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def run(srv, model, tmp_path, concurrency="1:4"):
    pa = perf_analyzer()
    cmd = [str(pa), "-i", "http", "-u", f"127.0.0.1:{srv.http_port}", "-m", model.name,
           "--input-data", str(input_file(model, tmp_path / "input.json")),
           "--concurrency-range", concurrency, "--measurement-interval", "500", "--max-trials", "6",
           # the counts are checked, not a stable rate: windows may differ up to 5x
           "--stability-percentage", "400"]
    env = {**os.environ, "LD_LIBRARY_PATH": cuda_runtime_dir(pa)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, f"perf_analyzer exited {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out.stdout


def measured(stdout: str):
    """Per concurrency: (client request count, client throughput)."""
    blocks = re.split(r"Request concurrency: (\d+)", stdout)[1:]
    found = {}
    for level, body in zip(blocks[0::2], blocks[1::2]):
        count = int(re.search(r"Client:\s+Request count: (\d+)", body).group(1))
        throughput = float(re.search(r"Throughput: ([\d.]+) infer/sec", body).group(1))
        found[int(level)] = (count, throughput)
    return found


def test_perf_analyzer_over_http(ids_server, ids_model, tmp_path):
    before = success_count(ids_server, ids_model)
    stdout = run(ids_server, ids_model, tmp_path)
    found = measured(stdout)
    assert sorted(found) == [1, 2, 3, 4], stdout[-2000:]
    for level, (count, throughput) in found.items():
        assert count > 0 and throughput > 0, f"concurrency {level}: {count} requests, {throughput} infer/s"
    grew = success_count(ids_server, ids_model) - before
    assert grew >= sum(c for c, _ in found.values()), f"the server counted {grew} more; perf_analyzer measured {found}"


def test_perf_analyzer_on_a_model_with_a_tokenizer(server, text_model, tmp_path):
    """The same run on a model that also takes text (an optional BYTES input `text` next to
    input_ids): perf_analyzer must be able to drive it with token ids alone."""
    before = success_count(server, text_model)
    found = measured(run(server, text_model, tmp_path, concurrency="1:2"))
    assert sorted(found) == [1, 2] and all(c > 0 and t > 0 for c, t in found.values()), found
    assert success_count(server, text_model) - before >= sum(c for c, _ in found.values())

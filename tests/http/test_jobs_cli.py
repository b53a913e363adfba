"""The client package's batch command (client/python/fastformer_client/jobs.py, issue 50):
`python -m fastformer_client.jobs submit FILE --url ...` uploads a JSONL file of requests, runs it
as a batch with its progress on stderr, downloads the output and prints its path; a file the
server refuses exits 2 with its message, a batch that fails validation exits 1 with its errors.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, Server, call


@pytest.fixture(scope="module")
def srv(text_model, logs, tmp_path_factory):
    s = Server(text_model.dir, logs, "jobs-cli", **{"jobs-dir": tmp_path_factory.mktemp("jobs")}).wait_ready()
    yield s
    s.stop()


def run_cli(srv, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO / "client" / "python")}
    return subprocess.run([sys.executable, "-m", "fastformer_client.jobs", "submit", *map(str, args),
                           "--url", srv.base, "--poll", "0.05"], capture_output=True, text=True, env=env,
                          timeout=300)


def requests_file(path, n, model, duplicate=False):
    lines = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
              "body": {"model": model, "input": f"the lazy dog number {i}"}} for i in range(n)]
    if duplicate:
        lines.append(lines[0])
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def test_submit_runs_the_batch_and_downloads_its_output(srv, tmp_path):
    model = call(srv.http_port, "GET", "/v1/models").json()["data"][0]["id"]
    done = run_cli(srv, requests_file(tmp_path / "corpus.jsonl", 300, model))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "corpus.output.jsonl"
    assert done.stdout.strip() == str(out)
    answers = [json.loads(x) for x in out.read_text().splitlines()]
    assert sorted(a["custom_id"] for a in answers) == sorted(f"doc-{i}" for i in range(300))
    assert all(a["response"]["status_code"] == 200 for a in answers)
    assert "uploaded" in done.stderr and "300/300 lines" in done.stderr and "tokens/s" in done.stderr


def test_refusals_exit_with_the_servers_words(srv, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    done = run_cli(srv, bad)
    assert done.returncode == 2 and "file: line 1 is not a JSON object" in done.stderr, done.stderr
    model = call(srv.http_port, "GET", "/v1/models").json()["data"][0]["id"]
    done = run_cli(srv, requests_file(tmp_path / "dup.jsonl", 3, model, duplicate=True))
    assert done.returncode == 1 and "line 4: duplicate_custom_id" in done.stderr, done.stderr
    assert "failed" in done.stderr

"""OpenAI's Batch API on our server (issue 50, docs/api.md "Batches"), through the real openai SDK:
files.create, batches.create, batches.retrieve until completed, files.content of the output and
error files. Every answer equals what POST /v1/embeddings answers for the same body (within the
engine's batch-invariance bound), refused lines land in the error file and the batch goes on;
an input that fails validation fails the batch with OpenAI's errors; cancel; expiry; and a server
killed with SIGKILL at five points of a batch, restarted each time on the same --jobs-dir, finishes
it with exactly one answer per custom_id.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time

import numpy as np
import openai
import pytest

from conftest import Server, call

WORDS = ["hello", "world", "the", "lazy", "dog", "cafe", "!", ","]


def line(i: int, model: str) -> dict:
    """Request i: mostly texts, every 7th a late-chunked pair, every 100th refused (an unknown model)."""
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(1 + i % 9))
    body = {"model": model, "input": text}
    if i % 7 == 3:
        body = {"model": model, "input": [text, "the lazy dog"], "late_chunking": True}
    if i % 100 == 11:
        body = {"model": "no-such-model", "input": text}
    return {"custom_id": f"request-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}


def jsonl(lines) -> bytes:
    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def client(srv):
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key="dummy", max_retries=0, timeout=60)


def wait_done(c, batch_id, timeout=120.0):
    end = time.monotonic() + timeout
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        assert time.monotonic() < end, f"batch {batch_id} still {b.status}: {b.request_counts}"
        time.sleep(0.1)


def read_jsonl(c, file_id) -> list:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).content.decode().splitlines() if x.strip()]


def model_name(srv) -> str:
    return call(srv.http_port, "GET", "/v1/models").json()["data"][0]["id"]


def check_answers(srv, requests: dict, output: list, errors: list):
    """One answer per custom_id; each output body as /v1/embeddings answers the same body."""
    seen = [x["custom_id"] for x in output + errors]
    assert sorted(seen) == sorted(requests), "each custom_id exactly once"
    for x in output:
        assert x["response"]["status_code"] == 200 and x["error"] is None
        live = call(srv.http_port, "POST", "/v1/embeddings", requests[x["custom_id"]]["body"]).json()
        got = [d["embedding"] for d in x["response"]["body"]["data"]]
        want = [d["embedding"] for d in live["data"]]
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-6)
        assert x["response"]["body"]["usage"] == live["usage"]
    for x in errors:
        assert x["response"]["status_code"] == 404, x
        assert "no-such-model" in x["response"]["body"]["error"]["message"]


@pytest.fixture(scope="module")
def srv(text_model, logs, tmp_path_factory):
    s = Server(text_model.dir, logs, "batches", **{"jobs-dir": tmp_path_factory.mktemp("jobs")}).wait_ready()
    yield s
    s.stop()


def test_a_batch_through_the_openai_sdk_answers_as_the_live_route(srv):
    c = client(srv)
    model = model_name(srv)
    lines = [line(i, model) for i in range(2000)]  # the acceptance's 2,000: 1,980 answers, 20 refusals
    f = c.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h",
                         metadata={"corpus": "test"})
    assert b.status == "validating" and b.metadata == {"corpus": "test"}
    done = wait_done(c, b.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 2000
    assert done.request_counts.completed == 1980 and done.request_counts.failed == 20
    assert done.completed_at >= done.finalizing_at >= done.in_progress_at >= done.created_at
    assert done.usage.input_tokens > 0
    check_answers(srv, {x["custom_id"]: x for x in lines}, read_jsonl(c, done.output_file_id),
                  read_jsonl(c, done.error_file_id))
    assert b.id in [x.id for x in c.batches.list().data]
    # The metrics (docs/metrics.md): lines by outcome, none left in flight, batches by status;
    # promtool accepts the page.
    page = srv.scrape()
    values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in page.splitlines()
              if ln.startswith("fastformer_job")}
    assert values['fastformer_job_lines_total{outcome="completed"}'] >= 1980
    assert values['fastformer_job_lines_total{outcome="failed"}'] >= 20
    assert values["fastformer_job_lines_in_flight"] == 0
    assert values["fastformer_job_queued_tokens"] == 0
    assert values['fastformer_jobs{status="completed"}'] >= 1
    assert values['fastformer_jobs{status="in_progress"}'] == 0
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: install Debian's prometheus package (deploy/install-deps.sh)"
    check = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_validation_failure_and_bad_requests(srv):
    c = client(srv)
    model = model_name(srv)
    dup = [line(1, model), line(2, model), line(1, model)]
    f = c.files.create(file=("dup.jsonl", jsonl(dup)), purpose="batch")
    b = wait_done(c, c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h").id)
    assert b.status == "failed"
    assert [(e.code, e.line) for e in b.errors.data] == [("duplicate_custom_id", 3)]
    assert b.output_file_id is None
    with pytest.raises(openai.NotFoundError):
        c.batches.create(input_file_id="file-000000000000000000000000", endpoint="/v1/embeddings",
                         completion_window="24h")
    with pytest.raises(openai.BadRequestError) as e:
        c.batches.create(input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert "only /v1/embeddings" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        c.batches.cancel(b.id)  # a finished batch
    with pytest.raises(openai.NotFoundError):
        c.batches.retrieve("batch_nope")


def test_cancel_marks_the_lines_not_run(srv):
    c = client(srv)
    model = model_name(srv)
    lines = [line(i, model) for i in range(3000)]
    f = c.files.create(file=("big.jsonl", jsonl(lines)), purpose="batch")
    b = c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    while c.batches.retrieve(b.id).status == "validating":
        time.sleep(0.01)
    cancelled = c.batches.cancel(b.id)
    assert cancelled.status in ("cancelling", "cancelled")
    done = wait_done(c, b.id)
    assert done.status == "cancelled"
    output, errors = read_jsonl(c, done.output_file_id), read_jsonl(c, done.error_file_id)
    assert sorted(x["custom_id"] for x in output + errors) == sorted(x["custom_id"] for x in lines)
    unrun = [x for x in errors if x["response"] is None]
    assert unrun and all(x["error"]["code"] == "batch_cancelled" for x in unrun)


def test_killed_at_five_points_and_restarted_every_line_is_answered_once(text_model, logs, tmp_path):
    """kill -9 at five points of one batch, each followed by a restart on the same --jobs-dir:
    during validation, early (files synced, the first commit not made), in the middle (SIGKILL
    from outside), just after a line's answer is written (not yet synced), and while finalizing.
    The server's crash-test hook (FASTFORMER_JOBS_TEST_KILL_AT=<step>:<line>) raises SIGKILL itself
    at the exact step; the batch ends completed with exactly one line per custom_id."""
    jobs = tmp_path / "jobs"
    n = 600

    def server(name, kill_at=None):
        env = {"FASTFORMER_JOBS_TEST_KILL_AT": kill_at} if kill_at else None
        return Server(text_model.dir, logs, f"batches-{name}", env_extra=env, **{"jobs-dir": jobs})

    def killed(s):
        assert s.wait_exit(120) == -signal.SIGKILL, s.log_tail()
        return s.log_text()

    s = server("validating", "validating:300").wait_ready()
    c = client(s)
    model = model_name(s)
    lines = [line(i, model) for i in range(n)]
    f = c.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    try:  # the kill may come before the answer: the batch is committed before it is run
        c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
    except openai.APIConnectionError:
        pass
    killed(s)
    killed(server("early", "synced:64"))
    s = server("middle").wait_ready()
    c = client(s)
    [b] = c.batches.list().data
    while c.batches.retrieve(b.id).request_counts.completed < 250:
        time.sleep(0.01)
    s.signal(signal.SIGKILL)
    killed(s)
    log = killed(server("written", "written:450"))
    assert f"batch {b.id}: resuming in_progress at input line" in log, log[-4000:]
    killed(server("finalizing", "finalizing:0"))
    s = server("restarted").wait_ready()
    try:
        c = client(s)
        done = wait_done(c, b.id, timeout=300)
        assert done.status == "completed", done
        assert done.request_counts.completed + done.request_counts.failed == n
        output, errors = read_jsonl(c, done.output_file_id), read_jsonl(c, done.error_file_id)
        check_answers(s, {x["custom_id"]: x for x in lines}, output, errors)
    finally:
        s.stop()


def test_expiry_ends_a_batch_with_its_finished_lines_downloadable(text_model, logs, tmp_path):
    """A window of one second (--jobs-completion-window-s, the test flag): the batch ends
    expired, the lines it finished are in its output, the rest are batch_expired."""
    s = Server(text_model.dir, logs, "batches-expiry",
               **{"jobs-dir": tmp_path / "jobs", "jobs-completion-window-s": 1}).wait_ready()
    try:
        c = client(s)
        model = model_name(s)
        lines = [line(i, model) for i in range(20000)]
        f = c.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
        b = c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
        assert b.expires_at - b.created_at == 1
        done = wait_done(c, b.id, timeout=120)
        assert done.status == "expired", done
        assert done.expired_at >= b.expires_at
        output, errors = read_jsonl(c, done.output_file_id), read_jsonl(c, done.error_file_id)
        assert sorted(x["custom_id"] for x in output + errors) == sorted(x["custom_id"] for x in lines)
        expired = [x for x in errors if x["response"] is None]
        assert expired and all(x["error"]["code"] == "batch_expired" for x in expired)
        assert done.request_counts.completed == len(output)
    finally:
        s.stop()


def test_a_cohere_v2_embed_batch_answers_as_the_live_route(srv):
    """endpoint "/v2/embed": each line's body is Cohere's, run through POST /v2/embed itself; the
    output holds Cohere's answers, a refused line Cohere's error shape."""
    c = client(srv)
    model = model_name(srv)
    lines = []
    for i in range(20):
        body = {"model": model, "texts": [" ".join(WORDS[: 1 + i % 8]), "the lazy dog"],
                "input_type": "search_document", "embedding_types": ["float", "ubinary"]}
        if i == 13:
            body = {"model": model, "texts": ["a"], "input_type": "poetry"}
        lines.append({"custom_id": f"cohere-{i}", "method": "POST", "url": "/v2/embed", "body": body})
    f = c.files.create(file=("cohere.jsonl", jsonl(lines)), purpose="batch")
    done = wait_done(c, c.batches.create(input_file_id=f.id, endpoint="/v2/embed", completion_window="24h").id)
    assert done.status == "completed", done
    assert (done.request_counts.completed, done.request_counts.failed) == (19, 1), read_jsonl(c, done.error_file_id)[:2]
    output, errors = read_jsonl(c, done.output_file_id), read_jsonl(c, done.error_file_id)
    by_id = {x["custom_id"]: x for x in lines}
    for x in output:
        live = call(srv.http_port, "POST", "/v2/embed", by_id[x["custom_id"]]["body"]).json()
        got = x["response"]["body"]
        np.testing.assert_allclose(np.array(got["embeddings"]["float"]), np.array(live["embeddings"]["float"]),
                                   rtol=1e-5, atol=1e-6)
        assert [len(r) for r in got["embeddings"]["ubinary"]] == [len(r) for r in live["embeddings"]["ubinary"]]
        assert got["meta"]["billed_units"] == live["meta"]["billed_units"]
    assert done.usage.input_tokens == sum(x["response"]["body"]["meta"]["billed_units"]["input_tokens"]
                                          for x in output)
    [refused] = errors
    assert refused["custom_id"] == "cohere-13" and refused["response"]["status_code"] == 400
    assert "input_type" in refused["response"]["body"]["message"]

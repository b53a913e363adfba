"""OpenAI's Files API on our server (issue 50, docs/api.md "Files"): the real openai SDK uploads a
batch input file (multipart/form-data, streamed to disk), lists, retrieves, downloads and deletes
it; a second server on the same --jobs-dir is refused; and each bad upload gets a 4xx in
OpenAI's error shape: malformed multipart, a file over --jobs-max-file-bytes, a file that is not
JSON lines, a purpose other than batch, an unknown id, and with a token every route is 401
without it. A path-like file name is shown as sent and never becomes a path.
"""

from __future__ import annotations

import json

import openai
import pytest

from conftest import Server, call

LINES = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                     "body": {"model": "m", "input": f"text {i}"}}) for i in range(5)]
CONTENT = ("\n".join(LINES) + "\n").encode()


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("jobs")


@pytest.fixture(scope="module")
def srv(text_model, logs, jobs_dir):
    s = Server(text_model.dir, logs, "files", **{"jobs-dir": jobs_dir, "jobs-max-file-bytes": 4096}).wait_ready()
    yield s
    s.stop()


def client(srv, **kw):
    return openai.OpenAI(base_url=f"{srv.base}/v1", api_key=kw.pop("api_key", "dummy"), max_retries=0,
                         timeout=30, **kw)


def multipart(parts, boundary="b0und4ry"):
    body = b""
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename is not None else "")
        body += f"--{boundary}\r\nContent-Disposition: {disp}\r\n\r\n".encode() + value + b"\r\n"
    return body + f"--{boundary}--\r\n".encode(), {"Content-Type": f"multipart/form-data; boundary={boundary}"}


def test_the_openai_sdk_uploads_lists_downloads_and_deletes(srv, jobs_dir):
    c = client(srv)
    f = c.files.create(file=("requests.jsonl", CONTENT), purpose="batch")
    assert f.id.startswith("file-") and f.object == "file"
    assert f.bytes == len(CONTENT) and f.filename == "requests.jsonl" and f.purpose == "batch"
    assert f.expires_at - f.created_at == 30 * 24 * 3600
    assert c.files.retrieve(f.id).bytes == len(CONTENT)
    assert c.files.content(f.id).content == CONTENT
    second = c.files.create(file=("more.jsonl", CONTENT), purpose="batch",
                            extra_body={"expires_after": {"anchor": "created_at", "seconds": 7200}})
    assert second.expires_at - second.created_at == 7200  # expires_after[...] as the SDK sends it
    listed = c.files.list()
    ids = [x.id for x in listed.data]
    assert ids[:2] == [second.id, f.id]  # newest first
    assert [x.id for x in c.files.list(order="asc").data][-2:] == [f.id, second.id]
    assert (jobs_dir / "files" / f.id).read_bytes() == CONTENT  # stored under its id
    deleted = c.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError) as e:
        c.files.retrieve(f.id)
    assert f"No such File object: {f.id}" in str(e.value)
    assert not (jobs_dir / "files" / f.id).exists()


def test_a_path_like_file_name_is_only_a_name(srv, jobs_dir):
    f = client(srv).files.create(file=("../../etc/passwd", CONTENT), purpose="batch")
    assert f.filename == "../../etc/passwd"
    assert (jobs_dir / "files" / f.id).read_bytes() == CONTENT
    assert sorted(p.name for p in jobs_dir.parent.iterdir() if p.name == "etc") == []


def test_bad_uploads_are_4xx_in_openais_shape(srv):
    c = client(srv)
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(file=("x.jsonl", b"not json\n"), purpose="batch")
    assert "file: line 1 is not a JSON object" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.files.create(file=("x.jsonl", CONTENT), purpose="fine-tune")
    assert "purpose: 'fine-tune' is not served here" in str(e.value)
    with pytest.raises(openai.APIStatusError) as e:
        c.files.create(file=("big.jsonl", (LINES[0] + "\n").encode() * 100), purpose="batch")
    assert e.value.status_code == 413
    assert "over the limit of 4096 bytes (--jobs-max-file-bytes)" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        c.files.content("file-000000000000000000000000")

    body, headers = multipart([("purpose", b"batch", None)])
    r = call(srv.http_port, "POST", "/v1/files", body[:-5], headers)  # cut before its end
    assert r.status == 400 and r.json()["error"]["message"].startswith("multipart: "), r.body
    r = call(srv.http_port, "POST", "/v1/files", body, headers)
    assert r.status == 400 and r.json()["error"]["message"] == "file: is required (the file part)"
    r = call(srv.http_port, "POST", "/v1/files", b"{}", {"Content-Type": "application/json"})
    assert r.status == 400 and r.json()["error"]["message"].startswith("Content-Type: "), r.body


def test_a_second_server_on_the_directory_is_refused(srv, text_model, logs, jobs_dir):
    second = Server(text_model.dir, logs, "files-second", **{"jobs-dir": jobs_dir})
    assert second.wait_exit(30) != 0
    assert "is in use by another fastformer-server" in second.log_text()


def test_without_jobs_dir_the_routes_say_how_to_turn_them_on(text_model, logs):
    s = Server(text_model.dir, logs, "files-off").wait_ready()
    try:
        r = s.call("GET", "/v1/files")
        assert r.status == 501 and "--jobs-dir" in r.json()["error"]["message"], r.body
    finally:
        s.stop()


def test_with_a_token_every_files_and_batches_route_is_401_without_it(text_model, logs, tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    s = Server(text_model.dir, logs, "files-auth", **{"jobs-dir": tmp_path / "jobs",
                                                      "auth-token-file": token}).wait_ready()
    try:
        body, headers = multipart([("purpose", b"batch", None), ("file", CONTENT, "a.jsonl")])
        for method, path, b, h in [("POST", "/v1/files", body, headers), ("GET", "/v1/files", None, None),
                                   ("GET", "/v1/files/file-000000000000000000000000", None, None),
                                   ("GET", "/v1/files/file-000000000000000000000000/content", None, None),
                                   ("DELETE", "/v1/files/file-000000000000000000000000", None, None),
                                   ("POST", "/v1/batches", b'{"input_file_id": "file-000000000000000000000000", '
                                    b'"endpoint": "/v1/embeddings", "completion_window": "24h"}',
                                    {"Content-Type": "application/json"}),
                                   ("GET", "/v1/batches", None, None), ("GET", "/v1/batches/batch_x", None, None),
                                   ("POST", "/v1/batches/batch_x/cancel", b"", None)]:
            r = call(s.http_port, method, path, b, h)
            assert r.status == 401, (method, path, r.status, r.body)
        f = client(s, api_key="s3cret").files.create(file=("a.jsonl", CONTENT), purpose="batch")
        assert f.bytes == len(CONTENT)
    finally:
        s.stop()

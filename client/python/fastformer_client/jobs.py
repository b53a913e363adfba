"""Bulk embedding jobs from the command line: a JSONL file of OpenAI batch requests through
fastformer-server's Files and Batch APIs (--jobs-dir; docs/api.md "Batches"), over HTTP with the
standard library only.

    python -m fastformer_client.jobs submit requests.jsonl [--url http://127.0.0.1:8000]
        [--token-file FILE | --token T] [--out OUT] [--poll 1.0]

uploads the file (streamed: POST /v1/files, purpose=batch), makes the batch (endpoint
/v1/embeddings, window 24h), shows its progress on stderr (lines done of total, lines and tokens
a second, time left) until it ends, downloads the output file to OUT (default: the input's name
with .output.jsonl) and the error file beside it (.errors.jsonl) when there is one, and prints the
output's path. Exit status: 0 completed, 1 any other end (failed, expired, cancelled: its errors
are printed), 2 a refusal (the upload or the batch), with the server's message.

A line of requests.jsonl: {"custom_id": "doc-1", "method": "POST", "url": "/v1/embeddings",
"body": {"model": "...", "input": "..."}}; every extension of /v1/embeddings works in a body.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

FINISHED = ("completed", "failed", "expired", "cancelled")


class JobError(Exception):
    """A refusal by the server: its status and message."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class JobsClient:
    """The Files and Batch APIs of one server (`url`: http://host:port), with its bearer token."""

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 60.0):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url: expected http://host:port, got {url!r}")
        self.scheme, self.host, self.timeout = parts.scheme, parts.hostname, timeout
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _connection(self) -> http.client.HTTPConnection:
        cls = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def _request(self, method: str, path: str, body=None, headers=None) -> http.client.HTTPResponse:
        conn = self._connection()
        conn.request(method, path, body=body, headers={**self.headers, **(headers or {})})
        response = conn.getresponse()
        if response.status >= 400:
            raw = response.read()
            try:
                message = json.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = raw.decode(errors="replace")
            conn.close()
            raise JobError(response.status, message)
        return response

    def _json(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        with self._request(method, path, data, headers) as r:
            return json.loads(r.read())

    def upload(self, path: Path) -> dict:
        """POST /v1/files: the file streamed from disk as multipart/form-data, purpose=batch."""
        boundary = uuid.uuid4().hex
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n"
                f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
                f"filename={json.dumps(path.name)}\r\nContent-Type: application/jsonl\r\n\r\n").encode()
        tail = f"\r\n--{boundary}--\r\n".encode()
        size = len(head) + path.stat().st_size + len(tail)

        def body():
            yield head
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk
            yield tail

        headers = {"Content-Type": f"multipart/form-data; boundary={boundary}", "Content-Length": str(size)}
        with self._request("POST", "/v1/files", body(), headers) as r:
            return json.loads(r.read())

    def create_batch(self, input_file_id: str, metadata: Optional[dict] = None) -> dict:
        body = {"input_file_id": input_file_id, "endpoint": "/v1/embeddings", "completion_window": "24h"}
        if metadata:
            body["metadata"] = metadata
        return self._json("POST", "/v1/batches", body)

    def batch(self, batch_id: str) -> dict:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def download(self, file_id: str, out: Path) -> Path:
        """GET /v1/files/{id}/content, streamed to `out`."""
        with self._request("GET", f"/v1/files/{file_id}/content") as r, open(out, "wb") as f:
            while chunk := r.read(1 << 20):
                f.write(chunk)
        return out


def progress_line(batch: dict, started: float, tokens0: int, lines0: int) -> str:
    """'[#####.....] 1,200/2,000 lines  850 lines/s  12,345 tokens/s  1 s left  in_progress'."""
    counts = batch.get("request_counts") or {}
    total, done = counts.get("total") or 0, (counts.get("completed") or 0) + (counts.get("failed") or 0)
    elapsed = max(time.monotonic() - started, 1e-6)
    lines_s = (done - lines0) / elapsed
    tokens_s = ((batch.get("usage") or {}).get("total_tokens", 0) - tokens0) / elapsed
    width = 30
    filled = int(width * done / total) if total else 0
    left = f"{(total - done) / lines_s:,.0f} s left" if lines_s > 0 and total else "-"
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} lines  {lines_s:,.0f} lines/s  "
            f"{tokens_s:,.0f} tokens/s  {left}  {batch.get('status')}")


def submit(client: JobsClient, path: Path, out: Optional[Path], poll: float, stream=sys.stderr) -> int:
    try:
        f = client.upload(path)
        b = client.create_batch(f["id"])
    except JobError as e:
        print(f"refused: {e}", file=stream)
        return 2
    print(f"uploaded {path} as {f['id']} ({f['bytes']:,} bytes); batch {b['id']}", file=stream)
    started, lines0, tokens0 = time.monotonic(), 0, 0
    while b["status"] not in FINISHED:
        time.sleep(poll)
        b = client.batch(b["id"])
        print("\r" + progress_line(b, started, tokens0, lines0), end="", file=stream, flush=True)
    print(file=stream)
    out = out or path.with_name(path.stem + ".output.jsonl")
    if b.get("output_file_id"):
        client.download(b["output_file_id"], out)
    if b.get("error_file_id"):
        errors = client.download(b["error_file_id"], out.with_name(path.stem + ".errors.jsonl"))
        print(f"errors: {errors}", file=stream)
    if b["status"] != "completed":
        for e in ((b.get("errors") or {}).get("data") or []):
            print(f"line {e.get('line')}: {e.get('code')}: {e.get('message')}", file=stream)
        print(f"batch {b['id']} {b['status']}", file=stream)
        return 1
    print(out)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fastformer_client.jobs", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("submit", help="upload a JSONL file of requests, run it as a batch, download the output")
    s.add_argument("file", type=Path)
    s.add_argument("--url", default=os.environ.get("FASTFORMER_URL", "http://127.0.0.1:8000"))
    s.add_argument("--token", default=os.environ.get("FASTFORMER_TOKEN"))
    s.add_argument("--token-file", type=Path)
    s.add_argument("--out", type=Path, help="where the output goes (default: FILE's stem + .output.jsonl)")
    s.add_argument("--poll", type=float, default=1.0, help="seconds between progress checks")
    a = ap.parse_args(argv)
    token = a.token_file.read_text().strip() if a.token_file else a.token
    return submit(JobsClient(a.url, token), a.file, a.out, a.poll)


if __name__ == "__main__":
    sys.exit(main())

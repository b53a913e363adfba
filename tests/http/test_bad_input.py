"""Bad input on the HTTP listener, each sent while good /v1/embeddings requests run from four
threads: the bad request gets its API's status and a message naming the field or the limit,
every good request still gets 200 and the right embedding, and /health is 200 afterwards.
Transport abuse (a header that never ends, a broken chunked body, a body over the limit, headers
over 64 KiB) goes through raw sockets."""

from __future__ import annotations

import json
import socket
import time

import pytest

from conftest import TEXT, TEXTS, V, Load, Server, assert_close, ids

BIG_TEXT = " ".join(["dog"] * 40)  # 42 tokens with [CLS] and [SEP]


@pytest.fixture(scope="module")
def limited(text_model, logs):
    """A server with small limits: 4 inputs, 32 tokens, 4096-byte bodies, 1 s for headers."""
    srv = Server(text_model.dir, logs, "limited", max_request_inputs=4, max_request_tokens=32,
                 http_max_body_bytes=4096, http_header_timeout_s=1).wait_ready()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def auth(text_model, logs, tmp_path_factory):
    tokens = tmp_path_factory.mktemp("auth") / "tokens"
    tokens.write_text("good-token\n")
    srv = Server(text_model.dir, logs, "bad-input-auth", auth_token_file=tokens).wait_ready()
    yield srv
    srv.stop()


@pytest.fixture
def target(request, server, ids_server, limited, auth, text_model, ids_model):
    """target(name) -> (server, Load of good requests on it)."""

    def _target(name):
        if name == "ids":
            seq = [5, 6, 7, 8, 9]
            return ids_server, Load(ids_server, seq, ids_model.unit(seq))
        srv = {"main": server, "limited": limited, "auth": auth}[name]
        headers = {"Authorization": "Bearer good-token"} if name == "auth" else {}
        return srv, Load(srv, TEXT, text_model.unit(TEXTS[TEXT]), headers=headers)

    return _target


J = {"Content-Type": "application/json"}


def body(obj) -> bytes:
    return json.dumps(obj).encode()


# name: (target, method, path, body, headers, status, substrings of the message, other checks on the JSON)
CASES = {
    "openai malformed json": ("main", "POST", "/v1/embeddings", b'{"input": "a",', J, 400, ["not valid JSON"], {}),
    "tei malformed json": ("main", "POST", "/embed", b'{"inputs": [', J, 422, ["not valid JSON"],
                           {"error_type": "Validation"}),
    "kserve malformed json": ("main", "POST", "/v2/models/http-text/infer", b"{inputs", J, 400, ["not valid JSON"], {}),
    "body not an object": ("main", "POST", "/v1/embeddings", b"[1, 2]", J, 400, ["JSON object", "array"], {}),
    "input missing": ("main", "POST", "/v1/embeddings", body({"model": "http-text"}), J, 400, ["input: is required"],
                      {"param": "input"}),
    "input: 5": ("main", "POST", "/v1/embeddings", body({"input": 5}), J, 400, ["input:", "integer"],
                 {"param": "input", "type": "invalid_request_error"}),
    "inputs: 5": ("main", "POST", "/embed", body({"inputs": 5}), J, 422, ["inputs:", "integer"], {}),
    "input: [1.5]": ("main", "POST", "/v1/embeddings", body({"input": [[1, 2], [3.5]]}), J, 400,
                     ["input[1]", "integers"], {}),
    "input: [text, ids]": ("main", "POST", "/v1/embeddings", body({"input": ["a", [1, 2]]}), J, 400,
                           ["input[1]", "mixes"], {}),
    "empty input list": ("main", "POST", "/v1/embeddings", body({"input": []}), J, 400, ["input: is empty"], {}),
    "empty inputs list": ("main", "POST", "/embed", body({"inputs": []}), J, 422, ["inputs: is empty"], {}),
    "empty string": ("main", "POST", "/v1/embeddings", body({"input": ""}), J, 400, ["input", "empty"], {}),
    "empty string in a list": ("main", "POST", "/v1/embeddings", body({"input": ["the dog", ""]}), J, 400,
                               ["input[1]", "empty"], {}),
    "tei empty string": ("main", "POST", "/embed", body({"inputs": ""}), J, 422, ["inputs", "empty"], {}),
    "token id out of vocab": ("main", "POST", "/v1/embeddings", body({"input": [[5, 6], [7, 1000]]}), J, 400,
                              ["input[1]", "1000", "vocab_size"], {}),
    "encoding_format": ("main", "POST", "/v1/embeddings", body({"input": "a", "encoding_format": "int8"}), J, 400,
                        ["encoding_format"], {"param": "encoding_format"}),
    "dimensions: 0": ("main", "POST", "/v1/embeddings", body({"input": "a", "dimensions": 0}), J, 400,
                      ["dimensions"], {"param": "dimensions"}),
    "dimensions over hidden": ("main", "POST", "/v1/embeddings", body({"input": "a", "dimensions": 65}), J, 400,
                               ["dimensions", "65", "hidden_size 64"], {"param": "dimensions"}),
    "model: 3": ("main", "POST", "/v1/embeddings", body({"input": "a", "model": 3}), J, 400, ["model:"], {}),
    "unknown model": ("main", "POST", "/v1/embeddings", body({"input": "a", "model": "gpt-4"}), J, 404,
                      ["model:", "gpt-4"], {"code": "model_not_found", "param": "model", "type": "not_found_error"}),
    "kserve unknown model": ("main", "POST", "/v2/models/gpt-4/infer",
                             body({"inputs": [{"name": "input_ids", "shape": [1, 1], "datatype": "INT64",
                                               "data": [5]}]}), J, 404, ["gpt-4"], {}),
    "predict pair": ("main", "POST", "/predict", body({"inputs": ["a", "b"]}), J, 422, ["inputs", "pair"], {}),
    "not utf-8 (openai)": ("main", "POST", "/v1/embeddings", b'{"input": "ab\xffcd"}', J, 400, ["UTF-8"], {}),
    "not utf-8 (tei)": ("main", "POST", "/embed", b'{"inputs": ["ok", "ab\xff"]}', J, 422, ["UTF-8"], {}),
    "not utf-8 (kserve)": ("main", "POST", "/v2/models/http-text/infer",
                           b'{"inputs":[{"name":"text","shape":[1],"datatype":"BYTES","data":["\xfe"]}]}', J, 400,
                           ["UTF-8"], {}),
    "text without a tokenizer": ("ids", "POST", "/v1/embeddings", body({"input": "hello"}), J, 400,
                                 ["input", "tokenizer"], {}),
    "tei text without a tokenizer": ("ids", "POST", "/embed", body({"inputs": ["hello", "world"]}), J, 422,
                                     ["inputs[0]", "tokenizer"], {}),
    "kserve text without a tokenizer": ("ids", "POST", "/v2/models/http-ids/infer",
                                        body({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                                          "data": ["hello"]}]}), J, 400, ["text"], {}),
    "too many inputs": ("limited", "POST", "/v1/embeddings", body({"input": ["the dog"] * 5}), J, 400,
                        ["input", "5", "max_request_inputs 4"], {}),
    "tei too many inputs": ("limited", "POST", "/embed", body({"inputs": [[5, 6]] * 5}), J, 422,
                            ["inputs", "max_request_inputs 4"], {}),
    "tokenize too many inputs": ("limited", "POST", "/tokenize", body({"inputs": ["a"] * 5}), J, 422,
                                 ["inputs", "max_request_inputs 4"], {}),
    "kserve too many rows": ("limited", "POST", "/v2/models/http-text/infer",
                             body({"inputs": [{"name": "input_ids", "shape": [5, 2], "datatype": "INT64",
                                               "data": [5, 6] * 5}]}), J, 400, ["max_request_inputs 4"], {}),
    "too many tokens": ("limited", "POST", "/v1/embeddings", body({"input": BIG_TEXT}), J, 400,
                        ["input", "42 tokens", "max_request_tokens 32"], {}),
    "too many tokens over rows": ("limited", "POST", "/embed", body({"inputs": [" ".join(["dog"] * 13)] * 3}), J,
                                  422, ["inputs", "45 tokens", "max_request_tokens 32"], {}),
    "body over the limit": ("limited", "POST", "/v1/embeddings", body({"input": "dog " * 1200}), J, 413,
                            ["4096", "--http-max-body-bytes"], {}),
    "tei body over the limit": ("limited", "POST", "/embed", body({"inputs": "dog " * 1200}), J, 413,
                                ["4096", "--http-max-body-bytes"], {}),
    "wrong key": ("auth", "POST", "/v1/embeddings", body({"input": "a"}), {**J, "Authorization": "Bearer nope"}, 401,
                  [], {"code": "invalid_api_key", "type": "authentication_error"}),
    "no key": ("auth", "POST", "/v1/embeddings", body({"input": "a"}), J, 401, [], {"code": "invalid_api_key"}),
    "tei wrong key": ("auth", "POST", "/embed", body({"inputs": "a"}), {**J, "Authorization": "Bearer nope"}, 401,
                      [], {"error_type": "Unauthorized"}),
    "kserve wrong key": ("auth", "GET", "/v2/models/http-text", None, {"Authorization": "Bearer nope"}, 401, [], {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_request_under_load(target, name):
    where, method, path, data, headers, status, words, fields = CASES[name]
    srv, load = target(where)
    with load:
        for _ in range(3):
            r = srv.call(method, path, data, headers)
            assert r.status == status, f"{name}: HTTP {r.status} (expected {status}): {r.body[:400]!r}"
            msg = r.error_message()
            for w in words:
                assert w in msg, f"{name}: {w!r} not in the message {msg!r}"
            err = r.json()["error"]
            for k, v in fields.items():
                got = err.get(k) if isinstance(err, dict) else r.json().get(k)
                assert got == v, f"{name}: {k} = {got!r}, expected {v!r} ({r.body[:300]!r})"
            if status == 401:
                assert r.headers.get("www-authenticate", "").lower().startswith("bearer")
            load.wait_each(1)
    if where == "auth":  # health stays open without a token
        assert srv.call("GET", "/health").status == 200
        assert srv.call("GET", "/v2/health/ready").status == 200


# ----------------------------------------------------------------------------- raw sockets


def read_until_closed(sock, limit_s=10.0) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return data
        if not chunk:
            return data
        data += chunk


def parse(raw: bytes):
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)}
    return status, headers, rest


def test_slow_header_is_cut_off_while_others_are_served(target):
    srv, load = target("limited")
    with load:
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        try:
            t0 = time.monotonic()
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\n")
            s.settimeout(0.5)
            closed_after, answer = None, b""
            while time.monotonic() - t0 < 6:
                try:
                    chunk = s.recv(4096)
                    if not chunk:
                        closed_after = time.monotonic() - t0
                        break
                    answer += chunk
                except socket.timeout:
                    pass
                except ConnectionResetError:
                    closed_after = time.monotonic() - t0
                    break
                try:
                    s.sendall(b"X")  # one more byte of a header line that never ends
                except (BrokenPipeError, ConnectionResetError):
                    closed_after = time.monotonic() - t0
                    break
            assert closed_after is not None, "the server kept a 6 s header open (--http-header-timeout-s 1)"
            assert 0.8 <= closed_after <= 3.0, f"closed after {closed_after:.2f} s (--http-header-timeout-s 1)"
            assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer[:200]
        finally:
            s.close()
        load.wait_each(2)


@pytest.mark.parametrize("where", ["main", "limited"])
def test_bad_chunk_size_is_400(target, where):
    srv, load = target(where)
    with load:
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        try:
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
            status, headers, rest = parse(read_until_closed(s))
        finally:
            s.close()
        assert status == 400, (status, rest[:300])
        assert headers.get("connection", "").lower() == "close"
        err = json.loads(rest)
        assert "chunk" in err["error"] and err["error"].startswith("malformed HTTP request"), err


def test_good_chunked_body_is_read(target, text_model):
    srv, load = target("main")
    payload = body({"inputs": TEXT})
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(payload[i:i + 7]), payload[i:i + 7]) for i in range(0, len(payload), 7))
    with load:
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        try:
            s.sendall(b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunks + b"0\r\n\r\n")
            status, _, rest = parse(read_until_closed(s))
        finally:
            s.close()
    assert status == 200, rest[:300]
    assert_close(json.loads(rest)[0], text_model.unit(TEXTS[TEXT]))


def test_chunked_body_over_the_limit_is_413(target):
    srv, load = target("limited")
    with load:
        s = socket.create_connection(("127.0.0.1", srv.http_port), timeout=5)
        try:
            s.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\n")
            for _ in range(5):
                try:
                    s.sendall(b"400\r\n" + b" " * 0x400 + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    break
            status, _, rest = parse(read_until_closed(s))
        finally:
            s.close()
        assert status == 413, rest[:300]
        assert "--http-max-body-bytes" in json.loads(rest)["error"]["message"]


def test_headers_over_64k_are_431(target):
    srv, load = target("main")
    with load:
        r = srv.call("GET", "/health", headers={"X-Big": "a" * 70000})
        assert r.status == 431, r.body[:300]
        assert "headers" in r.error_message() and "bytes" in r.error_message()


# ----------------------------------------------------------------------------- overload


def test_full_queue_is_429_with_retry_after(start, text_model):
    """--max-queue-tokens 64 and 16 clients sending 60-token texts: most find the queue full.
    Those get 429, retry-after: 1 and a message naming the limit; the rest their embedding."""
    import concurrent.futures as cf

    import openai

    srv = start(text_model, max_queue_tokens=64, max_request_tokens=64)
    text = " ".join(["dog"] * 58)
    want = text_model.unit(ids("[CLS]") + [V["dog"]] * 58 + ids("[SEP]"))
    with cf.ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(lambda k: srv.call("POST", "/v1/embeddings" if k % 2 else "/embed",
                                                   {"input" if k % 2 else "inputs": text}), range(160)))
    full = [r for r in replies if r.status == 429]
    good = [r for r in replies if r.status == 200]
    assert len(full) + len(good) == len(replies), {r.status for r in replies}
    assert full and good, f"{len(full)} refused, {len(good)} answered"
    for r in full:
        assert r.headers.get("retry-after") == "1"
        assert "max_queue_tokens 64" in r.error_message()
        e = r.json()
        assert e["error"]["type"] == "rate_limit_error" if isinstance(e["error"], dict) else e["error_type"] == "Overloaded"
    for r in good:
        got = r.json()
        assert_close(got["data"][0]["embedding"] if isinstance(got, dict) else got[0], want)
    # the SDK (no retries) raises RateLimitError for the same refusal
    client = openai.OpenAI(base_url=f"{srv.base}/v1", api_key="dummy", max_retries=0)
    with cf.ThreadPoolExecutor(16) as pool:
        def sdk_call(_):
            try:
                client.embeddings.create(model=text_model.name, input=text)
                return "ok"
            except openai.RateLimitError as e:
                assert "max_queue_tokens" in e.message
                return "429"
        outcomes = set(pool.map(sdk_call, range(64)))
    client.close()
    assert "429" in outcomes, outcomes
    assert srv.call("GET", "/health").status == 200


def test_one_connection_over_the_limit_is_503(start, text_model):
    import http.client

    srv = start(text_model, http_max_connections=2)
    held = []
    try:
        # The server counts a connection until its session ends, which follows the client's close
        # by a moment: wait_ready's own /health connections may still count for a few ms, so a
        # held connection is retried (closed and opened again) while it is the one over the limit.
        deadline = time.monotonic() + 5
        while len(held) < 2:
            c = http.client.HTTPConnection("127.0.0.1", srv.http_port, timeout=10)
            c.request("GET", "/health")
            reply = c.getresponse()
            body = reply.read()
            if reply.status == 503 and time.monotonic() < deadline:
                c.close()
                time.sleep(0.02)
                continue
            assert reply.status == 200 and body == b"", (reply.status, body[:300])
            held.append(c)
        r = srv.call("POST", "/v1/embeddings", {"input": TEXT})
        assert r.status == 503 and r.headers.get("retry-after") == "1", r.body[:300]
        assert "--http-max-connections 2" in r.error_message()
        assert r.headers.get("connection", "").lower() == "close"
        for c in held:  # the held connections still work
            c.request("POST", "/embed", body=b'{"inputs": "the lazy dog"}', headers={"Content-Type": "application/json"})
            reply = c.getresponse()
            assert reply.status == 200
            assert_close(json.loads(reply.read())[0], text_model.unit(TEXTS["the lazy dog"]))
    finally:
        for c in held:
            c.close()
    deadline = time.monotonic() + 5
    while (r := srv.call("POST", "/v1/embeddings", {"input": TEXT})).status == 503:
        assert time.monotonic() < deadline, "still 503 after the held connections closed"
        time.sleep(0.05)
    assert r.status == 200


# ----------------------------------------------------------------------------- OpenAI's param


def test_openai_param_names_the_field_for_every_input_error(server, ids_server, limited):
    """docs/api.md: OpenAI's `param` is the field when one is at fault. Every refusal of `input`
    must say param "input", those found while the rows are built (empty text, a token outside
    the vocabulary, no tokenizer, a request limit) as well as those of its JSON type."""
    cases = [
        (server, {"input": 5}),
        (server, {"input": []}),
        (server, {"input": ""}),
        (server, {"input": ["the dog", ""]}),
        (server, {"input": [[5, 6], [7, 1000]]}),
        (ids_server, {"input": "hello"}),
        (limited, {"input": ["the dog"] * 5}),
        (limited, {"input": BIG_TEXT}),
    ]
    wrong = []
    for srv, req in cases:
        r = srv.call("POST", "/v1/embeddings", req)
        assert r.status == 400, (req, r.status, r.body[:300])
        err = r.json()["error"]
        assert err["message"].startswith("input"), err
        if err["param"] != "input":
            wrong.append(f"{json.dumps(req)[:60]} -> param {err['param']!r} ({err['message']!r})")
    assert not wrong, "param is not \"input\" for: " + "; ".join(wrong)

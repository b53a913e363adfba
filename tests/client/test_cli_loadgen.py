"""fastformer-client and fastformer-loadgen against a real fastformer-server on loopback
(run: /usr/bin/python3 -m pytest tests/client).

CLI: `encode` writes what fastformer-encode writes for the same lines; `info` prints ModelInfo as
JSON; `health` exits 0 only when SERVING. Load generator: its request and error counts equal the
increase of the server's fastformer_requests_total; sweeps write one CSV row per step.

Counting rule checked here: every request the load generator sends is reported once, as
`requests` (sent during the measured phase, whatever its answer and whenever it came) or as
`warmup_requests` (sent during --warmup); with --warmup 0 `requests` alone equals the server's
increase.
"""

from __future__ import annotations

import csv
import json
import subprocess

import numpy as np
import pytest
from fastformer_testing import child_env  # tools/, on sys.path by the e2e conftest

RUN_TIMEOUT_S = 60
# The same ragged batch gives bit-identical floats; other batch compositions change GEMM
# blocking, hence rounding (a few float32 ulps: up to 2e-6 seen on token embeddings).
EXACT = 0.0
OTHER_BATCHES_TOL = 1e-5  # |client - encode| <= tol * max(1, |encode|)


def run(e2e, name, *args, stdin=None, env=None):
    binary = e2e.require_binary(name)
    return subprocess.run([str(binary), *map(str, args)], input=stdin, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env=env if env is not None else child_env())


def client(e2e, *args, **kw):
    return run(e2e, "fastformer-client", *args, **kw)


def loadgen(e2e, *args, **kw):
    return run(e2e, "fastformer-loadgen", *args, **kw)


def loadgen_json(e2e, *args):
    """The step objects printed by `fastformer-loadgen --json ...` (which must exit 0)."""
    p = loadgen(e2e, "--json", *args)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def write_lines(path, items):
    path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    return path


def assert_same_output(got_text, want_text, tol=EXACT):
    """Line by line the same JSON: same keys and integers; floats within `tol` (relative)."""
    got = [json.loads(l) for l in got_text.splitlines()]
    want = [json.loads(l) for l in want_text.splitlines()]
    assert len(got) == len(want), f"{len(got)} output lines, fastformer-encode wrote {len(want)}"
    worst = 0.0
    for i, (g, w) in enumerate(zip(got, want)):
        assert sorted(g) == sorted(w), f"line {i + 1}: keys {sorted(g)} vs {sorted(w)}"
        assert g["num_tokens"] == w["num_tokens"], f"line {i + 1}: num_tokens"
        for key in w:
            if key == "num_tokens":
                continue
            a, b = np.asarray(g[key], dtype=np.float64), np.asarray(w[key], dtype=np.float64)
            assert a.shape == b.shape, f"line {i + 1} {key}: shape {a.shape} vs {b.shape}"
            err = float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)))) if a.size else 0.0
            worst = max(worst, err)
            assert err <= tol, f"line {i + 1} {key}: differs by {err:.3g} (relative)"
    return worst


def encode_offline(e2e, model, input_path, *flags):
    # float32, as the test servers: the two are compared within 1e-4 (the default, auto, is
    # bfloat16 on a CPU with AVX512_BF16 or AMX)
    p = run(e2e, "fastformer-encode", "--model-dir", model.dir, "--backend", "cpu", "--dtype", "float32",
            "--threads", 2, "--input", input_path, *flags)
    assert p.returncode == 0, p.stderr
    return p.stdout


def encode_lines(e2e, model):
    rng = np.random.default_rng(11)
    lines = [{"token_ids": e2e.make_ids(rng, n, model.vocab)} for n in (1, 7, 40, 130, 511)]
    lines.insert(2, {"input_embeddings": e2e.make_embeddings(rng, 9, model.hidden).tolist()})
    lines.append({"id": "with-an-id", "token_ids": e2e.make_ids(rng, 12, model.vocab)})
    return lines


# ----------------------------------------------------------------------------- fastformer-client


@pytest.mark.parametrize("flags", [[], ["--return-token-embeddings", "--return-logits", "--normalize"]],
                         ids=["embeddings", "all-outputs"])
def test_encode_matches_fastformer_encode(e2e, models, servers, tmp_path, flags):
    model = models.get("head")
    srv = servers.shared("head")
    path = write_lines(tmp_path / "in.jsonl", encode_lines(e2e, model))
    want = encode_offline(e2e, model, path, *flags)
    # One request holding every line: the server computes the batch fastformer-encode forms.
    p = client(e2e, "encode", "--target", srv.target, "--input", path, "--batch", 100, *flags)
    assert p.returncode == 0, p.stderr
    assert_same_output(p.stdout, want, tol=EXACT)
    # One line a request: other batches, the same values up to rounding.
    p = client(e2e, "encode", "--target", srv.target, "--input", path, "--batch", 1, *flags)
    assert p.returncode == 0, p.stderr
    assert_same_output(p.stdout, want, tol=OTHER_BATCHES_TOL)


def test_encode_ids_flags_stdin_and_target_from_environment(e2e, models, servers, tmp_path):
    srv = servers.shared("head")
    env = child_env({"FASTFORMER_TARGET": srv.target})
    by_flags = client(e2e, "encode", "--ids", "5,6,7", "--ids", "8, 0, 9", env=env)
    assert by_flags.returncode == 0, by_flags.stderr
    by_stdin = client(e2e, "encode", "--input", "-", env=env,
                      stdin='{"token_ids": [5, 6, 7]}\n\n{"token_ids": [8, 0, 9]}\n')
    assert by_stdin.returncode == 0, by_stdin.stderr
    assert len(by_flags.stdout.splitlines()) == 2
    assert_same_output(by_flags.stdout, by_stdin.stdout)
    path = write_lines(tmp_path / "in.jsonl", [{"token_ids": [5, 6, 7]}, {"token_ids": [8, 0, 9]}])
    assert_same_output(by_flags.stdout, encode_offline(e2e, models.get("head"), path))


def test_encode_truncation(e2e, models, servers, tmp_path):
    model = models.get("head")
    srv = servers.shared("head")
    ids = e2e.make_ids(np.random.default_rng(3), model.max_positions + 88, model.vocab)
    long_path = write_lines(tmp_path / "long.jsonl", [{"token_ids": ids}])
    p = client(e2e, "encode", "--target", srv.target, "--input", long_path, "--truncation", "left")
    assert p.returncode == 0, p.stderr
    kept = write_lines(tmp_path / "kept.jsonl", [{"token_ids": ids[-model.max_positions:]}])
    assert_same_output(p.stdout, encode_offline(e2e, model, kept))

    p = client(e2e, "encode", "--target", srv.target, "--input", long_path)
    assert p.returncode == 1
    assert "INVALID_ARGUMENT" in p.stderr and "exceed max_position_embeddings" in p.stderr, p.stderr


def test_encode_errors(e2e, servers, tmp_path):
    srv = servers.shared("head")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"token_ids": [1, 2]}\n{"token_ids": [1, \n{"token_ids": [3]}\n', encoding="utf-8")
    p = client(e2e, "encode", "--target", srv.target, "--input", bad_json)
    assert p.returncode == 2
    assert "line 2" in p.stderr and "invalid JSON" in p.stderr, p.stderr
    assert len(p.stdout.splitlines()) == 1, "the lines before the bad one are written"

    p = client(e2e, "encode", "--target", srv.target, "--ids", "1,2", "--ids", "3,5000")
    assert p.returncode == 1
    assert "INVALID_ARGUMENT" in p.stderr and "sequence 1: token_ids" in p.stderr, p.stderr

    for args in (["--ids", "1,x"], ["--truncation", "middle", "--ids", "1"], ["--batch", "0", "--ids", "1"],
                 ["--ids", "1", "--input", "-"], ["--ids", "1", "--token", "a", "--token-file", bad_json]):
        p = client(e2e, "encode", "--target", srv.target, *args)
        assert p.returncode == 2, f"{args}: exit {p.returncode}\n{p.stderr}"
    p = client(e2e, "bogus")
    assert p.returncode == 2


def test_info_prints_model_info_as_json(e2e, models, servers):
    srv = servers.shared("head")
    p = client(e2e, "info", "--target", srv.target)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    model = models.get("head")
    assert info["model_name"] == "e2e-head"
    assert info["hidden_size"] == model.hidden
    assert info["max_position_embeddings"] == model.max_positions
    assert info["vocab_size"] == model.vocab
    assert info["num_labels"] == 3
    assert info["accepts_token_ids"] is True
    assert info["backend"] == "cpu"
    assert info["dtype"] == "float32"
    for key in ("num_hidden_layers", "num_attention_heads", "intermediate_size", "max_batch_tokens",
                "max_request_tokens", "server_version", "device"):
        assert key in info, key


def test_health_exit_codes(e2e, servers):
    srv = servers.shared("head")
    p = client(e2e, "health", "--target", srv.target)
    assert (p.returncode, p.stdout.strip()) == (0, "SERVING"), p.stderr
    p = client(e2e, "health", "--target", srv.target, "--service", "fastformer.v1.Encoder")
    assert p.returncode == 0, p.stderr
    p = client(e2e, "health", "--target", srv.target, "--service", "no.such.Service")
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr, p.stderr

    with e2e.held_port() as port:  # bound, not listening: refused, like a stopped server
        p = client(e2e, "health", "--target", f"127.0.0.1:{port}", "--deadline-ms", 2000)
    assert p.returncode == 1
    assert "UNAVAILABLE" in p.stderr, p.stderr


def test_health_of_a_server_that_was_stopped(e2e, servers):
    srv = servers.start("head")
    assert client(e2e, "health", "--target", srv.target).returncode == 0
    srv.stop()
    p = client(e2e, "health", "--target", srv.target, "--deadline-ms", 2000)
    assert p.returncode == 1 and "UNAVAILABLE" in p.stderr, p.stderr


# ----------------------------------------------------------------------------- fastformer-loadgen


def requests_total(srv, **labels):
    return srv.metrics().value("fastformer_requests_total", **labels)


def wait_increase(srv, before, want, **labels):
    """The increase of fastformer_requests_total{labels} once it reaches `want` (or after 5 s)."""
    m = srv.metrics_when(lambda m: m.value("fastformer_requests_total", **labels) - before >= want)
    return m.value("fastformer_requests_total", **labels) - before


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_step(step):
    lat = step["latency_ms"]
    assert lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p999"] <= lat["max"], lat
    for key in ("server_queue_ms", "server_compute_ms"):
        assert set(step[key]) >= {"p50", "p90", "p99", "p999", "max"}, key
    assert step["requests_per_second"] > 0
    assert step["sequences_per_second"] >= step["requests_per_second"]
    assert step["tokens_per_second"] >= step["sequences_per_second"]


def test_closed_loop_count_matches_the_server(e2e, servers):
    srv = servers.shared("head")
    before = requests_total(srv, method="Encode")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 4, "--duration", 2, "--warmup", 0,
                           "--lengths", "uniform:16:128", "--sequences-per-request", 2, "--seed", 3)
    assert step["mode"] == "closed" and step["concurrency"] == 4
    assert step["errors"] == {}, step["errors"]
    assert step["requests"] > 0 and step["succeeded"] == step["requests"]
    assert step["warmup_requests"] == 0
    assert step["sequences"] == 2 * step["requests"]
    assert step["elapsed_s"] >= 2.0
    check_step(step)
    assert wait_increase(srv, before, step["requests"], method="Encode") == step["requests"]


def test_warmup_requests_are_counted_apart(e2e, servers):
    srv = servers.shared("head")
    before = requests_total(srv, method="Encode")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 2, "--duration", 0.6,
                           "--warmup", 0.4, "--lengths", "fixed:32")
    assert step["warmup_requests"] > 0 and step["requests"] > 0
    total = step["requests"] + step["warmup_requests"]
    assert wait_increase(srv, before, total, method="Encode") == total


def test_priority_reaches_the_server(e2e, servers):
    """--priority sets EncodeRequest.priority: the server counts the requests in that class."""
    srv = servers.shared("head")
    m = srv.metrics()
    before = {p: m.value("fastformer_priority_requests_total", priority=p) or 0 for p in ("interactive", "bulk")}
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 2, "--duration", 0.5, "--warmup", 0,
                           "--lengths", "fixed:16", "--priority", "bulk")
    assert step["errors"] == {} and step["requests"] > 0
    m = srv.metrics_when(lambda m: (m.value("fastformer_priority_requests_total", priority="bulk") or 0)
                         - before["bulk"] >= step["requests"])
    assert m.value("fastformer_priority_requests_total", priority="bulk") - before["bulk"] == step["requests"]
    assert (m.value("fastformer_priority_requests_total", priority="interactive") or 0) == before["interactive"]
    bad = loadgen(e2e, "--target", srv.target, "--priority", "urgent")
    assert bad.returncode == 2 and "--priority" in bad.stderr, bad.stderr


def test_closed_loop_on_streams(e2e, servers):
    srv = servers.shared("head")
    before = requests_total(srv, method="EncodeStream")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--stream", "--concurrency", 3, "--duration", 1,
                           "--warmup", 0, "--lengths", "uniform:8:64")
    assert step["stream"] is True and step["errors"] == {}
    check_step(step)
    # EncodeStream counts one per message.
    assert wait_increase(srv, before, step["requests"], method="EncodeStream") == step["requests"]


def test_asks_for_every_output(e2e, servers):
    """--return-token-embeddings / --return-logits: the run succeeds with the larger answers."""
    srv = servers.shared("head")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 2, "--duration", 0.5, "--warmup", 0,
                           "--lengths", "uniform:8:64", "--return-token-embeddings", "--return-logits")
    assert step["errors"] == {} and step["succeeded"] > 0, step
    check_step(step)


def test_open_loop_at_low_rate(e2e, servers):
    srv = servers.shared("head")
    for method, extra in (("Encode", []), ("EncodeStream", ["--stream", "--concurrency", 2])):
        before = requests_total(srv, method=method)
        (step,) = loadgen_json(e2e, "--target", srv.target, "--rate", 60, "--arrivals", "poisson",
                               "--duration", 1, "--warmup", 0, "--lengths", "fixed:16", "--seed", 5, *extra)
        assert step["mode"] == "open" and step["rate"] == 60 and step["arrivals"] == "poisson"
        assert 25 <= step["requests"] <= 110, step["requests"]  # Poisson, mean 60
        assert step["errors"] == {}
        assert wait_increase(srv, before, step["requests"], method=method) == step["requests"]


def test_open_loop_overload_errors_match_the_server(e2e, servers):
    # A queue of two requests on the heavier model, offered far more than it computes.
    srv = servers.start("load", max_queue_tokens=2048, max_request_tokens=2048, max_batch_tokens=512,
                        threads=1)
    before_all = requests_total(srv, method="Encode")
    before_full = requests_total(srv, method="Encode", code="RESOURCE_EXHAUSTED")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--rate", 400, "--arrivals", "constant",
                           "--duration", 2, "--warmup", 0, "--lengths", "fixed:256",
                           "--sequences-per-request", 4)
    assert step["requests"] == 800  # 2 s at 400/s, constant gaps: exactly
    refused = step["errors"].get("RESOURCE_EXHAUSTED", 0)
    assert refused > 400, step["errors"]
    assert set(step["errors"]) == {"RESOURCE_EXHAUSTED"}, step["errors"]
    assert step["succeeded"] + refused == step["requests"]
    assert wait_increase(srv, before_all, 800, method="Encode") == 800
    assert requests_total(srv, method="Encode", code="RESOURCE_EXHAUSTED") - before_full == refused
    # Latency counts from the schedule: an admitted request waited behind at most a full queue.
    assert step["latency_ms"]["p50"] > 0


def test_sweeps_write_one_csv_row_per_step(e2e, servers, tmp_path):
    srv = servers.shared("head")
    out = tmp_path / "concurrency.csv"
    steps = loadgen_json(e2e, "--target", srv.target, "--sweep-concurrency", "1:4:x2", "--duration", 0.4,
                         "--warmup", 0, "--lengths", "fixed:32", "--csv", out)
    assert [s["concurrency"] for s in steps] == [1, 2, 4]
    rows = read_csv(out)
    assert list(rows[0]) == ["concurrency", "requests_per_second", "tokens_per_second", "p50_ms", "p90_ms",
                             "p99_ms", "p999_ms", "max_ms", "errors"]
    assert [int(r["concurrency"]) for r in rows] == [1, 2, 4]
    for row, step in zip(rows, steps):
        assert float(row["requests_per_second"]) == pytest.approx(step["requests_per_second"], rel=1e-3)
        assert float(row["p50_ms"]) <= float(row["p99_ms"]) <= float(row["max_ms"])
        assert int(row["errors"]) == 0

    out = tmp_path / "rate.csv"
    steps = loadgen_json(e2e, "--target", srv.target, "--sweep-rate", "20:60:+20", "--duration", 0.4,
                         "--warmup", 0, "--lengths", "fixed:32", "--csv", out)
    assert [s["rate"] for s in steps] == [20, 40, 60]
    rows = read_csv(out)
    assert [float(r["rate"]) for r in rows] == [20, 40, 60]


def test_lengths_from_a_file(e2e, servers, tmp_path):
    srv = servers.shared("head")
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("16\n48\n", encoding="utf-8")
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 2, "--duration", 0.5, "--warmup", 0,
                           "--lengths", f"file:{lengths}")
    n = step["succeeded"]
    assert step["errors"] == {} and n > 0
    assert 16 * n <= step["tokens"] <= 48 * n and step["tokens"] % 16 == 0


def test_loadgen_exit_codes(e2e, servers):
    srv = servers.shared("head")
    for args in (["--concurrency", 0], ["--lengths", "gaussian:3"], ["--sweep-concurrency", "1:4"],
                 ["--rate", 10, "--sweep-concurrency", "1:2:x2"], ["--arrivals", "bursty", "--rate", 5],
                 ["--lengths", "fixed:600"],  # longer than the model's 512 positions (asks the server)
                 ["--no-such-flag"]):
        p = loadgen(e2e, "--target", srv.target, "--duration", 0.2, "--warmup", 0, *args)
        assert p.returncode == 2, f"{args}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    with e2e.held_port() as port:  # nothing listens there
        p = loadgen(e2e, "--target", f"127.0.0.1:{port}", "--duration", 0.2, "--deadline-ms", 2000)
    assert p.returncode == 1 and "UNAVAILABLE" in p.stderr, p.stderr
    p = loadgen(e2e, "--help")
    assert p.returncode == 0 and "--sweep-concurrency" in p.stdout


@pytest.mark.parametrize("pooling", ["model", "mean"])
def test_encode_spans_late_chunking(e2e, models, servers, tmp_path, pooling):
    """A line's "spans" (late chunking) through fastformer-client (Sequence.chunking) give the
    "span_embeddings" fastformer-encode gives offline, each the reference pooled from the
    line's one pass (tools/reference.py, reference_span_pool)."""
    import reference as ref
    model = models.get("head")
    srv = servers.shared("head")
    rng = np.random.default_rng(11)
    ids = [int(x) for x in rng.integers(1, model.vocab, 300)]
    spans = [[0, 1], [0, 256], [100, 300], [0, 300]]
    path = write_lines(tmp_path / "in.jsonl", [{"token_ids": ids, "spans": spans}, {"token_ids": ids[:5]}])
    want = encode_offline(e2e, model, path, "--span-pooling", pooling)
    p = client(e2e, "encode", "--target", srv.target, "--input", path, "--span-pooling", pooling)
    assert p.returncode == 0, p.stderr
    assert_same_output(p.stdout, want, tol=OTHER_BATCHES_TOL)
    got = np.asarray(json.loads(p.stdout.splitlines()[0])["span_embeddings"], dtype=np.float64)
    states = model.reference(ids).token_embeddings
    expected = ref.reference_span_pool(model.model, states, np.asarray([t != 0 for t in ids], dtype=np.float64),
                                       spans, pooling)
    err = np.abs(got - expected) / np.maximum(1.0, np.abs(expected))
    assert err.max() <= 1e-4, f"worst scaled error {err.max():.2e}"
    assert "span_embeddings" not in json.loads(p.stdout.splitlines()[1])


def test_encode_macro_chunks_over_the_positions(e2e, models, servers, tmp_path):
    """--macro-overlap-tokens: a 1,200-token line over the model's 512 positions runs as
    overlapping passes on the server (EncodeRequest.macro_overlap_tokens), as fastformer-encode
    runs them offline (whose passes tests/golden checks against the reference); without the
    flag the line is refused naming the limit."""
    model = models.get("head")
    srv = servers.shared("head")
    assert model.max_positions == 512
    rng = np.random.default_rng(12)
    ids = [int(x) for x in rng.integers(1, model.vocab, 1200)]
    spans = [[0, 1], [300, 400], [700, 800], [1100, 1200]]
    path = write_lines(tmp_path / "in.jsonl", [{"token_ids": ids, "spans": spans}, {"token_ids": ids[:5]}])
    p = client(e2e, "encode", "--target", srv.target, "--input", path)
    assert p.returncode != 0 and "1200 tokens exceed max_position_embeddings 512" in p.stderr, p.stderr
    want = encode_offline(e2e, model, path, "--macro-overlap-tokens", 128)
    p = client(e2e, "encode", "--target", srv.target, "--input", path, "--macro-overlap-tokens", 128)
    assert p.returncode == 0, p.stderr
    assert_same_output(p.stdout, want, tol=OTHER_BATCHES_TOL)
    got = np.asarray(json.loads(p.stdout.splitlines()[0])["span_embeddings"], dtype=np.float64)
    assert got.size == len(spans) * model.hidden

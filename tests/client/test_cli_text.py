"""Text through the command-line tools (run: /usr/bin/python3 -m pytest tests/client).

fastformer-encode tokenizes {"text": ...} lines with the model directory's tokenizer.json;
fastformer-client sends --text and {"text": ...} lines as Sequence.text for the server to
tokenize. The "wordlevel" model is the e2e "head" model plus a hand-written WordLevel tokenizer.json
(text_model.py), so every text's ids are known by hand: a text line must give exactly what the
line of its ids gives. "head" itself has no tokenizer.json and refuses text.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

import text_model
from test_cli_loadgen import assert_same_output, client, loadgen, loadgen_json, run, write_lines

TEXTS = ["The quick brown fox.", "A cat sat, the dog sat!", "Zebras and the lazy dog"]
HAND_IDS = [[2, 4, 5, 6, 7, 12, 3], [2, 15, 16, 17, 13, 4, 11, 17, 14, 3], [2, 1, 1, 4, 10, 11, 3]]


def _long_text(n_words: int) -> str:
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", ".", "gnu"]
    return " ".join(words[(i * 7) % len(words)] for i in range(n_words))


def encode(e2e, model, path, *flags):
    # float32: the checks against the reference are float32's 1e-4 (the default, auto, is bfloat16
    # on a CPU with AVX512_BF16 or AMX)
    return run(e2e, "fastformer-encode", "--model-dir", model.dir, "--backend", "cpu", "--dtype", "float32",
               "--threads", 2, "--input", path, *flags)


def encode_ok(e2e, model, path, *flags):
    p = encode(e2e, model, path, *flags)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.fixture
def wordlevel(models):
    return text_model.register(models)


def test_hand_ids():
    assert [text_model.expected_ids(t) for t in TEXTS] == HAND_IDS


# ----------------------------------------------------------------------------- fastformer-encode


def test_encode_text_lines_equal_their_ids(e2e, wordlevel, tmp_path):
    texts = write_lines(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS] + [{"id": "x", "text": "fox"}])
    ids = write_lines(tmp_path / "ids.jsonl", [{"token_ids": i} for i in HAND_IDS] + [{"token_ids": [2, 7, 3]}])
    for flags in ([], ["--return-token-embeddings", "--return-logits", "--normalize"]):
        got = encode_ok(e2e, wordlevel, texts, *flags)
        assert [json.loads(l)["num_tokens"] for l in got.splitlines()] == [7, 10, 7, 3]
        assert_same_output(got, encode_ok(e2e, wordlevel, ids, *flags))  # same batches: exactly equal


@pytest.mark.parametrize("side", ["right", "left"])
def test_encode_truncation_of_text_and_ids(e2e, wordlevel, tmp_path, side):
    long = _long_text(600)
    want_ids = text_model.expected_ids(long, wordlevel.max_positions, keep_last=side == "left")
    assert len(want_ids) == 512 and (want_ids[0], want_ids[-1]) == (2, 3)
    raw_ids = text_model.expected_ids(long)
    path = write_lines(tmp_path / "long.jsonl", [{"text": "fox"}, {"text": long}, {"token_ids": raw_ids}])
    got = encode_ok(e2e, wordlevel, path, "--truncation", side)
    kept_ids = raw_ids[-512:] if side == "left" else raw_ids[:512]
    want = encode_ok(e2e, wordlevel, write_lines(tmp_path / "kept.jsonl", [
        {"token_ids": [2, 7, 3]}, {"token_ids": want_ids}, {"token_ids": kept_ids}]))
    assert [json.loads(l)["num_tokens"] for l in got.splitlines()] == [3, 512, 512]
    assert_same_output(got, want)


def test_encode_applies_the_tokenizers_own_truncation_first(e2e, wordlevel, tmp_path):
    """tokenizer.json's "truncation" (as in training) cuts before the model's positions, as the
    server does; special tokens stay."""
    d = tmp_path / "cut5"
    shutil.copytree(wordlevel.dir, d)
    tj = text_model.tokenizer_json()
    tj["truncation"] = {"direction": "Left", "max_length": 5, "strategy": "LongestFirst", "stride": 0}
    (d / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    cut = dataclasses.replace(wordlevel, dir=d)
    path = write_lines(tmp_path / "t.jsonl", [{"text": "The quick brown fox jumps over"}, {"text": "fox"}])
    want = encode_ok(e2e, wordlevel, write_lines(tmp_path / "ids.jsonl", [
        {"token_ids": [2, 7, 8, 9, 3]}, {"token_ids": [2, 7, 3]}]))
    for flags in ([], ["--truncation", "right"]):  # the tokenizer's rule is the shorter: it wins
        got = encode_ok(e2e, cut, path, *flags)
        assert [json.loads(l)["num_tokens"] for l in got.splitlines()] == [5, 3]
        assert_same_output(got, want)


def test_encode_long_text_without_truncation_is_an_error(e2e, wordlevel, tmp_path):
    path = write_lines(tmp_path / "long.jsonl", [{"text": "fox"}, {"text": _long_text(600)}])
    p = encode(e2e, wordlevel, path)
    assert p.returncode == 2
    assert "line 2: text: the text is 602 tokens, over max_position_embeddings 512" in p.stderr, p.stderr
    assert len(p.stdout.splitlines()) == 1, "the lines before the bad one are written"


def test_encode_text_needs_a_tokenizer(e2e, models, tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [{"token_ids": [5, 6]}, {"text": "some text"}])
    p = encode(e2e, models.get("head"), path)
    assert p.returncode == 2
    assert "line 2: text: this model takes no text: its model directory has no tokenizer.json" in p.stderr, p.stderr
    assert len(p.stdout.splitlines()) == 1


@pytest.mark.parametrize("line,needle", [
    ('{"text": 5}', "line 1: text: expected a string, got 5"),
    ('{"text": ""}', "line 1: text: empty string"),
    ('{"text": " \\t\\n "}', "line 1: text: the text tokenizes to no tokens"),
    ('{"text": "ok \\udcff"}', "line 1: invalid JSON"),  # a lone surrogate is no UTF-8
    ('{"text": "fox", "token_ids": [1]}', 'line 1: expected exactly one of "token_ids", "input_embeddings" or "text"'),
    ('{"txt": "fox"}', 'line 1: expected exactly one of'),
])
def test_encode_bad_text_lines(e2e, wordlevel, tmp_path, line, needle):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    p = encode(e2e, wordlevel, path)
    assert p.returncode == 2 and needle in p.stderr, p.stderr


def test_encode_truncation_flag_is_checked(e2e, wordlevel, tmp_path):
    path = write_lines(tmp_path / "t.jsonl", [{"text": "fox"}])
    p = encode(e2e, wordlevel, path, "--truncation", "middle")
    assert p.returncode != 0 and "--truncation" in p.stderr, p.stderr


# ----------------------------------------------------------------------------- fastformer-client


def test_client_text_flags_equal_ids_and_fastformer_encode(e2e, wordlevel, servers, tmp_path):
    srv = servers.shared("wordlevel")
    by_text = client(e2e, "encode", "--target", srv.target, *[a for t in TEXTS for a in ("--text", t)])
    assert by_text.returncode == 0, by_text.stderr
    by_ids = client(e2e, "encode", "--target", srv.target, *[a for i in HAND_IDS for a in ("--ids", ",".join(map(str, i)))])
    assert by_ids.returncode == 0, by_ids.stderr
    assert [json.loads(l)["num_tokens"] for l in by_text.stdout.splitlines()] == [7, 10, 7]
    assert_same_output(by_text.stdout, by_ids.stdout)
    # The server's tokenizer and fastformer-encode's give the same lines.
    path = write_lines(tmp_path / "texts.jsonl", [{"text": t} for t in TEXTS])
    assert_same_output(by_text.stdout, encode_ok(e2e, wordlevel, path))
    by_file = client(e2e, "encode", "--target", srv.target, "--input", path)
    assert by_file.returncode == 0, by_file.stderr
    assert_same_output(by_file.stdout, by_text.stdout)


def test_client_text_truncation(e2e, wordlevel, servers, tmp_path):
    srv = servers.shared("wordlevel")
    long = _long_text(600)
    p = client(e2e, "encode", "--target", srv.target, "--text", long, "--truncation", "left")
    assert p.returncode == 0, p.stderr
    kept = write_lines(tmp_path / "kept.jsonl", [{"token_ids": text_model.expected_ids(long, 512, keep_last=True)}])
    assert_same_output(p.stdout, encode_ok(e2e, wordlevel, kept))
    p = client(e2e, "encode", "--target", srv.target, "--text", long)
    assert p.returncode == 1 and "INVALID_ARGUMENT" in p.stderr, p.stderr
    assert "sequence 0: text: the text is 602 tokens, over max_position_embeddings 512" in p.stderr, p.stderr


def test_client_text_on_a_model_without_tokenizer(e2e, servers):
    srv = servers.shared("head")
    p = client(e2e, "encode", "--target", srv.target, "--text", "some text")
    assert p.returncode == 1
    assert "INVALID_ARGUMENT" in p.stderr and "tokenizer.json" in p.stderr, p.stderr


def test_client_text_flag_combinations(e2e, servers, tmp_path):
    srv = servers.shared("head")
    for args in (["--text", "a", "--ids", "1"], ["--text", "a", "--input", "-"]):
        p = client(e2e, "encode", "--target", srv.target, *args)
        assert p.returncode == 2, f"{args}: exit {p.returncode}\n{p.stderr}"


def test_client_info_says_whether_text_is_accepted(e2e, wordlevel, servers):
    for key, accepts, tokenizer in (("wordlevel", True, text_model.DESCRIPTION), ("head", False, "")):
        p = client(e2e, "info", "--target", servers.shared(key).target)
        assert p.returncode == 0, p.stderr
        info = json.loads(p.stdout)
        assert (info["accepts_text"], info["tokenizer"]) == (accepts, tokenizer), key


# ----------------------------------------------------------------------------- fastformer-loadgen


def test_loadgen_sends_texts_and_counts_their_tokens(e2e, wordlevel, servers, tmp_path):
    srv = servers.shared("wordlevel")
    # Every line tokenizes to 7 tokens ([CLS] + 5 words + [SEP]); blank lines are skipped.
    path = tmp_path / "texts.txt"
    path.write_text("The quick brown fox jumps\n\nover the lazy dog .\r\nA cat sat , the\n", encoding="utf-8")
    assert {len(text_model.expected_ids(t)) for t in path.read_text().split("\n") if t.strip()} == {7}
    (step,) = loadgen_json(e2e, "--target", srv.target, "--concurrency", 2, "--duration", 1, "--warmup", 0,
                           "--texts", path, "--sequences-per-request", 2)
    assert step["errors"] == {} and step["requests"] > 0 and step["succeeded"] == step["requests"]
    assert step["sequences"] == 2 * step["requests"] and step["tokens"] == 7 * step["sequences"]
    assert step["lengths"] == f"texts:{path}"


def test_loadgen_texts_errors(e2e, wordlevel, servers, tmp_path):
    path = tmp_path / "texts.txt"
    path.write_text("some text\n", encoding="utf-8")
    p = loadgen(e2e, "--target", servers.shared("head").target, "--duration", 0.2, "--texts", path)
    assert p.returncode == 2 and "has no tokenizer.json" in p.stderr, p.stderr
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n", encoding="utf-8")
    p = loadgen(e2e, "--target", "127.0.0.1:1", "--duration", 0.2, "--texts", empty)  # checked first
    assert p.returncode == 2 and "no text in it" in p.stderr, p.stderr
    p = loadgen(e2e, "--target", servers.shared("wordlevel").target, "--texts", path, "--lengths", "fixed:3")
    assert p.returncode == 2, p.stderr
    # An over-long text is the server's INVALID_ARGUMENT, counted; with --truncation it passes.
    path.write_text(_long_text(600) + "\n", encoding="utf-8")
    (step,) = loadgen_json(e2e, "--target", servers.shared("wordlevel").target, "--duration", 0.5, "--warmup", 0,
                           "--texts", path)
    assert step["succeeded"] == 0 and step["errors"].get("INVALID_ARGUMENT") == step["requests"] > 0
    (step,) = loadgen_json(e2e, "--target", servers.shared("wordlevel").target, "--duration", 0.5, "--warmup", 0,
                           "--texts", path, "--truncation", "right")
    assert step["errors"] == {} and step["tokens"] == 512 * step["sequences"] > 0

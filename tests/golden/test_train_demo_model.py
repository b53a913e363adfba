"""tools/train_demo_model.py and tools/manpages_corpus.py (issue 15, point 4 groundwork).

The tokenizer is checked against NLTK's own wordpunct_tokenize (Debian python3-nltk)
over every page of the corpus; the roff strip against hand-written expectations; the
split for stability; and a small model is trained end to end, exported and run by
fastformer-encode, whose logits must match PyTorch's, and whose exported tokenizer.json
gives the test split's ids through fastformer-tokenize.
"""

from __future__ import annotations

import json
import random
import re
import subprocess

import pytest

import manpages_corpus as mc
import train_demo_model as tdm


def _corpus_or_fail():
    try:
        mc.package_versions()
    except mc.CorpusError as e:
        pytest.fail(f"{e} (deploy/install-deps.sh installs them)", pytrace=False)
    return mc.collect_pages()


@pytest.fixture(scope="module")
def pages():
    return _corpus_or_fail()


def test_wordpunct_equals_nltk_on_every_page(pages):
    try:
        import nltk.tokenize as nltk_tok
    except ImportError:
        pytest.fail("NLTK is missing: apt-get install python3-nltk (deploy/install-deps.sh)", pytrace=False)
    texts = [p.text.lower() for p in pages]
    texts += ["Héllo, WÖRLD!! it's 3.14 \u2014 ok\u2026 na\u00efve caf\u00e9 \u00c5ngstr\u00f6m",
              "tab\there\nnew line  \u00a0nbsp \u4e2d\u6587 \u0434\u0430 \U0001f600!", "", "   "]
    non_ascii = sum(any(ord(c) > 127 for c in t) for t in texts)
    assert non_ascii >= 20, non_ascii  # the corpus does exercise \w beyond ASCII
    for t in texts:
        assert tdm.wordpunct(t) == nltk_tok.wordpunct_tokenize(t.lower()), t[:200]


def test_word_dict_rules():
    texts = ["b a a c", "A, b! d", "e"]
    wd = tdm.build_word_dict(texts, min_freq=2)
    # PADDING 0, [UNK] 1, then words seen >= 2 times in order of first appearance
    assert wd == {"PADDING": 0, "[UNK]": 1, "b": 2, "a": 3}
    assert tdm.encode("A b Z a c", wd, max_len=10) == [3, 2, 1, 3, 1]
    assert tdm.encode("a b a b a b", wd, max_len=4) == [3, 2, 3, 2]
    assert tdm.build_word_dict(texts, min_freq=1) == {
        "PADDING": 0, "[UNK]": 1, "b": 2, "a": 3, "c": 4, ",": 5, "!": 6, "d": 7, "e": 8}


def test_strip_roff():
    src = "\n".join([
        '.\\" comment',
        '.TH read 2 2022-12-04 "Linux man-pages 6.03"',
        ".SH NAME",
        "read \\- read from a file descriptor",
        ".SH SYNOPSIS",
        ".nf",
        ".B #include <unistd.h>",
        '.BI "ssize_t read(int " fd ", void " buf [. count "], size_t " count );',
        ".fi",
        ".PP",
        ".BR read ()",
        "attempts \\fIto\\fP read \\(em up to \\e0 bytes\\&.  \\\" trailing comment",
        ".IR buf .",
        "\\[u00E9]t\\[u00E9] \\s-1SMALL\\s0 \\*(lqq\\*(rq",
    ])
    assert mc.strip_roff(src) == "\n".join([
        "NAME",
        "read - read from a file descriptor",
        "SYNOPSIS",
        "#include <unistd.h>",
        "ssize_t read(int fd, void buf[.count], size_t count);",
        "read()",
        "attempts to read \u2014 up to \\0 bytes.",
        "buf.",
        "\u00e9t\u00e9 SMALL q",
    ])


def test_corpus_and_split(pages):
    assert {p.section for p in pages} <= set(mc.LABELS)
    assert len(pages) >= 800
    # the .TH title line (".TH read 2 2022-12-04 ...") states the label: it must be gone
    title = re.compile(r"^(\.TH\s+)?\S+\s+[1-8]\w*\s+\d{4}-\d\d-\d\d", re.M)
    leaked = [f"{p.name}({p.section})" for p in pages if title.search(p.text)]
    assert not leaked, leaked[:10]
    counts = {lab: sum(p.label == lab for p in pages) for lab in range(len(mc.LABEL_NAMES))}
    assert min(counts.values()) >= 50, counts
    train, test = mc.split_pages(pages, 0.2)
    assert len(train) + len(test) == len(pages)
    assert 0.15 < len(test) / len(pages) < 0.25
    assert {(p.section, p.name) for p in train}.isdisjoint({(p.section, p.name) for p in test})
    shuffled = list(pages)
    random.Random(1).shuffle(shuffled)
    _, test2 = mc.split_pages(shuffled, 0.2)
    assert sorted((p.section, p.name) for p in test2) == sorted((p.section, p.name) for p in test)
    for lab in counts:  # every class is in the test split
        assert any(p.label == lab for p in test), lab


def test_train_export_and_engine_parity(pages, tmp_path, golden):
    """A small model, one epoch: exported, then fastformer-encode's logits equal PyTorch's,
    and its tokenizer.json turns test.jsonl's texts into test_ids.jsonl's ids."""
    enc = golden.encode_binary()
    tokenize = golden.require_binary("fastformer-tokenize")
    out = tmp_path / "m"
    r = subprocess.run([golden.PYTHON, str(golden.TOOLS / "train_demo_model.py"), "--out", str(out),
                        "--epochs", "1", "--hidden", "32", "--heads", "4", "--layers", "1",
                        "--intermediate", "32", "--max-len", "128", "--verify-with", str(enc)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "engine parity: PASS" in r.stdout, r.stdout
    assert "torch BLAS: " in r.stdout and "step 1/55 (epoch 1/1): loss " in r.stdout, r.stdout
    report = json.loads((out / "train_report.json").read_text())
    assert report["engine_parity"]["argmax_mismatches"] == 0
    assert report["engine_parity"]["max_rel_error"] <= 1e-4
    cfg = json.loads((out / "config.json").read_text())
    wd = json.loads((out / "word_dict.json").read_text())
    assert cfg["vocab_size"] == len(wd) and wd["PADDING"] == 0 and wd["[UNK]"] == 1
    assert cfg["num_labels"] == len(mc.LABEL_NAMES)
    test_lines = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    ids_lines = [json.loads(line) for line in (out / "test_ids.jsonl").read_text().splitlines()]
    assert len(test_lines) == len(ids_lines) == report["corpus"]["test"]
    for t, i in zip(test_lines, ids_lines):  # test_ids is test.jsonl tokenized with word_dict
        assert i["token_ids"] == tdm.encode(t["text"], wd, 128)
        assert t["label_name"] == mc.LABEL_NAMES[t["label"]]
    tok = json.loads((out / "tokenizer.json").read_text())
    assert tok["model"]["vocab"] == wd and tok["truncation"]["max_length"] == 128
    with open(out / "test.jsonl", "rb") as stdin:
        r = subprocess.run([str(tokenize), "--tokenizer", str(out / "tokenizer.json")], stdin=stdin,
                           capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [json.loads(line) for line in r.stdout.splitlines()] == [{"ids": i["token_ids"]} for i in ids_lines]

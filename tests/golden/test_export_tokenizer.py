"""tools/export_fastformer.py --word-dict / --tokenizer (issue 15, point 2).

The tokenizer.json written from a word_dict is run by our C++ tokenizer (fastformer-tokenize)
and must give the notebook's ids, computed the notebook's way in Python (lower(), re.findall
of wordpunct, word_dict lookup with [UNK], the first N tokens: train_demo_model.encode), on
every page of the man-page corpus, on every code point, and on hand-made cases whose ids are
written out here. (That the `tokenizers` package reads the same file the same way is
`make test-tokenizer`: its wordlevel_notebook is this exporter's JSON.) Then the CLI: a
WordPiece tokenizer.json is copied and served, bad ones are refused with a message naming
the problem.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import unicodedata
from collections import OrderedDict

import pytest
import torch

import export_fastformer as ex
import manpages_corpus as mc
import reference as ref
import train_demo_model as tdm


def tokenize(golden, tokenizer: dict, texts, tmp_path, name="tok"):
    """Our C++ tokenizer's ids for each text."""
    binary = golden.require_binary("fastformer-tokenize")
    tok_path, texts_path = tmp_path / f"{name}.json", tmp_path / f"{name}.texts.jsonl"
    tok_path.write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    golden.write_jsonl(texts_path, [{"text": t} for t in texts])
    with open(texts_path, "rb") as stdin:
        r = subprocess.run([str(binary), "--tokenizer", str(tok_path)], stdin=stdin, capture_output=True,
                           timeout=600)
    assert r.returncode == 0, r.stderr.decode()
    lines = [json.loads(line) for line in r.stdout.decode().splitlines()]
    assert len(lines) == len(texts)
    return [line.get("ids", line) for line in lines]


def assert_same_ids(got, texts, word_dict, max_len):
    bad = [(t, g, tdm.encode(t, word_dict, max_len)) for t, g in zip(texts, got)
           if g != tdm.encode(t, word_dict, max_len)]
    if bad:
        text, ours, want = bad[0]
        k = next((k for k, (a, b) in enumerate(zip(ours, want)) if a != b), min(len(ours), len(want)))
        words = {i: w for w, i in word_dict.items()}
        raise AssertionError(f"{len(bad)} of {len(texts)} texts differ from the notebook's ids; the first "
                             f"at token {k} of {text[:100]!r}...: ours {[words.get(i) for i in ours[k:k + 3]]}, "
                             f"notebook {[words.get(i) for i in want[k:k + 3]]}")


# ----------------------------------------------------------------------------- the notebook's ids


@pytest.fixture(scope="module")
def pages():
    try:
        mc.package_versions()
    except mc.CorpusError as e:
        pytest.fail(f"{e} (deploy/install-deps.sh installs them)", pytrace=False)
    return mc.collect_pages()


def test_word_dict_tokenizer_equals_notebook_on_every_manpage(pages, golden, tmp_path):
    texts = [p.text for p in pages]
    assert sum(not t.isascii() for t in texts) >= 20  # \w beyond ASCII is exercised
    # as the demo model: word_dict of the train split (unknown words in every test page), 512 tokens
    train, _ = mc.split_pages(pages, 0.2)
    wd = tdm.build_word_dict([p.text for p in train], min_freq=3)
    got = tokenize(golden, ex.word_dict_tokenizer(wd, "[UNK]", 512), texts, tmp_path, "train512")
    assert_same_ids(got, texts, wd, 512)
    assert sum(1 in g for g in got) > len(texts) // 4
    # every token its own id, no truncation: each token boundary of every page is compared
    wd_all = tdm.build_word_dict(texts, min_freq=1)
    got = tokenize(golden, ex.word_dict_tokenizer(wd_all, "[UNK]", None), texts, tmp_path, "all")
    assert_same_ids(got, texts, wd_all, 10**9)
    print(f"{len(texts)} pages, {sum(map(len, got)):,} tokens, {len(wd_all):,} distinct: equal")


def test_word_dict_tokenizer_equals_notebook_on_every_code_point(golden, tmp_path):
    """Each code point Python knows, between letters and between hyphens: where the notebook's
    \\w and \\s (Python's) split, so must ours (Oniguruma's \\w alone would differ on marks)."""
    chars = [chr(c) for c in range(0x110000) if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    texts = [" ".join(f"x{c}y -{c}-" for c in chars[i:i + 64]) for i in range(0, len(chars), 64)]
    wd = tdm.build_word_dict(texts, min_freq=1)
    got = tokenize(golden, ex.word_dict_tokenizer(wd, "[UNK]", None), texts, tmp_path, "sweep")
    assert_same_ids(got, texts, wd, 10**9)


WD = {"PADDING": 0, "[UNK]": 1, "hello": 2, ",": 3, "world": 4, "!!": 5, "...": 6, "café": 7,
      "\u0663\u0664": 8, "straße": 9, "_init_": 10, "x\u00b2": 11, "\u4e2d\u6587": 12, "it": 13,
      "'": 14, "s": 15, "(": 16, ");": 17, "f": 18, "a": 19, "\u0915": 20}
EDGE_CASES = [  # text, the notebook's ids (by hand)
    ("Hello, WORLD!!", [2, 3, 4, 5]),
    ("hello unknownword ...", [2, 1, 6]),
    ("It's", [13, 14, 15]),
    ("f(a);", [18, 16, 19, 17]),
    ("--- (!!) ... !!,", [1, 1, 6, 1]),           # punctuation runs are one token each
    ("CAF\u00c9 cafe\u0301", [7, 1, 1]),          # É lower-cased; a combining accent is not \w
    ("Stra\u00dfe \u0663\u0664 _init_ X\u00b2", [9, 8, 10, 11]),  # ß, Arabic-Indic digits, _, ²
    ("\u4e2d\u6587\uff01", [12, 1]),               # CJK letters, then a full-width !
    ("\u0915\u093f", [20, 1]),                      # Devanagari: the vowel sign (Mc) splits off
    ("a\u203fa", [19, 1, 19]),                      # only _ of the connectors (Pc) is \w
    ("a\u00a0a\u3000a\x1ca\u0085a", [19] * 5),      # no-break, ideographic space, \x1c, NEL split
    ("", []),
    (" \t\n ", []),
]


def test_word_dict_tokenizer_edge_cases(golden, tmp_path):
    texts = [t for t, _ in EDGE_CASES]
    for t, want in EDGE_CASES:  # the hand-written ids are the notebook's
        assert tdm.encode(t, WD, 100) == want, t
    got = tokenize(golden, ex.word_dict_tokenizer(WD, "[UNK]", None), texts, tmp_path)
    assert got == [want for _, want in EDGE_CASES]


def test_word_dict_tokenizer_truncates_to_n(golden, tmp_path):
    texts = ["a a a", "a , a ,", "a , a , hello", "a,a,a,a,a,a"]  # 3, 4 = N, 5 = N + 1, 11 tokens
    got = tokenize(golden, ex.word_dict_tokenizer(WD, "[UNK]", 4), texts, tmp_path)
    assert got == [[19, 19, 19], [19, 3, 19, 3], [19, 3, 19, 3], [19, 3, 19, 3]]
    assert_same_ids(got, texts, WD, 4)


def test_word_dict_tokenizer_for_the_official_notebooks_dict(golden, tmp_path):
    """The notebook's word_dict has no unknown-word entry: refused, with the way out in the message,
    which maps unknown words to the padding id. 'PADDING' written in a text is a word like others."""
    notebook = {"PADDING": 0, "hello": 1, ",": 2}
    with pytest.raises(ex.ExportError, match=r"the unknown-word token '\[UNK\]' is not in the word_dict "
                                             r"\(3 entries\).*--unk-token PADDING gives unknown words id 0"):
        ex.word_dict_tokenizer(notebook)
    got = tokenize(golden, ex.word_dict_tokenizer(notebook, "PADDING", 256), ["Hello, padding PADDING x"], tmp_path)
    assert got == [[1, 2, 0, 0, 0]]


def test_word_dict_tokenizer_rejects_bad_dicts():
    with pytest.raises(ex.ExportError, match=r"'a': -1"):
        ex.word_dict_tokenizer({"PADDING": 0, "[UNK]": 1, "a": -1})
    assert ex.word_dict_tokenizer({"<unk>": 0}, "<unk>")["model"]["unk_token"] == "<unk>"


# ----------------------------------------------------------------------------- the CLI


CONFIG = {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 32,
          "max_position_embeddings": 64, "vocab_size": 30, "hidden_act": "gelu", "layer_norm_eps": 1e-12}

WORDPIECE = {
    "version": "1.0", "truncation": None, "padding": None,
    "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True}
                     for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]"])],
    "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                   "strip_accents": None, "lowercase": True},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
    "decoder": None,
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 100,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "##s": 6, "!": 7}},
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A state_dict with 30 word embedding rows, its config and the CLI's common arguments."""
    d = tmp_path_factory.mktemp("ckpt")
    torch.manual_seed(0)
    model = ref.Model(ref.load_config(CONFIG), vocab_size=30, num_labels=2)
    torch.save(OrderedDict(model.state_dict()), d / "model.pt")
    (d / "config.json").write_text(json.dumps(CONFIG))
    return d


def export(checkpoint, out, *flags):
    return ex.main(["--checkpoint", str(checkpoint / "model.pt"), "--config", str(checkpoint / "config.json"),
                    "--out", str(out), *flags])


def write_json(path, obj):
    path.write_text(json.dumps(obj), encoding="utf-8")
    return str(path)


def test_cli_copies_a_wordpiece_tokenizer(checkpoint, golden, tmp_path):
    src = write_json(tmp_path / "tokenizer.json", WORDPIECE)
    out = tmp_path / "m"
    assert export(checkpoint, out, "--tokenizer", src) == 0
    assert json.loads((out / "tokenizer.json").read_text()) == WORDPIECE
    # [CLS] hello world ##s ! [SEP], as BERT's tokenizers write it
    assert tokenize(golden, WORDPIECE, ["Hello WORLDs!"], tmp_path) == [[2, 4, 5, 6, 7, 3]]
    # the engine's loader takes the directory with its tokenizer (and checks its ids itself)
    r = golden.run_encode(golden.encode_binary(), out, [{"token_ids": [2, 4, 5, 6, 7, 3]}], tmp_path)
    assert r.outputs[0]["num_tokens"] == 6


def test_cli_refuses_ids_beyond_vocab_size(checkpoint, tmp_path, capsys):
    too_big = json.loads(json.dumps(WORDPIECE))
    too_big["model"]["vocab"]["world"] = 30  # the model has rows 0..29
    assert export(checkpoint, tmp_path / "a", "--tokenizer", write_json(tmp_path / "a.json", too_big)) == 1
    assert ("tokenizer.json: model.vocab['world'] has token id 30, but the model's vocab_size is 30 "
            "(rows of word_embedding.weight): every id must be below it") in capsys.readouterr().err
    assert not (tmp_path / "a").exists()  # nothing written

    template = json.loads(json.dumps(WORDPIECE))
    template["post_processor"] = {"type": "TemplateProcessing",
                                  "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}},
                                             {"Sequence": {"id": "A", "type_id": 0}}],
                                  "pair": [], "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [512],
                                                                           "tokens": ["[CLS]"]}}}
    assert export(checkpoint, tmp_path / "b", "--tokenizer", write_json(tmp_path / "b.json", template)) == 1
    assert "post_processor.special_tokens['[CLS]'] has token id 512" in capsys.readouterr().err


def test_cli_refuses_unsupported_components(checkpoint, tmp_path, capsys):
    bpe = dict(WORDPIECE, model={"type": "BPE", "vocab": {"a": 0}, "merges": []})
    assert export(checkpoint, tmp_path / "a", "--tokenizer", write_json(tmp_path / "a.json", bpe)) == 1
    assert ("tokenizer.json: model.type BPE is not supported by the server "
            "(supported: WordLevel, WordPiece)") in capsys.readouterr().err
    nested = dict(WORDPIECE, normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFC"}, {"type": "Replace", "pattern": {"String": "a"}, "content": "b"}]})
    assert export(checkpoint, tmp_path / "b", "--tokenizer", write_json(tmp_path / "b.json", nested)) == 1
    assert "normalizer.normalizers[1].type Replace is not supported" in capsys.readouterr().err
    (tmp_path / "c.json").write_text("{\"model\": ")
    assert export(checkpoint, tmp_path / "c", "--tokenizer", str(tmp_path / "c.json")) == 1
    assert "not a tokenizer.json: not valid JSON" in capsys.readouterr().err


def test_cli_word_dict(checkpoint, golden, tmp_path, capsys):
    wd = {"PADDING": 0, "[UNK]": 1, "hello": 2, "world": 3, "!": 4}
    out = tmp_path / "m"
    assert export(checkpoint, out, "--word-dict", write_json(tmp_path / "wd.json", wd)) == 0
    tok = json.loads((out / "tokenizer.json").read_text())
    assert tok == ex.word_dict_tokenizer(wd, "[UNK]", 64)  # the config's max_position_embeddings
    assert tokenize(golden, tok, ["Hello, World!"], tmp_path) == [[2, 1, 3, 4]]
    r = golden.run_encode(golden.encode_binary(), out, [{"token_ids": [2, 1, 3, 4]}], tmp_path)
    assert r.outputs[0]["num_tokens"] == 4

    # another unk token and length; a missing unk token; an id beyond the 30 rows
    wd2 = {"<pad>": 0, "<unk>": 7, "x": 8}
    assert export(checkpoint, tmp_path / "m2", "--word-dict", write_json(tmp_path / "wd2.json", wd2),
                  "--unk-token", "<unk>", "--max-length", "16") == 0
    tok2 = json.loads((tmp_path / "m2" / "tokenizer.json").read_text())
    assert tok2["model"]["unk_token"] == "<unk>" and tok2["truncation"]["max_length"] == 16
    assert export(checkpoint, tmp_path / "m3", "--word-dict", str(tmp_path / "wd2.json")) == 1
    assert "the unknown-word token '[UNK]' is not in the word_dict (3 entries)" in capsys.readouterr().err
    assert export(checkpoint, tmp_path / "m4", "--word-dict", write_json(tmp_path / "wd4.json", dict(wd, z=30))) == 1
    assert "model.vocab['z'] has token id 30, but the model's vocab_size is 30" in capsys.readouterr().err
    assert export(checkpoint, tmp_path / "m5", "--word-dict", str(tmp_path / "wd.json"), "--max-length", "65") == 1
    assert "--max-length 65 exceeds the model's max_position_embeddings 64" in capsys.readouterr().err


def test_cli_word_dict_pickle_needs_allow_pickle(checkpoint, tmp_path, capsys):
    with open(tmp_path / "wd.pkl", "wb") as f:
        pickle.dump({"PADDING": 0, "[UNK]": 1, "hello": 2}, f)
    assert export(checkpoint, tmp_path / "a", "--word-dict", str(tmp_path / "wd.pkl")) == 1
    assert "a pickle runs code when loaded; if you trust this file, rerun with --allow-pickle" in \
        capsys.readouterr().err
    assert export(checkpoint, tmp_path / "b", "--word-dict", str(tmp_path / "wd.pkl"), "--allow-pickle") == 0
    assert json.loads((tmp_path / "b" / "tokenizer.json").read_text())["model"]["vocab"] == \
        {"PADDING": 0, "[UNK]": 1, "hello": 2}


def test_cli_flags_exclude_each_other(checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        export(checkpoint, tmp_path / "a", "--word-dict", "wd.json", "--tokenizer", "t.json")
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export(checkpoint, tmp_path / "a", "--max-length", "8")
    assert "--unk-token and --max-length go with --word-dict" in capsys.readouterr().err

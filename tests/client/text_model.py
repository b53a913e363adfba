"""A demo model that takes text, for the client tests: the e2e "head" model's files plus a small
WordLevel tokenizer.json written here by hand, so the ids of a text can be worked out by hand.

The tokenizer lower-cases, splits on `\\w+|[^\\w\\s]+` (the `Whitespace` pre-tokenizer), maps each
word through VOCAB (unknown words: [UNK] = 1) and wraps the result in [CLS] = 2 ... [SEP] = 3:

    "The quick brown fox." -> [2, 4, 5, 6, 7, 12, 3]

register(models) adds it to the e2e `models` fixture under the key "wordlevel", so that
`servers.shared("wordlevel")` starts a server on it; "head" (the same weights, no tokenizer.json)
is the model that takes no text. (The e2e suite's own "text" model has make_demo_model's
WordPiece tokenizer; this one is a WordLevel tokenizer in the notebook's style.)
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

SPECIAL = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3}
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", ".", ",", "!", "a", "cat", "sat"]
VOCAB = {**SPECIAL, **{w: 4 + i for i, w in enumerate(WORDS)}}
UNK, CLS, SEP = 1, 2, 3
DESCRIPTION = "WordLevel (Lowercase, Whitespace, TemplateProcessing)"


def _special(content: str) -> dict:
    return {"id": VOCAB[content], "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def tokenizer_json() -> dict:
    """tokenizer.json in the Hugging Face `tokenizers` format."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [_special(t) for t in SPECIAL],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                     {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [VOCAB[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")},
        },
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": VOCAB, "unk_token": "[UNK]"},
    }


def word_ids(text: str) -> list:
    """The ids of an ASCII text's words, without [CLS]/[SEP] (the rule above, by hand)."""
    return [VOCAB.get(w, UNK) for w in re.findall(r"\w+|[^\w\s]+", text.lower())]


def expected_ids(text: str, max_length: int = 0, keep_last: bool = False) -> list:
    """[CLS] + word ids + [SEP], the words cut to max_length - 2 (0: no limit) from the right or left."""
    words = word_ids(text)
    if max_length and len(words) > max_length - 2:
        words = words[len(words) - (max_length - 2):] if keep_last else words[:max_length - 2]
    return [CLS, *words, SEP]


def register(models, key: str = "wordlevel", base: str = "head"):
    """The DemoModel of `base`'s files plus tokenizer.json, known to `models` as `key`."""
    made = models._made  # the e2e Models cache: get(key) and the servers fixture find it there
    if key not in made:
        b = models.get(base)
        d = models.root / key
        if not d.exists():
            shutil.copytree(b.dir, d)
            (d / "tokenizer.json").write_text(json.dumps(tokenizer_json(), indent=1), encoding="utf-8")
        made[key] = dataclasses.replace(b, key=key, dir=d, _cache={})
    return made[key]

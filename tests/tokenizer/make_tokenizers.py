"""The tokenizer.json files the parity test compares, built with the `tokenizers` package.

  wordlevel_notebook   the Fastformer notebook's tokenization as tools/export_fastformer.py
                       --word-dict writes it (word_dict_tokenizer): lower-case, NLTK wordpunct
                       (Python's \\w+|[^\\w\\s]+, matches kept), a word_dict of the frequent words
                       with 'PADDING' = 0 and an unknown-word id, truncation to 256 tokens (the
                       official config's max_position_embeddings).
  wordpiece_bert       BertNormalizer + BertPreTokenizer + WordPiece (WordPieceTrainer) +
                       BertProcessing.
  wordpiece_mixed      the other components: Sequence normalizer (NFKC, NFD, StripAccents,
                       Lowercase, NFC), Sequence pre-tokenizer (WhitespaceSplit, Punctuation
                       contiguous, Split merged_with_next on digits), TemplateProcessing, and
                       left truncation to 64 tokens.
  wordlevel_whitespace NFD + Whitespace + Split(String "-", merged_with_previous) + Split
                       (regex, invert) and right truncation to 16 tokens, no post-processor.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers


def _word_vocab(tok: Tokenizer, texts, min_count: int, first_ids: dict) -> dict:
    counts = collections.Counter()
    for t in texts:
        norm = tok.normalizer.normalize_str(t) if tok.normalizer else t
        counts.update(w for w, _ in tok.pre_tokenizer.pre_tokenize_str(norm))
    vocab = dict(first_ids)
    for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if c >= min_count and w not in vocab:
            vocab[w] = len(vocab)
    return vocab


def _exporter():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
    import export_fastformer
    return export_fastformer


def _exported_notebook(word_dict: dict) -> Tokenizer:
    return Tokenizer.from_str(json.dumps(_exporter().word_dict_tokenizer(word_dict, "[UNK]", 256)))


def wordlevel_notebook(train_texts) -> Tokenizer:
    """The exporter's own tokenizer.json, so the parity test proves what the exporter writes."""
    first_ids = {"PADDING": 0, "[UNK]": 1}
    return _exported_notebook(_word_vocab(_exported_notebook(first_ids), train_texts, 3, first_ids))


SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def wordpiece_bert(train_texts) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.train_from_iterator(train_texts, trainers.WordPieceTrainer(vocab_size=16000, special_tokens=SPECIALS))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")),
                                                   ("[CLS]", tok.token_to_id("[CLS]")))
    return tok


def wordpiece_mixed(train_texts) -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=20))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(),
                                           normalizers.Lowercase(), normalizers.NFC()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation(behavior="contiguous"),
        pre_tokenizers.Split(Regex(r"\d"), behavior="merged_with_next"),
    ])
    tok.train_from_iterator(train_texts, trainers.WordPieceTrainer(vocab_size=4000, special_tokens=SPECIALS))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.enable_truncation(64, direction="left")
    return tok


def wordlevel_whitespace(train_texts) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    tok.normalizer = normalizers.NFD()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Whitespace(),
        pre_tokenizers.Split("-", behavior="merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[aeiou]+"), behavior="isolated", invert=True),
    ])
    vocab = _word_vocab(tok, train_texts, 2, {"<unk>": 0})
    tok.model = models.WordLevel(vocab, unk_token="<unk>")
    tok.enable_truncation(16)
    return tok


BUILDERS = {
    "wordlevel_notebook": wordlevel_notebook,
    "wordpiece_bert": wordpiece_bert,
    "wordpiece_mixed": wordpiece_mixed,
    "wordlevel_whitespace": wordlevel_whitespace,
}


# ---- the code-point sweep: every assigned code point through each component ---------------
def sweep_texts() -> list[str]:
    """Every code point Python's unicodedata knows (no surrogates, no private use), each as
    'x<c>y -<c>-' so that a split on either side shows, between word characters and between
    punctuation, 64 to a text."""
    import unicodedata
    chars = [chr(c) for c in range(0x110000)
             if unicodedata.category(chr(c)) not in ("Cn", "Cs", "Co")]
    return [" ".join(f"x{c}y -{c}-" for c in chars[i:i + 64]) for i in range(0, len(chars), 64)]


def _char_vocab(texts, extra_normalizers=()) -> dict:
    vocab = {"[UNK]": 0}
    for t in texts:
        for c in t:
            for form in (c, *(n.normalize_str(c) for n in extra_normalizers)):
                for d in form:
                    for tok in (d, "##" + d):
                        vocab.setdefault(tok, len(vocab))
    return vocab


def sweep_tokenizers(texts) -> dict:
    """WordPiece over single characters (c and ##c), so the ids spell out the normalized
    text character by character and where each word starts."""
    norms = [normalizers.NFKC(), normalizers.NFD(), normalizers.Lowercase(),
             normalizers.BertNormalizer(), normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])]
    vocab = _char_vocab(texts, norms)
    out = {}

    def make(normalizer, pre_tokenizer):
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=1000))
        tok.normalizer = normalizer
        tok.pre_tokenizer = pre_tokenizer
        return tok

    out["sweep_bert"] = make(normalizers.BertNormalizer(), pre_tokenizers.BertPreTokenizer())
    out["sweep_bert_cased"] = make(normalizers.BertNormalizer(lowercase=False, strip_accents=False),
                                   pre_tokenizers.Whitespace())
    out["sweep_nfkc_lower_split"] = make(normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]),
                                         pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+"), "isolated"))
    out["sweep_nfd_strip_punct"] = make(normalizers.Sequence([normalizers.NFD(), normalizers.StripAccents()]),
                                        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                                 pre_tokenizers.Punctuation()]))
    out["sweep_lower_wordpunct"] = make(normalizers.Lowercase(),  # the exporter's --word-dict split
                                        pre_tokenizers.Split(Regex(_exporter().WORDPUNCT_PATTERN), "isolated"))
    out["sweep_nfc_digits"] = make(normalizers.NFC(),
                                   pre_tokenizers.Split(Regex(r"\s+|\d|\W"), "merged_with_previous"))
    return out

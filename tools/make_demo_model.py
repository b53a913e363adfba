#!/usr/bin/env python3
"""Generate a deterministic random Fastformer model directory (for demos and tests).

    make_demo_model.py --preset tiny|official|base-long --seed N --out DIR
                       [--dtype float32|float16|bfloat16] [--model-name NAME]
                       [--hidden D] [--heads H] [--layers N] [--intermediate I]
                       [--max-positions P] [--vocab V] [--act ACT] [--num-labels C]
                       [--share-layers] [--no-word-embedding] [--pad-token-id ID]
                       [--tokenizer]

Presets:
  tiny       D 32,  4 heads,  2 layers, I 64,   512 positions,   vocab 1000,  3 labels, gelu
  official   fastformer.json (D 256, 16 heads, 2 layers, I 256, gelu) but
             4096 positions, vocab 30522, 4 labels
  base-long  D 768, 12 heads, 12 layers, I 3072, 65536 positions, vocab 30522, no head, gelu

Initialisation (deliberately NOT the official std-0.02/zero-bias init, which makes
the network nearly linear): Linear weight N(0, 1/sqrt(in_features)), Linear bias
N(0, 0.1), LayerNorm weight 1 + N(0, 0.1), LayerNorm bias N(0, 0.1), embeddings
N(0, 1). Tensors are drawn in sorted-name order from one CPU torch.Generator
seeded with --seed (torch.manual_seed(seed) too), in float32, so the same
arguments always give the same bytes. The state_dict goes through
export_fastformer.export_model, which writes and verifies the directory.

--tokenizer also writes DIR/tokenizer.json: a small BERT-style WordPiece tokenizer
(BertNormalizer, BertPreTokenizer, BertProcessing) over DEMO_WORDS, so the random model
takes text; its ids are DEMO_WORDS' positions, easy to work out by hand in tests.

Importable: make_demo_config(preset, **overrides) -> dict,
demo_tokenizer() -> dict (tokenizer.json), DEMO_WORDS,
random_state_dict(config, seed, num_labels, word_embedding) -> dict,
make_demo_model(out, preset="tiny", seed=0, dtype="float32", model_name=None, **overrides) -> summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import OrderedDict

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_fastformer import DTYPES, ExportError, expected_shapes, export_model  # noqa: E402
from reference import ACTIVATIONS, load_config  # noqa: E402

OFFICIAL_CONFIG = {
    "hidden_size": 256, "hidden_dropout_prob": 0.2, "num_hidden_layers": 2, "hidden_act": "gelu",
    "num_attention_heads": 16, "intermediate_size": 256, "max_position_embeddings": 256,
    "type_vocab_size": 2, "vocab_size": 100000, "layer_norm_eps": 1e-12,
    "initializer_range": 0.02, "pooler_type": "weightpooler", "enable_fp16": "False",
}

PRESETS = {
    "tiny": dict(OFFICIAL_CONFIG, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                 intermediate_size=64, max_position_embeddings=512, vocab_size=1000, num_labels=3),
    "official": dict(OFFICIAL_CONFIG, max_position_embeddings=4096, vocab_size=30522, num_labels=4),
    "base-long": dict(OFFICIAL_CONFIG, hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                      intermediate_size=3072, max_position_embeddings=65536, vocab_size=30522,
                      num_labels=0),
}

# override keyword -> config key
OVERRIDES = {
    "hidden": "hidden_size", "heads": "num_attention_heads", "layers": "num_hidden_layers",
    "intermediate": "intermediate_size", "max_positions": "max_position_embeddings",
    "vocab": "vocab_size", "act": "hidden_act", "num_labels": "num_labels",
    "share_layers": "share_layer_parameters", "pad_token_id": "pad_token_id",
}


def make_demo_config(preset="tiny", **overrides) -> dict:
    """The config dict for a preset with overrides (keys of OVERRIDES, None = keep)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    cfg = dict(PRESETS[preset])
    cfg.setdefault("pad_token_id", 0)
    cfg.setdefault("share_layer_parameters", False)
    for k, v in overrides.items():
        if k not in OVERRIDES:
            raise ValueError(f"unknown override {k!r}")
        if v is not None:
            cfg[OVERRIDES[k]] = v
    return cfg


def random_state_dict(config, seed=0, num_labels=0, word_embedding=True) -> "OrderedDict[str, torch.Tensor]":
    """A float32 state_dict with the names/shapes the config implies, drawn deterministically."""
    c = load_config(config)
    shapes = expected_shapes(c)
    if word_embedding:
        shapes["word_embedding.weight"] = (c.vocab_size, c.hidden_size)
    if num_labels:
        shapes["dense_linear.weight"] = (num_labels, c.hidden_size)
        shapes["dense_linear.bias"] = (num_labels,)
    torch.manual_seed(seed)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    sd = OrderedDict()
    for name in sorted(shapes):
        shape = shapes[name]
        t = torch.randn(shape, generator=g, dtype=torch.float32)
        if name.endswith("embedding.weight") or name.endswith("embeddings.weight"):
            pass                                           # N(0, 1)
        elif "LayerNorm" in name:
            t.mul_(0.1)
            if name.endswith(".weight"):
                t.add_(1.0)                                # 1 + N(0, 0.1)
        elif name.endswith(".weight"):
            t.mul_(1.0 / math.sqrt(shape[1]))              # N(0, 1/sqrt(in))
        else:
            t.mul_(0.1)                                    # bias N(0, 0.1)
        sd[name] = t
    return sd


# The demo tokenizer's vocabulary: the id of a token is its position.
DEMO_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + """
. , ! ? ; : ' " ( ) - the a an of to in and is it that for on with as was be by this are or
from at not but have has had we you they he she i my your our their what which who when where how
quick brown fox jump over lazy dog cat cafe document long text server model token word sentence
fast former encode embedding hello world news sport music film book data ##s ##es ##ed ##ing ##ly ##er
""".split()


def demo_tokenizer() -> dict:
    """A BERT-style WordPiece tokenizer.json over DEMO_WORDS (lower-cased, accents stripped)."""
    vocab = {w: i for i, w in enumerate(DEMO_WORDS)}
    special = [{"id": vocab[w], "content": w, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for w in DEMO_WORDS[:4]]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True,
                       "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", vocab["[SEP]"]],
                           "cls": ["[CLS]", vocab["[CLS]"]]},
        "decoder": None,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": vocab},
    }


def make_demo_model(out, preset="tiny", seed=0, dtype="float32", model_name=None,
                    word_embedding=True, tokenizer=False, log=print, **overrides) -> dict:
    cfg = make_demo_config(preset, **overrides)
    num_labels = int(cfg.get("num_labels") or 0)
    if tokenizer and (not word_embedding or cfg["vocab_size"] < len(DEMO_WORDS)):
        raise ValueError(f"--tokenizer needs a word embedding of at least {len(DEMO_WORDS)} rows")
    sd = random_state_dict(cfg, seed=seed, num_labels=num_labels, word_embedding=word_embedding)
    summary = export_model(sd, cfg, out, dtype=dtype, model_name=model_name, log=log)
    if tokenizer:
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(demo_tokenizer(), f, indent=1)
            f.write("\n")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--model-name", default=None)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--heads", type=int)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--intermediate", type=int)
    ap.add_argument("--max-positions", type=int)
    ap.add_argument("--vocab", type=int)
    ap.add_argument("--act", choices=sorted(ACTIVATIONS))
    ap.add_argument("--num-labels", type=int, help="0 = no classifier head")
    ap.add_argument("--share-layers", action="store_true", default=None,
                    help="share_layer_parameters: one stored layer applied --layers times")
    ap.add_argument("--no-word-embedding", action="store_true",
                    help="no word_embedding.weight: the model accepts only input embeddings")
    ap.add_argument("--pad-token-id", type=int)
    ap.add_argument("--tokenizer", action="store_true",
                    help="also write a small demo WordPiece tokenizer.json (the model then takes text)")
    a = ap.parse_args(argv)
    try:
        make_demo_model(a.out, preset=a.preset, seed=a.seed, dtype=a.dtype, model_name=a.model_name,
                        word_embedding=not a.no_word_embedding, tokenizer=a.tokenizer,
                        hidden=a.hidden, heads=a.heads, layers=a.layers, intermediate=a.intermediate,
                        max_positions=a.max_positions, vocab=a.vocab, act=a.act,
                        num_labels=a.num_labels, share_layers=a.share_layers,
                        pad_token_id=a.pad_token_id)
    except (ExportError, ValueError) as e:
        print(f"make_demo_model: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

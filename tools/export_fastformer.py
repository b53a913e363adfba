#!/usr/bin/env python3
"""Export a PyTorch Fastformer checkpoint to a Fastformer Serving model directory.

    export_fastformer.py --checkpoint FILE --config fastformer.json --out DIR
                         [--dtype float32|float16|bfloat16] [--model-name NAME]
                         [--word-dict word_dict.json|.pkl [--unk-token T] [--max-length N]
                          | --tokenizer tokenizer.json] [--allow-pickle]

Accepted checkpoints (torch.load, map_location="cpu"; or a .safetensors file):
  * a state_dict of the reference/official `Model` (word_embedding.weight,
    dense_linear.*, fastformer_model.*);
  * a state_dict of a bare `FastformerEncoder` (the same names without the
    `fastformer_model.` prefix; written out with the prefix);
  * either of those nested under `state_dict`, `model_state_dict`, `model` or
    `module` (other entries such as `optimizer` or `epoch` are ignored), and/or
    with the `module.` prefix of DataParallel/DDP;
  * a pickled nn.Module (its state_dict()), only with --allow-pickle.
By default torch.load runs with weights_only=True (no arbitrary unpickling).

Every tensor is validated against the config; a wrong checkpoint fails (exit 1)
with the full list of missing, unexpected and mis-shaped tensors. Nothing is
dropped: unknown tensors are an error.

Output: DIR/config.json (the input config, plus vocab_size = word embedding
rows, num_labels, pad_token_id, share_layer_parameters, model_name) and
DIR/model.safetensors in the chosen dtype (converted once, from the source
precision). The written files are read back and compared bitwise.

Text in (optional): DIR/tokenizer.json, a Hugging Face `tokenizers` file that the
server loads with the model (docs/model-format.md):
  * --word-dict: from the official notebook's `word_dict` ({token: id}, 'PADDING'
    = 0), a JSON object or a pickled dict (.pkl; unpickling runs code, so only with
    --allow-pickle). The tokenizer.json reproduces the notebook's tokenization:
    text.lower(), NLTK's wordpunct_tokenize, the word_dict lookup with --unk-token
    (default '[UNK]', as tools/train_demo_model.py) for unknown words, the first
    --max-length tokens (default: the config's max_position_embeddings).
  * --tokenizer: an existing tokenizer.json, copied after checking that it parses,
    that its model is WordLevel or WordPiece and its components are ones the server
    supports.
Either way every id the tokenizer can produce (its vocabulary, added tokens and the
post-processor's special tokens) must be below vocab_size, or the export fails
naming the id.

Importable: export_model(state_dict, config_dict, out_dir, dtype="float32",
model_name=None, tokenizer=None) -> dict summary; word_dict_tokenizer(word_dict,
unk_token, max_length) -> tokenizer.json dict; load_word_dict(path, allow_pickle);
load_tokenizer_json(path); check_tokenizer(tokenizer, vocab_size);
extract_state_dict(obj); expected_shapes(config); validate_state_dict(state_dict,
config); ExportError.
"""

from __future__ import annotations

import argparse
import json
import numbers
import os
import sys
from collections import OrderedDict
from typing import List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference import ENCODER_PREFIX, load_config  # noqa: E402
from safetensors_io import read_safetensors, write_safetensors  # noqa: E402

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
DTYPE_ALIASES = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                 "half": "float16", "bf16": "bfloat16"}
NEST_KEYS = ("state_dict", "model_state_dict", "model", "module")
_INT_VIEW = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


class ExportError(Exception):
    """The checkpoint or config cannot be exported; the message lists every problem."""


# ----------------------------------------------------------------------------- checkpoint shapes


def extract_state_dict(obj) -> "OrderedDict[str, torch.Tensor]":
    """Find the flat name->tensor mapping in what torch.load returned."""
    if isinstance(obj, torch.nn.Module):
        obj = obj.state_dict()
    path = []
    while True:
        if not isinstance(obj, dict):
            raise ExportError(f"checkpoint{''.join(f'[{p!r}]' for p in path)} is a "
                              f"{type(obj).__name__}, not a state_dict")
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        for k in NEST_KEYS:
            if k in obj and isinstance(obj[k], (dict, torch.nn.Module)):
                obj = obj[k]
                if isinstance(obj, torch.nn.Module):
                    obj = obj.state_dict()
                path.append(k)
                break
        else:
            keys = ", ".join(repr(k) for k in list(obj)[:20])
            non_tensor = [k for k, v in obj.items() if not isinstance(v, torch.Tensor)]
            if obj and any(isinstance(v, torch.Tensor) for v in obj.values()):
                raise ExportError("checkpoint mixes tensors with other entries: "
                                  + ", ".join(repr(k) for k in non_tensor[:20]))
            raise ExportError(f"no state_dict found in checkpoint (top-level keys: {keys or 'none'}; "
                              f"looked for {', '.join(NEST_KEYS)})")
    sd = OrderedDict((str(k), v) for k, v in obj.items())
    if sd and all(k.startswith("module.") for k in sd):
        sd = OrderedDict((k[len("module."):], v) for k, v in sd.items())
    return sd


def normalize_state_dict(sd) -> "OrderedDict[str, torch.Tensor]":
    """Bare FastformerEncoder names get the `fastformer_model.` prefix."""
    if any(k.startswith(ENCODER_PREFIX) for k in sd):
        return OrderedDict(sd)
    return OrderedDict(
        (k if k.startswith(("word_embedding.", "dense_linear.")) else ENCODER_PREFIX + k, v)
        for k, v in sd.items())


def expected_shapes(config) -> "OrderedDict[str, Tuple[int, ...]]":
    """Required tensors and shapes implied by config (no word embedding / head)."""
    c = load_config(config)
    D, H, I = c.hidden_size, c.num_attention_heads, c.intermediate_size
    p = ENCODER_PREFIX
    shapes = OrderedDict()
    shapes[p + "position_embeddings.weight"] = (c.max_position_embeddings, D)
    shapes[p + "LayerNorm.weight"] = (D,)
    shapes[p + "LayerNorm.bias"] = (D,)
    n_layers = 1 if c.share_layer_parameters else c.num_hidden_layers
    for i in range(n_layers):
        q = f"{p}encoders.{i}."
        for name in ("query", "key", "transform"):
            shapes[f"{q}attention.self.{name}.weight"] = (D, D)
            shapes[f"{q}attention.self.{name}.bias"] = (D,)
        for name in ("query_att", "key_att"):
            shapes[f"{q}attention.self.{name}.weight"] = (H, D)
            shapes[f"{q}attention.self.{name}.bias"] = (H,)
        shapes[f"{q}attention.output.dense.weight"] = (D, D)
        shapes[f"{q}attention.output.dense.bias"] = (D,)
        shapes[f"{q}attention.output.LayerNorm.weight"] = (D,)
        shapes[f"{q}attention.output.LayerNorm.bias"] = (D,)
        shapes[f"{q}intermediate.dense.weight"] = (I, D)
        shapes[f"{q}intermediate.dense.bias"] = (I,)
        shapes[f"{q}output.dense.weight"] = (D, I)
        shapes[f"{q}output.dense.bias"] = (D,)
        shapes[f"{q}output.LayerNorm.weight"] = (D,)
        shapes[f"{q}output.LayerNorm.bias"] = (D,)
    shapes[p + "poolers.0.att_fc1.weight"] = (D, D)
    shapes[p + "poolers.0.att_fc1.bias"] = (D,)
    shapes[p + "poolers.0.att_fc2.weight"] = (1, D)
    shapes[p + "poolers.0.att_fc2.bias"] = (1,)
    return shapes


def _fmt(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def validate_state_dict(sd, config) -> Tuple[Optional[int], int]:
    """Check names/shapes/dtypes against config. Returns (vocab rows or None, num_labels).

    Raises ExportError listing every missing, unexpected and mis-shaped tensor."""
    c = load_config(config)
    D = c.hidden_size
    expected = expected_shapes(c)
    we = sd.get("word_embedding.weight")
    hw, hb = sd.get("dense_linear.weight"), sd.get("dense_linear.bias")
    vocab = None
    num_labels = 0
    shown = {}
    if we is not None:
        vocab = we.shape[0] if we.dim() == 2 else None
        expected["word_embedding.weight"] = (vocab if vocab is not None else -1, D)
        shown["word_embedding.weight"] = f"[V, {D}]"
    if hw is not None or hb is not None:
        if hw is not None and hw.dim() == 2:
            num_labels = hw.shape[0]
        elif hb is not None and hb.dim() == 1:
            num_labels = hb.shape[0]
        expected["dense_linear.weight"] = (num_labels, D)
        expected["dense_linear.bias"] = (num_labels,)

    missing = [n for n in expected if n not in sd]
    unexpected = [n for n in sd if n not in expected]
    misshaped = [n for n in expected if n in sd and tuple(sd[n].shape) != expected[n]]
    bad_dtype = [n for n in sd if isinstance(sd[n], torch.Tensor) and not sd[n].is_floating_point()]
    lines: List[str] = []
    if missing:
        lines.append(f"missing tensors ({len(missing)}):")
        lines += [f"  {n}  expected shape {_fmt(expected[n])}" for n in missing]
    if unexpected:
        lines.append(f"unexpected tensors ({len(unexpected)}):")
        for n in unexpected:
            hint = ""
            if c.share_layer_parameters and ".encoders." in n and f"{ENCODER_PREFIX}encoders.0." not in n:
                hint = "  (share_layer_parameters is true: only encoders.0.* is stored)"
            lines.append(f"  {n}  shape {_fmt(sd[n].shape)}{hint}")
    if misshaped:
        lines.append(f"mis-shaped tensors ({len(misshaped)}):")
        lines += [f"  {n}  expected shape {shown.get(n, _fmt(expected[n]))}, found {_fmt(sd[n].shape)}"
                  for n in misshaped]
    if bad_dtype:
        lines.append(f"non-floating-point tensors ({len(bad_dtype)}):")
        lines += [f"  {n}  dtype {sd[n].dtype}" for n in bad_dtype]
    if vocab is not None and not 0 <= c.pad_token_id < vocab:
        lines.append(f"pad_token_id {c.pad_token_id} is outside the word embedding's {vocab} rows")
    if we is None and hw is None and hb is None and not [n for n in sd if n in expected]:
        lines.insert(0, "the checkpoint has none of the expected tensor names "
                        "(is this a Fastformer state_dict?)")
    if lines:
        raise ExportError("checkpoint does not match the config:\n" + "\n".join(lines))
    return vocab, num_labels


# ----------------------------------------------------------------------------- tokenizer.json

NOTEBOOK_UNK_TOKEN = "[UNK]"  # the unknown word of tools/train_demo_model.py's word_dict
# The notebook's re.findall(r"\w+|[^\w\s]+", text.lower()) (NLTK's wordpunct_tokenize) with
# Python's classes spelled out: Python's \w is exactly [\p{L}\p{N}_] (str.isalnum() or "_")
# and its \s is White_Space plus U+001C..U+001F, while the `tokenizers` package's \w
# (Oniguruma) also takes the marks (Mn, Mc, Me) and every connector punctuation, so the
# literal pattern would keep "e\u0301" or Devanagari's vowel signs in a word where the
# notebook splits them off.
WORDPUNCT_PATTERN = r"[\p{L}\p{N}_]+|[^\p{L}\p{N}_\s\x{1C}-\x{1F}]+"
# What the server's tokenizer loads (server/text/tokenizer/tokenizer.cc; keep in step).
SUPPORTED_COMPONENTS = {
    "model": ("WordLevel", "WordPiece"),
    "normalizer": ("BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents", "Sequence"),
    "pre_tokenizer": ("BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Split", "Sequence"),
    "post_processor": ("BertProcessing", "TemplateProcessing"),
}
_SEQUENCE_KEYS = {"normalizer": "normalizers", "pre_tokenizer": "pretokenizers"}


def _is_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31


def word_dict_tokenizer(word_dict, unk_token: str = NOTEBOOK_UNK_TOKEN, max_length: Optional[int] = None) -> dict:
    """The tokenizer.json (a dict, for json.dump) of the notebook's tokenization with `word_dict`.

    Lowercase, then a Split keeping the matches of WORDPUNCT_PATTERN (behavior Removed with
    invert: the text between matches, whitespace, is dropped), then a WordLevel lookup with
    `unk_token` for words not in the dict, then the first `max_length` tokens (None: no
    truncation). No added tokens, no post-processor, no padding: the notebook adds no special
    tokens, and a '[UNK]' written in a text is tokenized as '[', 'unk', ']' there too."""
    if not isinstance(word_dict, dict) or not word_dict:
        raise ExportError("word_dict must be a non-empty {token: id} object")
    bad = [f"{k!r}: {v!r}" for k, v in word_dict.items() if not isinstance(k, str) or not _is_id(v)]
    if bad:
        raise ExportError(f"word_dict must map strings to ids in [0, 2^31); {len(bad)} entries do not, "
                          f"e.g. {', '.join(bad[:5])}")
    if unk_token not in word_dict:
        raise ExportError(f"the unknown-word token {unk_token!r} is not in the word_dict "
                          f"({len(word_dict)} entries); name the word_dict's own with --unk-token (the "
                          "official notebook's word_dict has none, as it holds every word of its data: "
                          "--unk-token PADDING gives unknown words id 0, which the model masks as padding)")
    if max_length is not None and (not _is_id(max_length) or max_length < 1):
        raise ExportError(f"max_length must be a positive integer, not {max_length!r}")
    truncation = None
    if max_length is not None:
        truncation = {"direction": "Right", "max_length": max_length, "strategy": "LongestFirst", "stride": 0}
    return {
        "version": "1.0",
        "truncation": truncation,
        "padding": None,
        "added_tokens": [],
        "normalizer": {"type": "Lowercase"},
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": WORDPUNCT_PATTERN},
                          "behavior": "Removed", "invert": True},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": dict(sorted(word_dict.items(), key=lambda kv: kv[1])),
                  "unk_token": unk_token},
    }


def load_word_dict(path, allow_pickle: bool = False) -> dict:
    """A word_dict from JSON, or from a pickle (.pkl/.pickle) only with allow_pickle: unpickling
    runs whatever code the file names, so only for files you trust."""
    path = os.fspath(path)
    if path.endswith((".pkl", ".pickle")):
        if not allow_pickle:
            raise ExportError(f"{path}: a pickle runs code when loaded; if you trust this file, rerun with "
                              "--allow-pickle (or save the word_dict as JSON: json.dump(word_dict, f))")
        import pickle
        with open(path, "rb") as f:
            word_dict = pickle.load(f)
        if isinstance(word_dict, dict):  # numpy integers from a notebook are ids too
            word_dict = {k: int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v
                         for k, v in word_dict.items()}
    else:
        with open(path, encoding="utf-8") as f:
            try:
                word_dict = json.load(f)
            except json.JSONDecodeError as e:
                raise ExportError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(word_dict, dict):
        raise ExportError(f"{path}: expected a {{token: id}} object, found a {type(word_dict).__name__}")
    return word_dict


def load_tokenizer_json(path) -> dict:
    """An existing tokenizer.json, checked to parse as a JSON object."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        raw = f.read()
    try:
        tok = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ExportError(f"{path}: not a tokenizer.json: not valid JSON ({e})") from None
    if not isinstance(tok, dict) or not isinstance(tok.get("model"), dict):
        raise ExportError(f"{path}: not a tokenizer.json: no \"model\" object")
    return tok


def _check_types(kind: str, component, path: str) -> None:
    if component is None and kind != "model":
        return
    t = component.get("type") if isinstance(component, dict) else None
    if t not in SUPPORTED_COMPONENTS[kind]:
        raise ExportError(f"tokenizer.json: {path}.type {t} is not supported by the server "
                          f"(supported: {', '.join(SUPPORTED_COMPONENTS[kind])})")
    if t == "Sequence" and kind in _SEQUENCE_KEYS:
        key = _SEQUENCE_KEYS[kind]
        for i, part in enumerate(component.get(key) or []):
            _check_types(kind, part, f"{path}.{key}[{i}]")


def _token_ids(tok: dict):
    """(where, id) for every id the tokenizer can produce."""
    vocab = tok["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise ExportError("tokenizer.json: model.vocab must be an object of token: id")
    for token, i in vocab.items():
        yield f"model.vocab[{token!r}]", i
    for k, a in enumerate(tok.get("added_tokens") or []):
        yield f"added_tokens[{k}] {a.get('content')!r}", a.get("id")
    post = tok.get("post_processor") or {}
    for key in ("cls", "sep"):  # BertProcessing: [token, id]
        if isinstance(post.get(key), list) and len(post[key]) == 2:
            yield f"post_processor.{key} {post[key][0]!r}", post[key][1]
    for name, special in (post.get("special_tokens") or {}).items():  # TemplateProcessing
        for i in special.get("ids") or []:
            yield f"post_processor.special_tokens[{name!r}]", i


def check_tokenizer(tok: dict, vocab_size: Optional[int]) -> int:
    """Check the components against what the server supports and every id against
    vocab_size (the word embedding's rows). Returns the largest id. Raises ExportError."""
    for kind in SUPPORTED_COMPONENTS:
        _check_types(kind, tok.get(kind), kind)
    if vocab_size is None:
        raise ExportError("a tokenizer needs a word embedding (word_embedding.weight): without one "
                          "the model takes input embeddings only, no token ids")
    largest, where = -1, None
    try:
        for w, i in _token_ids(tok):
            if not _is_id(i):
                raise ExportError(f"tokenizer.json: {w} has id {i!r}, not a token id in [0, 2^31)")
            if i > largest:
                largest, where = i, w
    except (AttributeError, TypeError) as e:  # an entry of the wrong JSON type
        raise ExportError(f"tokenizer.json: malformed added_tokens or post_processor ({e})") from None
    if largest < 0:
        raise ExportError("tokenizer.json: the model's vocab is empty")
    if largest >= vocab_size:
        raise ExportError(f"tokenizer.json: {where} has token id {largest}, but the model's vocab_size is "
                          f"{vocab_size} (rows of word_embedding.weight): every id must be below it")
    return largest


# ----------------------------------------------------------------------------- export


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_INT_VIEW[t.dtype])


def _canon_dtype(dtype) -> str:
    if isinstance(dtype, torch.dtype):
        for k, v in DTYPES.items():
            if v == dtype:
                return k
    d = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if d not in DTYPES:
        raise ExportError(f"unsupported dtype {dtype!r}; choose float32, float16 or bfloat16")
    return d


def export_model(state_dict, config_dict, out_dir, dtype="float32", model_name=None,
                 log=print, tokenizer: Optional[dict] = None) -> dict:
    """Validate, convert and write DIR/config.json + DIR/model.safetensors (and
    DIR/tokenizer.json from the `tokenizer` dict, checked by check_tokenizer), then
    verify the written files. Returns a summary dict. Raises ExportError."""
    dtype_name = _canon_dtype(dtype)
    tdtype = DTYPES[dtype_name]
    if isinstance(config_dict, (str, os.PathLike)):
        with open(config_dict, encoding="utf-8") as f:
            config_dict = json.load(f)
    if not isinstance(config_dict, dict):
        raise ExportError("config must be a JSON object")
    try:
        cfg = load_config(config_dict)
    except ValueError as e:
        raise ExportError(f"invalid config: {e}") from None
    sd = normalize_state_dict(extract_state_dict(state_dict))
    vocab, num_labels = validate_state_dict(sd, cfg)
    if tokenizer is not None:
        check_tokenizer(tokenizer, vocab)

    # convert once, from the source precision; check representability
    converted = OrderedDict()
    nonfinite = []
    for name in sorted(sd):
        src = sd[name].detach().cpu()
        if not torch.isfinite(src).all():
            nonfinite.append(f"  {name}: the checkpoint holds NaN/Inf values")
            continue
        t = src.to(tdtype).contiguous()
        if not torch.isfinite(t).all():
            nonfinite.append(f"  {name}: values overflow {dtype_name} "
                             f"(max |x| = {src.abs().max().item():.6g})")
        converted[name] = t
    if nonfinite:
        raise ExportError("non-finite weights:\n" + "\n".join(nonfinite))

    out = dict(config_dict)
    if vocab is not None:
        old = config_dict.get("vocab_size")
        if old != vocab:
            log(f"note: vocab_size set to {vocab} (rows of word_embedding.weight; config said {old})")
        out["vocab_size"] = vocab
    out["num_labels"] = num_labels
    out["pad_token_id"] = cfg.pad_token_id
    out["share_layer_parameters"] = cfg.share_layer_parameters
    out_dir = os.fspath(out_dir)
    if model_name is None:
        model_name = config_dict.get("model_name") or os.path.basename(os.path.normpath(os.path.abspath(out_dir)))
    out["model_name"] = model_name

    os.makedirs(out_dir, exist_ok=True)
    cfg_path = os.path.join(out_dir, "config.json")
    st_path = os.path.join(out_dir, "model.safetensors")
    nbytes = write_safetensors(st_path, converted, metadata={"format": "pt"})
    tmp = f"{cfg_path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(tmp, cfg_path)
    tok_path = os.path.join(out_dir, "tokenizer.json")
    if tokenizer is not None:
        tmp = f"{tok_path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(tokenizer, f, ensure_ascii=False)
        os.replace(tmp, tok_path)
    elif os.path.lexists(tok_path):
        log(f"note: {tok_path} from before is left as it was (the server loads it with this model)")

    # verify what was written
    back = read_safetensors(st_path)
    problems = []
    if set(back) != set(converted):
        problems.append(f"tensor names differ: {sorted(set(back) ^ set(converted))}")
    for name, t in converted.items():
        b = back.get(name)
        if b is None:
            continue
        if b.dtype != tdtype or tuple(b.shape) != tuple(t.shape) or not torch.equal(_bits(b), _bits(t)):
            problems.append(f"{name}: read back differs")
    with open(cfg_path, encoding="utf-8") as f:
        if json.load(f) != out:
            problems.append("config.json does not round-trip")
    try:
        load_config(out)
    except ValueError as e:
        problems.append(f"written config is invalid: {e}")
    if tokenizer is not None:
        with open(tok_path, encoding="utf-8") as f:
            if json.load(f) != tokenizer:
                problems.append("tokenizer.json does not round-trip")
    if problems:
        raise ExportError("verification of the written files failed:\n  " + "\n  ".join(problems))

    params = sum(t.numel() for t in converted.values())
    summary = {"out_dir": out_dir, "tensors": len(converted), "parameters": params,
               "bytes": nbytes, "dtype": dtype_name, "vocab_size": out.get("vocab_size"),
               "num_labels": num_labels, "model_name": model_name,
               "tokenizer": tokenizer["model"]["type"] if tokenizer is not None else None}
    log(f"exported {out_dir}: {len(converted)} tensors, {params:,} parameters, "
        f"{nbytes:,} bytes, {dtype_name}"
        + (f", tokenizer.json ({tokenizer['model']['type']}, {len(tokenizer['model']['vocab']):,} tokens)"
           if tokenizer is not None else ""))
    return summary


def load_checkpoint(path, allow_pickle=False):
    if str(path).endswith(".safetensors"):
        return read_safetensors(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except Exception as e:  # noqa: BLE001
        if not allow_pickle:
            raise ExportError(f"{path}: cannot be loaded with weights_only=True ({str(e).splitlines()[0]}); "
                              "if you trust this file, rerun with --allow-pickle") from None
        raise ExportError(f"{path}: cannot load checkpoint: {e}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="torch.save'd state_dict (or .safetensors)")
    ap.add_argument("--config", required=True, help="training config JSON (fastformer.json)")
    ap.add_argument("--out", required=True, help="output model directory")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES) + sorted(DTYPE_ALIASES),
                    help="weight dtype in model.safetensors (default float32)")
    ap.add_argument("--model-name", default=None, help="model_name in config.json (default: basename of --out)")
    text = ap.add_mutually_exclusive_group()
    text.add_argument("--word-dict", default=None, metavar="FILE",
                      help="the notebook's word_dict (.json, or .pkl with --allow-pickle): "
                           "write DIR/tokenizer.json with its tokenization")
    text.add_argument("--tokenizer", default=None, metavar="FILE",
                      help="copy this Hugging Face tokenizer.json into DIR after checking it")
    ap.add_argument("--unk-token", default=NOTEBOOK_UNK_TOKEN,
                    help=f"with --word-dict: the unknown-word token (default {NOTEBOOK_UNK_TOKEN!r})")
    ap.add_argument("--max-length", type=int, default=None,
                    help="with --word-dict: truncate to this many tokens "
                         "(default: the config's max_position_embeddings)")
    ap.add_argument("--allow-pickle", action="store_true",
                    help="torch.load without weights_only, and unpickle a --word-dict .pkl "
                         "(both run code from the file: only for trusted files)")
    args = ap.parse_args(argv)
    if args.word_dict is None and (args.max_length is not None or args.unk_token != NOTEBOOK_UNK_TOKEN):
        ap.error("--unk-token and --max-length go with --word-dict")
    try:
        with open(args.config, encoding="utf-8") as f:
            config = json.load(f)
        tokenizer = None
        if args.word_dict is not None:
            positions = config.get("max_position_embeddings") if isinstance(config, dict) else None
            max_length = args.max_length if args.max_length is not None else positions
            if isinstance(positions, int) and isinstance(max_length, int) and max_length > positions:
                raise ExportError(f"--max-length {max_length} exceeds the model's max_position_embeddings "
                                  f"{positions}")
            tokenizer = word_dict_tokenizer(load_word_dict(args.word_dict, args.allow_pickle),
                                            args.unk_token, max_length)
        elif args.tokenizer is not None:
            tokenizer = load_tokenizer_json(args.tokenizer)
        obj = load_checkpoint(args.checkpoint, allow_pickle=args.allow_pickle)
        export_model(obj, config, args.out, dtype=args.dtype, model_name=args.model_name,
                     tokenizer=tokenizer)
    except ExportError as e:
        print(f"export_fastformer: error: {e}", file=sys.stderr)
        return 1
    except (OSError, json.JSONDecodeError) as e:
        print(f"export_fastformer: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Export a PyTorch Fastformer checkpoint to a Fastformer Serving model directory.

    export_fastformer.py --checkpoint FILE --config fastformer.json --out DIR
                         [--dtype float32|float16|bfloat16] [--model-name NAME]
                         [--allow-pickle]

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

Importable: export_model(state_dict, config_dict, out_dir, dtype="float32",
model_name=None) -> dict summary; extract_state_dict(obj); expected_shapes(config);
validate_state_dict(state_dict, config); ExportError.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

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
                 log=print) -> dict:
    """Validate, convert and write DIR/config.json + DIR/model.safetensors, then
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
    if problems:
        raise ExportError("verification of the written files failed:\n  " + "\n  ".join(problems))

    params = sum(t.numel() for t in converted.values())
    summary = {"out_dir": out_dir, "tensors": len(converted), "parameters": params,
               "bytes": nbytes, "dtype": dtype_name, "vocab_size": out.get("vocab_size"),
               "num_labels": num_labels, "model_name": model_name}
    log(f"exported {out_dir}: {len(converted)} tensors, {params:,} parameters, "
        f"{nbytes:,} bytes, {dtype_name}")
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
    ap.add_argument("--allow-pickle", action="store_true",
                    help="torch.load without weights_only (only for trusted files)")
    args = ap.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as f:
            config = json.load(f)
        obj = load_checkpoint(args.checkpoint, allow_pickle=args.allow_pickle)
        export_model(obj, config, args.out, dtype=args.dtype, model_name=args.model_name)
    except ExportError as e:
        print(f"export_fastformer: error: {e}", file=sys.stderr)
        return 1
    except (OSError, json.JSONDecodeError) as e:
        print(f"export_fastformer: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

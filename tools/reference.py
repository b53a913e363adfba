#!/usr/bin/env python3
"""Reference Fastformer (PyTorch), structured exactly as the official code.

This mirrors the official implementation (wuch15/Fastformer, notebook
Fastformer.ipynb, config fastformer.json) module by module and attribute by
attribute, so an official state_dict loads with strict=True:

    Model
      word_embedding            Embedding(vocab, D, padding_idx)      (optional here)
      fastformer_model          FastformerEncoder
        encoders[i]             FastformerLayer
          attention             FastAttention
            self                FastSelfAttention (query, query_att, key, key_att, transform)
            output              BertSelfOutput    (dense, LayerNorm, dropout)
          intermediate          BertIntermediate  (dense, act)
          output                BertOutput        (dense, LayerNorm, dropout)
        position_embeddings     Embedding(max_position_embeddings, D)
        LayerNorm, dropout
        poolers[0]              AttentionPooling  (att_fc1, att_fc2)
      dense_linear              Linear(D, num_labels)                 (optional here)

Differences from the official code, all of them value-preserving:
  * The pooler is computed as a stable softmax (the max over the real tokens is
    subtracted, and the 1e-8 of the official denominator is scaled the same way),
    so it equals the official formula wherever that one is finite.
  * Extensions: `pad_token_id` (mask = ids != pad_token_id, official: 0),
    `share_layer_parameters` (one FastformerLayer applied num_hidden_layers
    times; only encoders.0.* in the state_dict), optional head and optional word
    embedding, and `encode_all` returning (pooled, last hidden states, logits).
  * Everything runs in float64 with `model.double()`.

Public API:
    load_config(path_or_dict) -> Config
    build_model(config, vocab_size=None, num_labels=None, word_embedding=True) -> Model
    load_model_dir(model_dir, dtype=torch.float64) -> (Model, Config)
    state_dict_from_dir(model_dir) -> dict
    reference_encode(model, sequences, kind="ids"|"embeddings", padded=False,
                     dtype=torch.float64) -> list of EncodeResult(embedding, token_embeddings, logits)
    ACTIVATIONS, get_activation(name)
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_io import read_safetensors  # noqa: E402

# ----------------------------------------------------------------------------- config


def _gelu_erf(x):
    return F.gelu(x)


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


ACTIVATIONS = {
    "gelu": _gelu_erf,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def get_activation(name):
    try:
        return ACTIVATIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unsupported hidden_act {name!r}; supported: "
                         f"{', '.join(sorted(ACTIVATIONS))}") from None


def _as_bool(v, key):
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    raise ValueError(f"config: {key} must be a boolean, got {v!r}")


REQUIRED_KEYS = ("hidden_size", "num_attention_heads", "num_hidden_layers",
                 "intermediate_size", "max_position_embeddings")
DEFAULTS = {
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "hidden_dropout_prob": 0.0,
    "pad_token_id": 0,
    "share_layer_parameters": False,
    "pooler_type": "weightpooler",
    "initializer_range": 0.02,
}


class Config:
    """A config.json as an object with attributes; defaults filled in.

    `raw` is the dict as read (without defaults), `to_dict()` the dict with defaults."""

    def __init__(self, d: dict):
        self.raw = dict(d)
        merged = dict(DEFAULTS)
        merged.update(d)
        for k in REQUIRED_KEYS:
            if k not in merged:
                raise ValueError(f"config: missing required key {k!r}")
            v = merged[k]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"config: {k} must be a positive integer, got {v!r}")
        if merged["hidden_size"] % merged["num_attention_heads"]:
            raise ValueError(f"config: hidden_size {merged['hidden_size']} is not a multiple of "
                             f"num_attention_heads {merged['num_attention_heads']}")
        get_activation(merged["hidden_act"])
        merged["share_layer_parameters"] = _as_bool(merged["share_layer_parameters"],
                                                    "share_layer_parameters")
        pad = merged["pad_token_id"]
        if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
            raise ValueError(f"config: pad_token_id must be a non-negative integer, got {pad!r}")
        eps = merged["layer_norm_eps"]
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
            raise ValueError(f"config: layer_norm_eps must be a positive number, got {eps!r}")
        merged["layer_norm_eps"] = float(eps)
        for k, v in merged.items():
            setattr(self, k, v)
        self._keys = list(merged)

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._keys}

    def __repr__(self):
        return f"Config({self.to_dict()!r})"


def load_config(path_or_dict) -> Config:
    """Config from a dict, a Config, a config.json path, or a model directory."""
    if isinstance(path_or_dict, Config):
        return path_or_dict
    if isinstance(path_or_dict, dict):
        return Config(path_or_dict)
    path = os.fspath(path_or_dict)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, "r", encoding="utf-8") as f:
        d = json.load(f)
    if not isinstance(d, dict):
        raise ValueError(f"{path}: config is not a JSON object")
    return Config(d)


# ----------------------------------------------------------------------------- modules


class AttentionPooling(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.att_fc1 = nn.Linear(config.hidden_size, config.hidden_size)
        self.att_fc2 = nn.Linear(config.hidden_size, 1)

    def forward(self, x, attn_mask=None):
        """Stable form of the official pooler.

        official: alpha = exp(z) * m;  alpha / (sum(alpha) + 1e-8)
        here:     alpha = exp(z - zmax) * m;  alpha / (sum(alpha) + 1e-8 * exp(-zmax))
        with zmax the max of z over the real tokens (identical in exact arithmetic)."""
        bz = x.shape[0]
        e = torch.tanh(self.att_fc1(x))
        z = self.att_fc2(e)  # [B, L, 1]
        if attn_mask is None:
            attn_mask = torch.ones(z.shape[:2], dtype=z.dtype, device=z.device)
        m = attn_mask.to(z.dtype).unsqueeze(2)
        zmax = torch.where(m > 0, z, torch.full_like(z, -math.inf)).amax(dim=1, keepdim=True)
        zmax = torch.where(torch.isfinite(zmax), zmax, torch.zeros_like(zmax))  # no real token
        alpha = torch.exp(z - zmax) * m
        alpha = alpha / (torch.sum(alpha, dim=1, keepdim=True) + 1e-8 * torch.exp(-zmax))
        out = torch.bmm(x.permute(0, 2, 1), alpha)
        return torch.reshape(out, (bz, -1))

    def forward_official(self, x, attn_mask=None):
        """The official (unstable) formula, for tests."""
        bz = x.shape[0]
        e = torch.tanh(self.att_fc1(x))
        alpha = torch.exp(self.att_fc2(e))
        if attn_mask is not None:
            alpha = alpha * attn_mask.unsqueeze(2)
        alpha = alpha / (torch.sum(alpha, dim=1, keepdim=True) + 1e-8)
        out = torch.bmm(x.permute(0, 2, 1), alpha)
        return torch.reshape(out, (bz, -1))


class FastSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError("hidden_size must be a multiple of num_attention_heads")
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.num_attention_heads = config.num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.input_dim = config.hidden_size
        self.query = nn.Linear(self.input_dim, self.all_head_size)
        self.query_att = nn.Linear(self.all_head_size, self.num_attention_heads)
        self.key = nn.Linear(self.input_dim, self.all_head_size)
        self.key_att = nn.Linear(self.all_head_size, self.num_attention_heads)
        self.transform = nn.Linear(self.all_head_size, self.all_head_size)
        self.softmax = nn.Softmax(dim=-1)

    def transpose_for_scores(self, x):
        new_x_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        x = x.view(*new_x_shape)
        return x.permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask):
        # hidden_states [B, L, D]; attention_mask [B, 1, L] additive (0 or -10000)
        batch_size, seq_len, _ = hidden_states.shape
        mixed_query_layer = self.query(hidden_states)
        mixed_key_layer = self.key(hidden_states)
        # [B, H, L]
        query_for_score = self.query_att(mixed_query_layer).transpose(1, 2) / self.attention_head_size ** 0.5
        query_for_score = query_for_score + attention_mask
        query_weight = self.softmax(query_for_score).unsqueeze(2)  # [B, H, 1, L]
        query_layer = self.transpose_for_scores(mixed_query_layer)  # [B, H, L, d]
        pooled_query = torch.matmul(query_weight, query_layer).transpose(1, 2).reshape(
            -1, 1, self.num_attention_heads * self.attention_head_size)
        pooled_query_repeat = pooled_query.repeat(1, seq_len, 1)
        mixed_query_key_layer = mixed_key_layer * pooled_query_repeat
        query_key_score = (self.key_att(mixed_query_key_layer) / self.attention_head_size ** 0.5).transpose(1, 2)
        query_key_score = query_key_score + attention_mask
        query_key_weight = self.softmax(query_key_score).unsqueeze(2)
        key_layer = self.transpose_for_scores(mixed_query_key_layer)
        pooled_key = torch.matmul(query_key_weight, key_layer)
        # query = value
        weighted_value = (pooled_key * query_layer).transpose(1, 2)
        weighted_value = weighted_value.reshape(
            weighted_value.size()[:-2] + (self.num_attention_heads * self.attention_head_size,))
        weighted_value = self.transform(weighted_value) + mixed_query_layer
        return weighted_value


class BertSelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class BertIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = get_activation(config.hidden_act)

    def forward(self, hidden_states):
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor):
        hidden_states = self.dense(hidden_states)
        hidden_states = self.dropout(hidden_states)
        return self.LayerNorm(hidden_states + input_tensor)


class FastAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self = FastSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(self, input_tensor, attention_mask):
        self_output = self.self(input_tensor, attention_mask)
        return self.output(self_output, input_tensor)


class FastformerLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = FastAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, hidden_states, attention_mask):
        attention_output = self.attention(hidden_states, attention_mask)
        intermediate_output = self.intermediate(attention_output)
        return self.output(intermediate_output, attention_output)


class FastformerEncoder(nn.Module):
    def __init__(self, config, pooler_count=1):
        super().__init__()
        config = load_config(config)
        self.config = config
        n_stored = 1 if config.share_layer_parameters else config.num_hidden_layers
        self.encoders = nn.ModuleList([FastformerLayer(config) for _ in range(n_stored)])
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.poolers = nn.ModuleList()
        if config.pooler_type == "weightpooler":
            for _ in range(pooler_count):
                self.poolers.append(AttentionPooling(config))

    def layer_sequence(self):
        if self.config.share_layer_parameters:
            return [self.encoders[0]] * self.config.num_hidden_layers
        return list(self.encoders)

    def forward_all(self, input_embs, attention_mask, pooler_index=0):
        """Returns (pooled [B, D], last hidden states [B, L, D])."""
        extended_attention_mask = attention_mask.unsqueeze(1)
        extended_attention_mask = extended_attention_mask.to(dtype=next(self.parameters()).dtype)
        extended_attention_mask = (1.0 - extended_attention_mask) * -10000.0
        batch_size, seq_length, emb_dim = input_embs.shape
        if seq_length > self.config.max_position_embeddings:
            raise ValueError(f"sequence of {seq_length} tokens exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        position_ids = torch.arange(seq_length, dtype=torch.long, device=input_embs.device)
        position_ids = position_ids.unsqueeze(0).expand(batch_size, -1)
        position_embeddings = self.position_embeddings(position_ids)
        embeddings = input_embs + position_embeddings
        embeddings = self.LayerNorm(embeddings)
        embeddings = self.dropout(embeddings)
        hidden = embeddings
        for layer_module in self.layer_sequence():
            hidden = layer_module(hidden, extended_attention_mask)
        assert len(self.poolers) > pooler_index
        output = self.poolers[pooler_index](hidden, attention_mask.to(hidden.dtype))
        return output, hidden

    def forward(self, input_embs, attention_mask, pooler_index=0):
        return self.forward_all(input_embs, attention_mask, pooler_index)[0]


class Model(nn.Module):
    """The official `Model`, with optional word embedding and head."""

    def __init__(self, config, vocab_size=None, num_labels=4, word_embedding=True):
        super().__init__()
        config = load_config(config)
        self.config = config
        if num_labels:
            self.dense_linear = nn.Linear(config.hidden_size, num_labels)
        else:
            self.dense_linear = None
        if word_embedding:
            if vocab_size is None:
                vocab_size = getattr(config, "vocab_size", None)
            if not vocab_size:
                raise ValueError("a word embedding needs vocab_size")
            if config.pad_token_id >= vocab_size:
                raise ValueError(f"pad_token_id {config.pad_token_id} is outside vocab_size {vocab_size}")
            self.word_embedding = nn.Embedding(vocab_size, config.hidden_size,
                                               padding_idx=config.pad_token_id)
        else:
            self.word_embedding = None
        self.fastformer_model = FastformerEncoder(config)
        self.criterion = nn.CrossEntropyLoss()

    @property
    def num_labels(self) -> int:
        return 0 if self.dense_linear is None else self.dense_linear.out_features

    @property
    def vocab_size(self) -> Optional[int]:
        return None if self.word_embedding is None else self.word_embedding.num_embeddings

    def _dtype(self):
        return next(self.fastformer_model.parameters()).dtype

    def encode_all(self, input_ids=None, input_embs=None, attention_mask=None):
        """Returns (pooled [B, D], token embeddings [B, L, D], logits [B, C] or None).

        input_ids [B, L] long: mask = ids != pad_token_id unless attention_mask is given.
        input_embs [B, L, D]: mask all ones unless attention_mask is given."""
        if (input_ids is None) == (input_embs is None):
            raise ValueError("give exactly one of input_ids and input_embs")
        if input_ids is not None:
            if self.word_embedding is None:
                raise ValueError("this model has no word embedding; it accepts only input embeddings")
            if attention_mask is None:
                attention_mask = (input_ids != self.config.pad_token_id)
            embs = self.word_embedding(input_ids)
        else:
            embs = input_embs.to(self._dtype())
            if attention_mask is None:
                attention_mask = torch.ones(embs.shape[:2], device=embs.device)
        attention_mask = attention_mask.to(self._dtype())
        pooled, hidden = self.fastformer_model.forward_all(embs, attention_mask)
        logits = self.dense_linear(pooled) if self.dense_linear is not None else None
        return pooled, hidden, logits

    def forward(self, input_ids, targets=None):
        """Official forward: mask from the ids, embedding, encoder, head.

        Returns the logits (or the pooled vector when there is no head); with
        targets, (loss, score) as the official code does."""
        mask = (input_ids != self.config.pad_token_id).to(self._dtype())
        embds = self.word_embedding(input_ids)
        text_vec = self.fastformer_model(embds, mask)
        if self.dense_linear is None:
            return text_vec
        score = self.dense_linear(text_vec)
        if targets is None:
            return score
        loss = self.criterion(score, targets)
        return loss, score


def build_model(config, vocab_size=None, num_labels=None, word_embedding=True) -> Model:
    """A Model for `config` (default vocab_size: config.vocab_size; default
    num_labels: config.num_labels or none; 0/None means no head), in eval()
    mode (dropout off; call .train() to train it)."""
    config = load_config(config)
    if num_labels is None:
        num_labels = getattr(config, "num_labels", 0) or 0
    model = Model(config, vocab_size=vocab_size, num_labels=num_labels, word_embedding=word_embedding)
    return model.eval()


# ----------------------------------------------------------------------------- model directory

ENCODER_PREFIX = "fastformer_model."
TOP_LEVEL_PREFIXES = ("word_embedding.", "dense_linear.")


def normalize_names(state_dict):
    """Bare FastformerEncoder names -> Model names (adds `fastformer_model.`)."""
    if any(k.startswith(ENCODER_PREFIX) for k in state_dict):
        return dict(state_dict)
    return {(k if k.startswith(TOP_LEVEL_PREFIXES) else ENCODER_PREFIX + k): v
            for k, v in state_dict.items()}


def state_dict_from_dir(model_dir):
    return normalize_names(read_safetensors(os.path.join(model_dir, "model.safetensors")))


def model_from_state_dict(config, state_dict, dtype=torch.float64) -> Model:
    """Build a Model whose optional parts follow the tensors present; strict load."""
    config = load_config(config)
    sd = normalize_names(state_dict)
    we = sd.get("word_embedding.weight")
    head = sd.get("dense_linear.weight")
    model = Model(config,
                  vocab_size=None if we is None else we.shape[0],
                  num_labels=0 if head is None else head.shape[0],
                  word_embedding=we is not None)
    model.load_state_dict({k: v.to(torch.float64) for k, v in sd.items()}, strict=True)
    return model.to(dtype).eval()


def load_model_dir(model_dir, dtype=torch.float64):
    """(Model, Config) from model_dir/config.json + model_dir/model.safetensors."""
    config = load_config(os.path.join(model_dir, "config.json"))
    model = model_from_state_dict(config, state_dict_from_dir(model_dir), dtype=dtype)
    return model, config


# ----------------------------------------------------------------------------- encode helper


@dataclass
class EncodeResult:
    embedding: np.ndarray            # [D]
    token_embeddings: np.ndarray     # [n, D]
    logits: Optional[np.ndarray]     # [num_labels] or None

    # allow `pooled, tokens, logits = result`
    def __iter__(self):
        return iter((self.embedding, self.token_embeddings, self.logits))


def reference_span_pool(model: Model, token_states, mask, spans, mode="model"):
    """Late chunking's reference: one embedding per span [begin, end) of a document, pooled from
    the final token states [n, D] of the whole document's one pass (reference_encode's
    token_embeddings), `mask` [n] 1 for real tokens. `model`: the model's attention pooler
    restricted to the span (its softmax over the span's real tokens, with the sequence
    pooler's + 1e-8); `mean`: the mean of the span's real tokens' states. Returns [spans, D]."""
    if mode not in ("model", "mean"):
        raise ValueError(f"mode must be 'model' or 'mean', not {mode!r}")
    pooler = model.fastformer_model.poolers[0]
    dtype = next(pooler.parameters()).dtype
    x = torch.as_tensor(np.asarray(token_states)).to(dtype)
    m = torch.as_tensor(np.asarray(mask)).to(dtype)
    out = []
    with torch.no_grad():
        for begin, end in spans:
            xs, ms = x[begin:end], m[begin:end]
            if mode == "model":
                out.append(pooler(xs.unsqueeze(0), ms.unsqueeze(0))[0])
            else:
                out.append((xs * ms.unsqueeze(1)).sum(0) / ms.sum())
    return torch.stack(out).cpu().numpy()


def reference_encode(model: Model, sequences: Sequence, kind="ids", padded=False,
                     dtype=torch.float64) -> List[EncodeResult]:
    """Run `sequences` (lists of token ids, or [n, D] arrays of input embeddings)
    through `model` (converted to `dtype`) and return one EncodeResult each.

    padded=False: each sequence alone (batch of 1, no padding).
    padded=True: one rectangular batch padded on the right (ids with
    pad_token_id; embeddings with zero rows and mask 0 there); token embeddings
    are trimmed back to each sequence's length."""
    if kind not in ("ids", "embeddings"):
        raise ValueError(f"kind must be 'ids' or 'embeddings', not {kind!r}")
    model = model.to(dtype).eval()
    D = model.config.hidden_size
    pad = model.config.pad_token_id
    if kind == "ids":
        seqs = [torch.as_tensor(np.asarray(s, dtype=np.int64)).reshape(-1) for s in sequences]
    else:
        seqs = [torch.as_tensor(np.asarray(s, dtype=np.float64)).reshape(-1, D).to(dtype)
                for s in sequences]
    for i, s in enumerate(seqs):
        if s.shape[0] == 0:
            raise ValueError(f"sequence {i} is empty")
    results: List[EncodeResult] = []

    def _pack(pooled, hidden, logits, i, n):
        return EncodeResult(
            embedding=pooled[i].detach().cpu().numpy().copy(),
            token_embeddings=hidden[i, :n].detach().cpu().numpy().copy(),
            logits=None if logits is None else logits[i].detach().cpu().numpy().copy())

    with torch.no_grad():
        if not padded:
            for s in seqs:
                if kind == "ids":
                    out = model.encode_all(input_ids=s.unsqueeze(0))
                else:
                    out = model.encode_all(input_embs=s.unsqueeze(0))
                results.append(_pack(*out, 0, s.shape[0]))
        else:
            L = max(s.shape[0] for s in seqs)
            B = len(seqs)
            if kind == "ids":
                ids = torch.full((B, L), pad, dtype=torch.long)
                for i, s in enumerate(seqs):
                    ids[i, :s.shape[0]] = s
                out = model.encode_all(input_ids=ids)
            else:
                embs = torch.zeros((B, L, D), dtype=dtype)
                mask = torch.zeros((B, L), dtype=dtype)
                for i, s in enumerate(seqs):
                    embs[i, :s.shape[0]] = s
                    mask[i, :s.shape[0]] = 1
                out = model.encode_all(input_embs=embs, attention_mask=mask)
            for i, s in enumerate(seqs):
                results.append(_pack(*out, i, s.shape[0]))
    return results


if __name__ == "__main__":  # reference.py MODEL_DIR < jsonl  ->  jsonl (float64 reference)
    import argparse

    ap = argparse.ArgumentParser(description="float64 reference encoder (JSONL in, JSONL out)")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--input", default="-")
    ap.add_argument("--output", default="-")
    ap.add_argument("--padded", action="store_true", help="run all lines as one padded batch")
    ap.add_argument("--return-token-embeddings", action="store_true")
    ap.add_argument("--return-logits", action="store_true")
    args = ap.parse_args()
    mdl, _ = load_model_dir(args.model_dir)
    fin = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    items = [json.loads(line) for line in fin if line.strip()]
    kinds = {"ids" if "token_ids" in it else "embeddings" for it in items}
    if len(kinds) > 1:
        sys.exit("reference.py: mix of token_ids and input_embeddings lines")
    k = kinds.pop() if kinds else "ids"
    seqs = [it["token_ids"] if k == "ids" else it["input_embeddings"] for it in items]
    res = reference_encode(mdl, seqs, kind=k, padded=args.padded)
    fout = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    for s, r in zip(seqs, res):
        o = {"embedding": r.embedding.tolist(), "num_tokens": len(s)}
        if args.return_token_embeddings:
            o["token_embeddings"] = r.token_embeddings.tolist()
        if args.return_logits and r.logits is not None:
            o["logits"] = r.logits.tolist()
        fout.write(json.dumps(o) + "\n")

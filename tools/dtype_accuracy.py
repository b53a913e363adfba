#!/usr/bin/env python3
"""What serving bfloat16 instead of float32 costs in accuracy (docs/operations.md, "Serving dtype"):
fastformer-encode runs the same sequences in both dtypes on the CPU engine, and this prints the
pooled embeddings' cosine (bfloat16 to float32: min, 1st percentile, median) and, for a model with
a classifier head, how many labels agree and, with --truth, the accuracy in each dtype.

    dtype_accuracy.py --encode build/bin/fastformer-encode --model-dir DIR
                      (--input IDS.jsonl [--truth TEST.jsonl] | --random N [--lengths A:B] [--seed S])
                      [--threads T] [--dtype bfloat16] [--json]

--input: fastformer-encode's input lines (the trained demo model's test_ids.jsonl, its 206
held-out pages); --truth: a JSON-lines file with a "label" per line in the same order (its
test.jsonl). --random N: N sequences of random token ids, lengths uniform in [A, B] (a random-
weight model such as make_demo_model.py --preset official). bfloat16 on the CPU needs AVX512_BF16
or AMX (fastformer-encode refuses it elsewhere, naming what it found).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def encode(binary: str, model_dir: str, input_path: Path, dtype: str, threads: int) -> list:
    proc = subprocess.run([binary, "--model-dir", model_dir, "--backend", "cpu", "--dtype", dtype,
                           "--threads", str(threads), "--return-logits", "--input", str(input_path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"fastformer-encode --dtype {dtype} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def random_input(path: Path, count: int, lengths: str, seed: int, model_dir: str):
    config = json.loads((Path(model_dir) / "config.json").read_text())
    low, high = (int(x) for x in lengths.split(":"))
    high = min(high, config["max_position_embeddings"])
    rng = np.random.default_rng(seed)
    pad = config.get("pad_token_id", 0)
    with open(path, "w") as f:
        for _ in range(count):
            ids = rng.integers(0, config["vocab_size"] - 1, int(rng.integers(low, high + 1)))
            ids = np.where(ids >= pad, ids + 1, ids)  # no pad tokens
            f.write(json.dumps({"token_ids": ids.tolist()}) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--encode", required=True, help="the fastformer-encode binary")
    ap.add_argument("--model-dir", required=True)
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="fastformer-encode input lines")
    source.add_argument("--random", type=int, metavar="N", help="N random token-id sequences")
    ap.add_argument("--truth", help='JSON lines with the true "label" of each --input line')
    ap.add_argument("--lengths", default="16:512", help="--random: lengths uniform in A:B")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", help="the dtype compared with float32")
    ap.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        input_path = Path(args.input) if args.input else Path(tmp) / "random.jsonl"
        if args.random:
            random_input(input_path, args.random, args.lengths, args.seed, args.model_dir)
        f32 = encode(args.encode, args.model_dir, input_path, "float32", args.threads)
        low = encode(args.encode, args.model_dir, input_path, args.dtype, args.threads)
    a = np.array([o["embedding"] for o in low], dtype=np.float64)
    b = np.array([o["embedding"] for o in f32], dtype=np.float64)
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    tokens = [o["num_tokens"] for o in f32]
    out = {"model_dir": args.model_dir, "dtype": args.dtype, "sequences": len(f32),
           "tokens": {"min": min(tokens), "median": float(np.median(tokens)), "max": max(tokens)},
           "cosine": {"min": float(cosine.min()), "p1": float(np.percentile(cosine, 1)),
                      "median": float(np.median(cosine))}}
    if f32 and "logits" in f32[0]:
        labels_low = np.array([o["logits"] for o in low]).argmax(1)
        labels_f32 = np.array([o["logits"] for o in f32]).argmax(1)
        out["labels_agree"] = int((labels_low == labels_f32).sum())
        if args.truth:
            truth = np.array([json.loads(line)["label"] for line in open(args.truth) if line.strip()])
            out["accuracy"] = {args.dtype: float((labels_low == truth).mean()),
                               "float32": float((labels_f32 == truth).mean())}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"{out['sequences']} sequences ({out['tokens']['min']}..{out['tokens']['max']} tokens, median "
          f"{out['tokens']['median']:.0f}): pooled-embedding cosine {args.dtype} to float32 min "
          f"{out['cosine']['min']:.6f}, 1st percentile {out['cosine']['p1']:.6f}, median {out['cosine']['median']:.6f}")
    if "labels_agree" in out:
        line = f"labels: {out['labels_agree']}/{out['sequences']} agree"
        if "accuracy" in out:
            acc = out["accuracy"]
            line += f"; accuracy {args.dtype} {acc[args.dtype]:.4f}, float32 {acc['float32']:.4f}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

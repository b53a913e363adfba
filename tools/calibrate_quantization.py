#!/usr/bin/env python3
"""Calibrates the int8 / uint8 embedding types of a model version: writes quantization.json
beside its weights (docs/api.md, "Embedding types").

The ranges are each dimension's min and max over the model's own embeddings of a corpus, as
the server answers them: normalised (unless --not-normalized) and cut to each of --dimensions
(the first d values, normalised again), so a request with `dimensions` d finds its own ranges.
The embeddings come from fastformer-encode on the same machine's engine (--dtype as the server
will run, default auto), so the ranges are those of the exact output. binary and ubinary need
no ranges.

    python3 tools/calibrate_quantization.py --model-dir MODELS/m/1 --corpus texts.jsonl \\
        --dimensions 768,256

The corpus: a .jsonl file of objects with a "text" field (other fields are ignored), or any
other file with one text per line. Pure Python: no numpy needed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FORMAT = "fastformer-quantization"


def read_corpus(path: Path, limit: int) -> list[str]:
    texts: list[str] = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"{path}:{number}: not JSON: {e}")
                if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                    raise SystemExit(f'{path}:{number}: expected an object with a "text" string')
                texts.append(row["text"])
            else:
                texts.append(line)
            if limit and len(texts) >= limit:
                break
    if not texts:
        raise SystemExit(f"{path}: no texts")
    return texts


def encode_binary(explicit: str | None) -> str:
    if explicit:
        return explicit
    here = Path(__file__).resolve().parents[1]
    for candidate in (
        Path(os.environ.get("FASTFORMER_BIN_DIR", "")) / "fastformer-encode",
        here / "build" / "bin" / "fastformer-encode",
    ):
        if candidate.is_file():
            return str(candidate)
    return "fastformer-encode"  # on PATH (the image)


def embed(texts: list[str], model_dir: Path, binary: str, dtype: str, normalize: bool) -> list[list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "in.jsonl"
        lines.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        cmd = [binary, "--model-dir", str(model_dir), "--input", str(lines), "--truncation", "right"]
        cmd += ["--dtype", dtype] + (["--normalize"] if normalize else [])
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"fastformer-encode failed ({run.returncode}):\n{run.stderr[-2000:]}")
    out = [json.loads(line)["embedding"] for line in run.stdout.splitlines() if line.strip()]
    if len(out) != len(texts):
        raise SystemExit(f"fastformer-encode answered {len(out)} lines for {len(texts)} texts")
    return out


def cut(e: list[float], d: int, normalize: bool) -> list[float]:
    """The server's `dimensions`: the first d values, normalised again when the output is."""
    head = e[:d]
    if not normalize:
        return head
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head] if norm > 0 else head


def ranges_of(embeddings: list[list[float]], d: int, normalize: bool) -> dict:
    lo = [math.inf] * d
    hi = [-math.inf] * d
    for e in embeddings:
        for j, x in enumerate(cut(e, d, normalize)):
            lo[j] = min(lo[j], x)
            hi[j] = max(hi[j], x)
    return {"dimensions": d, "normalized": normalize, "min": lo, "max": hi}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", required=True, type=Path, help="the model version's directory")
    p.add_argument("--corpus", required=True, type=Path, help=".jsonl with a \"text\" field, or one text a line")
    p.add_argument("--dimensions", default="", help="comma-separated output sizes (default: hidden_size)")
    p.add_argument("--not-normalized", action="store_true", help="ranges for embeddings not normalised")
    p.add_argument("--dtype", default="auto", help="the engine's dtype, as the server will run (auto)")
    p.add_argument("--max-texts", type=int, default=0, help="at most this many texts (0: all)")
    p.add_argument("--encode", help="the fastformer-encode binary (default: build/bin, $FASTFORMER_BIN_DIR, PATH)")
    p.add_argument("--output", type=Path, help="default: MODEL_DIR/quantization.json")
    args = p.parse_args(argv)

    config = json.loads((args.model_dir / "config.json").read_text())
    hidden = int(config["hidden_size"])
    dims = [int(x) for x in args.dimensions.split(",") if x.strip()] or [hidden]
    for d in dims:
        if not 1 <= d <= hidden:
            raise SystemExit(f"--dimensions: {d} is outside [1, hidden_size {hidden}]")
    normalize = not args.not_normalized
    texts = read_corpus(args.corpus, args.max_texts)
    embeddings = embed(texts, args.model_dir, encode_binary(args.encode), args.dtype, normalize)
    doc = {
        "format": FORMAT,
        "version": 1,
        "calibration": {"corpus": args.corpus.name, "texts": len(texts), "dtype": args.dtype},
        "ranges": [ranges_of(embeddings, d, normalize) for d in dims],
    }
    out = args.output or args.model_dir / "quantization.json"
    out.write_text(json.dumps(doc) + "\n")
    print(f"{out}: ranges for {', '.join(map(str, dims))} dimensions from {len(texts)} texts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

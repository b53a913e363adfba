#!/usr/bin/env python3
"""The inputs and CPU float32 answers of the GPU check's server stage (issue 47), made here.

    server_expected.py --out DIR --encode BIN [--set gpu|smoke] [--models DIR] [--no-cache]

A lent GPU machine spends no time on a CPU reference: its server stage (tests/gpu/server_stage.py)
sends these inputs to `fastformer-server --backend cuda` and compares the answers with the
answers written here by `BIN` (fastformer-encode) on the CPU in float32. The models are the
check's own random ones, made the same way on both machines (tools/make_demo_model.py --seed 1:
the same arguments give the same bytes), and each model file's SHA-256 is written beside the
answers, so the lease knows whether they apply to the model it made (server_stage.py falls back
to a CPU reference there, and says so, when they do not).

The sets (`--set`):
  gpu    base-long (D 768, 12 layers, no head): 64 sequences of 1 to 8,192 tokens (log-uniform,
         1 and 8,192 included) plus one of 65,536; official with a tokenizer (D 256, 4 labels):
         16 texts of 1 to 1,500 words, with logits
  smoke  the tiny model in both roles (up to 512 tokens): the CPU smoke run of gpu-check.sh

DIR gets `manifest.json` (the models' presets, seeds and SHA-256, what computed the answers,
where and when) and, per model, `<model>.inputs.jsonl.gz` (the lines sent: token ids or text)
and `<model>.expected.jsonl.gz` (fastformer-encode's lines: embedding, num_tokens, logits).
The answers are cached under $FASTFORMER_CACHE/gpu-expected (default /var/cache/fastformer),
keyed by this script and the model generator's sources: the float32 CPU engine is held to the
PyTorch reference by the golden tests, so its answers do not depend on the commit.

Standard library only, except for making the models (tools/make_demo_model.py, PyTorch);
`inputs_for` and `load_expected` are what server_stage.py imports.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / "tools"

# model -> (preset, tokenizer, what is sent)
SETS = {
    "gpu": {
        "base-long": {"preset": "base-long", "tokenizer": False, "kind": "ids", "requests": 64,
                      "max_tokens": 8192, "long": 65536, "vocab": 30522},
        "official": {"preset": "official", "tokenizer": True, "kind": "text", "requests": 16,
                     "max_words": 1500},
    },
    "smoke": {
        "tiny": {"preset": "tiny", "tokenizer": True, "kind": "ids", "requests": 16,
                 "max_tokens": 512, "long": 0, "vocab": 1000},
        "tiny-text": {"preset": "tiny", "tokenizer": True, "kind": "text", "requests": 8,
                      "max_words": 200},
    },
}
SEED = 1  # make_demo_model.py --seed, as gpu-check.sh makes its models


def log_uniform_lengths(rng: random.Random, n: int, top: int) -> list[int]:
    """n lengths from 1 to top, log-uniform, the first 1 and the last top. Only rng.random(),
    whose sequence Python keeps the same across versions for the same seed."""
    out = [1]
    for _ in range(max(0, n - 2)):
        out.append(max(1, min(top, int(round(math.exp(rng.random() * math.log(top)))))))
    if n > 1:
        out.append(top)
    return out[:n]


def inputs_for(name: str, spec: dict) -> list[dict]:
    """The JSON lines sent for one model of a set: {"token_ids": [...]} or {"text": "..."}."""
    rng = random.Random(f"fastformer-gpu-server-{name}")
    if spec["kind"] == "ids":
        lengths = log_uniform_lengths(rng, spec["requests"], spec["max_tokens"])
        if spec.get("long"):
            lengths.append(spec["long"])
        vocab = spec["vocab"]  # ids 1..vocab-1: 0 is the pad token
        return [{"token_ids": [1 + int(rng.random() * (vocab - 1)) for _ in range(n)]} for n in lengths]
    sys.path.insert(0, str(TOOLS))
    from make_demo_model import DEMO_WORDS  # noqa: E402  (the tokenizer's vocabulary)

    words = DEMO_WORDS[4:]  # no special tokens in the text
    lines = []
    for n in log_uniform_lengths(rng, spec["requests"], spec["max_words"]):
        lines.append({"text": " ".join(words[int(rng.random() * len(words))] for _ in range(n))})
    return lines


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def write_jsonl_gz(path: Path, lines: list[dict]) -> None:
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as f:
        for line in lines:
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def read_jsonl_gz(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_expected(directory: Path) -> tuple[dict, dict]:
    """(manifest, {model: (inputs, expected)}) of a directory written by this script."""
    manifest = json.loads((directory / "manifest.json").read_text())
    out = {}
    for name in manifest["models"]:
        out[name] = (read_jsonl_gz(directory / f"{name}.inputs.jsonl.gz"),
                     read_jsonl_gz(directory / f"{name}.expected.jsonl.gz"))
    return manifest, out


def make_model(preset: str, tokenizer: bool, out: Path, python: str) -> None:
    """The model as gpu-check.sh makes it (make_model: --preset P --seed 1 [--tokenizer])."""
    cmd = [python, str(TOOLS / "make_demo_model.py"), "--preset", preset, "--seed", str(SEED), "--out", str(out)]
    if tokenizer:
        cmd.append("--tokenizer")
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def encode_cpu(encode: str, model_dir: Path, lines: list[dict], logits: bool, threads: int = 0,
               env: dict | None = None) -> list[dict]:
    """fastformer-encode --backend cpu --dtype float32 over the lines: its output lines, without
    the token embeddings (not asked)."""
    with tempfile.TemporaryDirectory(prefix="fastformer-expected-") as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text("".join(json.dumps(line) + "\n" for line in lines))
        # A batch budget of the longest line at least: fastformer-encode refuses a line longer
        # than --max-batch-tokens (the 65,536-token sequence; its default is 16,384).
        longest = max(len(line.get("token_ids", ())) for line in lines)
        cmd = [encode, "--model-dir", str(model_dir), "--backend", "cpu", "--dtype", "float32",
               "--threads", str(threads), "--max-batch-tokens", str(max(16384, longest)),
               "--input", str(src), "--output", "-"]
        if logits:
            cmd.append("--return-logits")
        run = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"{Path(encode).name} exited with status {run.returncode} on {model_dir}: "
                               f"{run.stderr.strip()[-1500:]}")
    out = [json.loads(line) for line in run.stdout.splitlines() if line.strip()]
    if len(out) != len(lines):
        raise RuntimeError(f"{encode}: {len(out)} answers for {len(lines)} lines")
    return out


def cache_key(which: str) -> str:
    h = hashlib.sha256(which.encode())
    for f in (Path(__file__), TOOLS / "make_demo_model.py", TOOLS / "export_fastformer.py",
              TOOLS / "safetensors_io.py"):
        if f.exists():
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def build(which: str, out: Path, encode: str, models: Path, python: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "set": which,
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "computed_by": "fastformer-encode --backend cpu --dtype float32",
        "host": f"{cpu_model()}, {os.cpu_count()} CPUs",
        "seed": SEED,
        "models": {},
    }
    for name, spec in SETS[which].items():
        t0 = time.time()
        model_dir = models / spec["preset"]
        if not (model_dir / "model.safetensors").exists() or (spec["tokenizer"] and not (model_dir / "tokenizer.json").exists()):
            shutil.rmtree(model_dir, ignore_errors=True)
            make_model(spec["preset"], spec["tokenizer"], model_dir, python)
        lines = inputs_for(name, spec)
        logits = spec["kind"] == "text"
        answers = encode_cpu(encode, model_dir, lines, logits)
        keep = [{k: a[k] for k in ("embedding", "num_tokens", "logits") if k in a} for a in answers]
        write_jsonl_gz(out / f"{name}.inputs.jsonl.gz", lines)
        write_jsonl_gz(out / f"{name}.expected.jsonl.gz", keep)
        manifest["models"][name] = {
            "preset": spec["preset"], "tokenizer": spec["tokenizer"], "kind": spec["kind"],
            "sha256": sha256_of(model_dir / "model.safetensors"),
            "sequences": len(lines), "tokens": sum(a.get("num_tokens", 0) for a in answers),
            "seconds": round(time.time() - t0, 1),
        }
        print(f"server_expected: {name}: {len(lines)} lines, {manifest['models'][name]['tokens']} tokens, "
              f"{manifest['models'][name]['seconds']} s", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--encode", required=True, help="fastformer-encode (its CPU engine computes the answers)")
    ap.add_argument("--set", default="gpu", choices=sorted(SETS))
    ap.add_argument("--models", type=Path, help="where the models are made (default: a temporary directory)")
    ap.add_argument("--python", default=sys.executable, help="the python3 that imports torch (make_demo_model.py)")
    ap.add_argument("--no-cache", action="store_true")
    a = ap.parse_args()

    cache_root = Path(os.environ.get("FASTFORMER_CACHE", "/var/cache/fastformer")) / "gpu-expected"
    cached = cache_root / f"{a.set}-{cache_key(a.set)}"
    if not a.no_cache and (cached / "manifest.json").exists():
        if a.out.exists():
            shutil.rmtree(a.out)
        shutil.copytree(cached, a.out)
        print(f"server_expected: {a.set}: from the cache {cached}", file=sys.stderr)
        return 0
    tmp_models = None
    models = a.models
    if models is None:
        tmp_models = tempfile.mkdtemp(prefix="fastformer-expected-models-")
        models = Path(tmp_models)
    try:
        staging = Path(tempfile.mkdtemp(prefix="fastformer-expected-"))
        build(a.set, staging, a.encode, models, a.python)
    finally:
        if tmp_models:
            shutil.rmtree(tmp_models, ignore_errors=True)
    if not a.no_cache:
        try:
            cache_root.mkdir(parents=True, exist_ok=True)
            part = Path(tempfile.mkdtemp(prefix=cached.name + ".", dir=cache_root))
            shutil.rmtree(part)
            shutil.copytree(staging, part)
            os.replace(part, cached) if not cached.exists() else shutil.rmtree(part)
        except OSError as e:
            print(f"server_expected: not cached ({e})", file=sys.stderr)
    if a.out.exists():
        shutil.rmtree(a.out)
    shutil.move(str(staging), a.out)
    print(f"server_expected: {a.set}: wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

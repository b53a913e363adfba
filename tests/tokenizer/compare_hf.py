"""Tokenizer parity: our C++ tokenizer (fastformer-tokenize) against the `tokenizers` package.

Builds the tokenizer.json files of make_tokenizers.py (trained on the first 20,000 texts),
encodes N real texts (corpus.py) with both, and reports every text whose ids differ.
Needs the `tokenizers` package (a venv: tests/tokenizer/README.md).

  python tests/tokenizer/compare_hf.py --bin build/bin/fastformer-tokenize --texts 100000 --out /tmp/tok
Exit status 1 when any ids differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
import make_tokenizers  # noqa: E402


CHUNK = 50_000


def show_mismatch(tok, i, text, e, got):
    g = got.get("ids") or []
    k = next((k for k in range(min(len(g), len(e))) if g[k] != e[k]), min(len(g), len(e)))
    lo = max(0, k - 3)
    print(f"  text {i} ({len(text)} chars): {text[:300]!r}\n    first difference at token {k}: "
          f"hf {e[lo:k + 5]} {tok.encode(text).tokens[lo:k + 5]}\n"
          f"    ours {got if 'error' in got else g[lo:k + 5]} {[tok.id_to_token(x) for x in g[lo:k + 5]]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="fastformer-tokenize")
    ap.add_argument("--texts", type=int, default=100_000)
    ap.add_argument("--out", default="/tmp/fastformer-tokenizer-parity")
    ap.add_argument("--only", nargs="*", default=None, help="tokenizer names (default: all)")
    ap.add_argument("--bench-repeat", type=int, default=1, help="passes of the one-core throughput run")
    ap.add_argument("--no-sweep", action="store_true", help="skip the every-code-point sweep")
    ap.add_argument("--offsets", action="store_true",
                    help="also compare each token's character offsets (Encoding.offsets), through "
                         "fastformer-tokenize --offsets")
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    texts = corpus.collect(args.texts)
    non_ascii = sum(1 for t in texts if not t.isascii())
    print(f"{len(texts)} texts ({non_ascii} non-ASCII, {sum(map(len, texts))} chars)")
    texts_path = out / "texts.jsonl"
    with open(texts_path, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")

    sweep = make_tokenizers.sweep_texts()
    sweep_path = out / "sweep.jsonl"
    with open(sweep_path, "w", encoding="utf-8") as f:
        for t in sweep:
            f.write(json.dumps({"text": t}) + "\n")
    cases = [(name, lambda build=build: build(texts[:20_000]), texts, texts_path)
             for name, build in make_tokenizers.BUILDERS.items()]
    if not args.no_sweep:
        sweep_toks = make_tokenizers.sweep_tokenizers(sweep)
        cases += [(name, lambda t=t: t, sweep, sweep_path) for name, t in sweep_toks.items()]

    failed = False
    for name, build, texts, texts_path in cases:
        if args.only and name not in args.only:
            continue
        tok = build()
        tok_path = out / f"{name}.json"
        tok.save(str(tok_path))
        # Chunk by chunk against the CLI's streamed output, so that 1.7M texts fit in memory.
        bad, bad_offsets, shown, n_tokens, hf_s = 0, 0, 0, 0, 0.0
        with open(texts_path, "rb") as stdin:
            cmd = [args.bin, "--tokenizer", str(tok_path)] + (["--offsets"] if args.offsets else [])
            proc = subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE)
            for start in range(0, len(texts), CHUNK):
                chunk = texts[start:start + CHUNK]
                t0 = time.perf_counter()
                encodings = tok.encode_batch(chunk)
                expected = [e.ids for e in encodings]
                hf_s += time.perf_counter() - t0
                for k, e in enumerate(expected):
                    got = json.loads(proc.stdout.readline())
                    n_tokens += len(e)
                    if got.get("ids") == e:
                        if not args.offsets:
                            continue
                        want = [list(o) for o in encodings[k].offsets]
                        if got.get("offsets") == want:
                            continue
                        bad_offsets += 1
                        if shown < 5:
                            shown += 1
                            g = got.get("offsets") or []
                            j = next((j for j in range(min(len(g), len(want))) if g[j] != want[j]), 0)
                            print(f"  text {start + k}: {chunk[k][:200]!r}\n    offsets differ at token {j} "
                                  f"({encodings[k].tokens[j]!r}): hf {want[max(0, j - 2):j + 3]} ours {g[max(0, j - 2):j + 3]}")
                        continue
                    bad += 1
                    if shown < 5:
                        shown += 1
                        show_mismatch(tok, start + k, chunk[k], e, got)
            assert proc.stdout.readline() == b"" and proc.wait() == 0, "fastformer-tokenize: extra output or failure"
        print(f"{name}: {len(texts)} texts, {n_tokens} tokens, vocab {tok.get_vocab_size()}, "
              f"mismatches {bad}" + (f", offset mismatches {bad_offsets}" if args.offsets else "") +
              f" (HF encode_batch {len(texts) / hf_s:.0f} texts/s, all cores)")
        failed = failed or bool(bad) or bool(bad_offsets)
        with open(texts_path, "rb") as stdin:
            bench = subprocess.run([args.bin, "--tokenizer", str(tok_path), "--bench", "--repeat", str(args.bench_repeat)],
                                   stdin=stdin, capture_output=True, check=True)
        print(f"  ours, one core: {bench.stdout.decode().strip()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

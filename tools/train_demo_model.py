#!/usr/bin/env python3
"""Train the official Fastformer notebook's model on Debian's man pages; export it.

    apt-get install -y manpages manpages-dev          # the corpus; no other network
    /usr/bin/python3 tools/train_demo_model.py --out models/manpages

The model is the official notebook's `Model` (tools/reference.py: word embedding,
FastformerEncoder with the official init, attention pooling, dense_linear head),
trained with its loss (CrossEntropyLoss) and optimiser (Adam, lr 1e-3) on the
corpus of tools/manpages_corpus.py: 1,080 pages of manpages + manpages-dev 6.03-2
in 4 classes by manual section (system call, library function, file/device,
overview). Tokenization is the notebook's: lower-case, NLTK's wordpunct_tokenize
(the regular expression \\w+|[^\\w\\s]+, here with Python's re, no NLTK), a
word_dict from the training split ('PADDING' = 0, '[UNK]' = 1 for words seen
fewer than --min-freq times, the rest in order of first appearance), truncated to
--max-len tokens (the notebook pads with 0 to the same length; our engine takes
the unpadded ids, which give the same result because padding is masked).

Deterministic: fixed seed, the split by a hash of each page's name
(manpages_corpus.split_pages); the same packages, thread count (--threads, default
the cores this process may use) and BLAS kernels give the same model.

Speed: Debian's PyTorch runs its matmuls on whatever libblas.so.3 is. At start the
script checks it once (tools/torch_blas.py: one timed matmul) and prints a
"torch BLAS: ..." line, with a warning naming the fix when it is netlib's
reference BLAS (apt-get install libopenblas0-pthread; deploy/install-deps.sh
does it) or too slow. When OpenBLAS would run a core below the CPU's (Debian
12's 0.3.21 runs its generic Prescott core on Sapphire/Emerald Rapids), it sets
OPENBLAS_CORETYPE (SkylakeX on AVX-512) for this process before torch loads,
saying so; an OPENBLAS_CORETYPE already set is left as it is. OMP_WAIT_POLICY
defaults to PASSIVE (idle OpenMP threads sleep: 3-4x faster on shared cores). Progress
(step, loss, elapsed, estimated time left) is printed at least every
--progress-seconds (10) while training and evaluating.

Writes into --out:
  config.json, model.safetensors   via tools/export_fastformer.py (float32)
  tokenizer.json                   the same tokenization for the server (export_fastformer's
                                   word_dict_tokenizer: the word_dict, '[UNK]', --max-len)
  word_dict.json                   {token: id}, the notebook's word_dict
  test.jsonl                       {"name", "section", "text", "label", "label_name"} per test page
  test_ids.jsonl                   {"token_ids": [...]} per test page (fastformer-encode input)
  test_logits.jsonl                the PyTorch model's float32 logits per test page
  labels.json                      label id -> name, and the section each label covers
  train_report.json                corpus counts, config, time, accuracy per epoch

With --verify-with build/bin/fastformer-encode, the exported model is run by our
engine on test_ids.jsonl and its logits are compared with the PyTorch ones
(argmax equal for every page, each logit within --rtol relative of the largest
|logit| of its page).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_blas  # noqa: E402

# Before numpy and torch load libblas.so.3 and libgomp: both read their environment once, at load.
CORETYPE_NOTE = None
if __name__ == "__main__":
    CORETYPE_NOTE = torch_blas.preset_openblas_coretype()
    # Idle OpenMP threads sleep instead of spinning: on cores shared with a build, torch's
    # spinning threads made a training step 3-4x slower (docs/demo-model.md); alone, the same.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from export_fastformer import export_model, word_dict_tokenizer  # noqa: E402
from manpages_corpus import LABEL_NAMES, LABELS, collect_pages, package_versions, split_pages  # noqa: E402
from reference import Model, load_config  # noqa: E402

WORDPUNCT = re.compile(r"\w+|[^\w\s]+")  # nltk.tokenize.wordpunct_tokenize
PAD, UNK = "PADDING", "[UNK]"

OFFICIAL_CONFIG = {  # the notebook's fastformer.json
    "hidden_size": 256, "hidden_dropout_prob": 0.2, "num_hidden_layers": 2, "hidden_act": "gelu",
    "num_attention_heads": 16, "intermediate_size": 256, "max_position_embeddings": 256,
    "type_vocab_size": 2, "vocab_size": 100000, "layer_norm_eps": 1e-12,
    "initializer_range": 0.02, "pooler_type": "weightpooler", "enable_fp16": "False",
}


def wordpunct(text: str):
    return WORDPUNCT.findall(text.lower())


def build_word_dict(texts, min_freq: int) -> dict:
    counts = collections.Counter()
    order = []
    for t in texts:
        for tok in wordpunct(t):
            if tok not in counts:
                order.append(tok)
            counts[tok] += 1
    word_dict = {PAD: 0, UNK: 1}
    for tok in order:
        if counts[tok] >= min_freq and tok not in word_dict:
            word_dict[tok] = len(word_dict)
    return word_dict


def encode(text: str, word_dict: dict, max_len: int):
    unk = word_dict[UNK]
    return [word_dict.get(tok, unk) for tok in wordpunct(text)[:max_len]]


def pad(ids, max_len):
    return ids + [0] * (max_len - len(ids))


def init_weights(module, std):
    """The official FastformerEncoder.init_weights (applied to the encoder, as there)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.data.normal_(mean=0.0, std=std)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].fill_(0)
    elif isinstance(module, nn.LayerNorm):
        module.bias.data.zero_()
        module.weight.data.fill_(1.0)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.data.zero_()


@torch.no_grad()
def predict(model, ids, max_len, batch=64, on_batch=None):
    model.eval()
    out = []
    for i in range(0, len(ids), batch):
        x = torch.tensor([pad(s, max_len) for s in ids[i:i + batch]], dtype=torch.long)
        out.append(model(x))
        if on_batch is not None:
            on_batch(min(i + batch, len(ids)), len(ids))
    return torch.cat(out)


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min {seconds % 60:02d} s"


class Progress:
    """Prints a progress line at least every `interval` seconds (sooner when the next step
    would pass it): step, loss, elapsed time and the estimated time left, counting the
    evaluation of the test split after every epoch and at the end."""

    def __init__(self, epochs, steps_per_epoch, batch_size, test_pages, interval, t0, out=sys.stdout):
        self.epochs, self.steps_per_epoch = epochs, steps_per_epoch
        self.total = epochs * steps_per_epoch
        self.batch_size, self.test_pages = batch_size, test_pages
        self.interval, self.t0, self.out = interval, t0, out
        self.done = 0
        self.step_seconds = 0.0   # training time so far (evaluation excluded)
        self.eval_seconds = None  # the last evaluation's time
        self.evals_done = 0
        self.last_print = t0
        self.last = t0
        self.last_dur = 0.0

    def _left(self) -> float:
        per_step = self.step_seconds / max(1, self.done)
        # before the first evaluation: forward only, about a third of a step per batch of pages
        per_eval = (self.eval_seconds if self.eval_seconds is not None
                    else per_step * self.test_pages / self.batch_size / 3)
        evals_left = self.epochs + 1 - self.evals_done  # one per epoch and the final one
        return (self.total - self.done) * per_step + evals_left * per_eval

    def _due(self, now) -> bool:
        return self.done <= 1 or now - self.last_print + self.last_dur >= self.interval

    def _print(self, now, text):
        print(f"{text}; {_duration(now - self.t0)} elapsed, ~{_duration(self._left())} left",
              file=self.out, flush=True)
        self.last_print = now

    def step(self, epoch, loss, epoch_mean):
        now = time.time()
        self.last_dur = now - self.last
        self.step_seconds += self.last_dur
        self.last = now
        self.done += 1
        if self._due(now):
            self._print(now, f"step {self.done}/{self.total} (epoch {epoch + 1}/{self.epochs}): "
                             f"loss {loss:.4f} (epoch mean {epoch_mean:.4f})")

    def eval_start(self):
        self.eval_t0 = self.last_eval_batch = time.time()

    def eval_batch(self, pages, total):
        now = time.time()
        dur = now - self.last_eval_batch
        self.last_eval_batch = now
        if pages < total and now - self.last_print + dur >= self.interval:
            self._print(now, f"evaluating the test split: {pages}/{total} pages")

    def eval_end(self):
        """The caller prints its epoch (or final) line right after: that counts as progress."""
        self.last = self.last_print = time.time()
        self.eval_seconds = self.last - self.eval_t0
        self.evals_done += 1


def compare_logits(ours, ref, rtol):
    """(argmax mismatches, worst relative error, count over rtol); relative to each row's max |logit|."""
    mism = int((ours.argmax(1) != ref.argmax(1)).sum())
    scale = np.maximum(np.abs(ref).max(1, keepdims=True), 1e-30)
    rel = np.abs(ours - ref) / scale
    return mism, float(rel.max()), int((rel.max(1) > rtol).sum())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output model directory")
    ap.add_argument("--max-len", type=int, default=512, help="tokens per page (truncation), default 512")
    ap.add_argument("--min-freq", type=int, default=3, help="word_dict threshold, default 3")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                    help="torch's and OpenBLAS's threads, default the cores this process may use "
                         "(%(default)s here)")
    ap.add_argument("--progress-seconds", type=float, default=10.0,
                    help="print progress at least this often (seconds), default 10")
    ap.add_argument("--test-fraction", type=float, default=0.2)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--intermediate", type=int, default=256)
    ap.add_argument("--model-name", default="fastformer-manpages")
    ap.add_argument("--verify-with", default=None, metavar="FASTFORMER_ENCODE",
                    help="run this fastformer-encode on the test split and compare logits")
    ap.add_argument("--rtol", type=float, default=1e-4)
    args = ap.parse_args(argv)

    if CORETYPE_NOTE:
        print(CORETYPE_NOTE, flush=True)
    blas = torch_blas.check()  # one timed matmul (before seeding: it uses its own generator)
    print(blas.verdict, flush=True)
    if blas.warning:
        print(f"warning: {blas.warning}", flush=True)
    torch_blas.set_threads(args.threads)  # torch's, and OpenBLAS's own pool
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    t0 = time.time()
    versions = package_versions()
    pages = collect_pages()
    train, test = split_pages(pages, args.test_fraction)
    word_dict = build_word_dict([p.text for p in train], args.min_freq)
    train_ids = [encode(p.text, word_dict, args.max_len) for p in train]
    test_ids = [encode(p.text, word_dict, args.max_len) for p in test]
    y_train = torch.tensor([p.label for p in train])
    y_test = np.array([p.label for p in test])
    unk_rate = sum(s.count(1) for s in test_ids) / max(1, sum(len(s) for s in test_ids))
    t_data = time.time() - t0
    print(f"corpus: {len(pages)} pages ({versions}); train {len(train)}, test {len(test)}; "
          f"word_dict {len(word_dict)} entries (min_freq {args.min_freq}); test [UNK] rate "
          f"{unk_rate:.3f}; {t_data:.1f} s", flush=True)

    config = dict(OFFICIAL_CONFIG, hidden_size=args.hidden, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, intermediate_size=args.intermediate,
                  max_position_embeddings=args.max_len, vocab_size=len(word_dict),
                  num_labels=len(LABEL_NAMES), pad_token_id=0)
    model = Model(load_config(config), vocab_size=len(word_dict), num_labels=len(LABEL_NAMES))
    model.fastformer_model.apply(lambda m: init_weights(m, config["initializer_range"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)

    majority = collections.Counter(p.label for p in train).most_common(1)[0][0]
    baseline = float((y_test == majority).mean())
    history = []
    t_train0 = time.time()
    steps_per_epoch = math.ceil(len(train) / args.batch_size)
    print(f"training: {args.epochs} epochs of {steps_per_epoch} steps (batch {args.batch_size}) on "
          f"{args.threads} threads", flush=True)
    progress = Progress(args.epochs, steps_per_epoch, args.batch_size, len(test),
                        args.progress_seconds, t_train0)
    order_rng = random.Random(args.seed)
    for epoch in range(args.epochs):
        model.train()
        order = list(range(len(train)))
        order_rng.shuffle(order)
        loss_sum, n = 0.0, 0
        for i in range(0, len(order), args.batch_size):
            idx = order[i:i + args.batch_size]
            x = torch.tensor([pad(train_ids[j], args.max_len) for j in idx], dtype=torch.long)
            loss, _ = model(x, y_train[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
            loss_sum += loss_value * len(idx)
            n += len(idx)
            progress.step(epoch, loss_value, loss_sum / n)
        progress.eval_start()
        acc = float((predict(model, test_ids, args.max_len, on_batch=progress.eval_batch)
                     .argmax(1).numpy() == y_test).mean())
        progress.eval_end()
        history.append({"epoch": epoch + 1, "train_loss": loss_sum / n, "test_accuracy": acc,
                        "seconds": time.time() - t_train0})
        print(f"epoch {epoch + 1}: train loss {loss_sum / n:.4f}, test accuracy {acc:.4f} "
              f"({time.time() - t_train0:.0f} s)", flush=True)
    t_train = time.time() - t_train0

    model.eval()
    progress.eval_start()
    logits = predict(model, test_ids, args.max_len, on_batch=progress.eval_batch).numpy().astype(np.float32)
    progress.eval_end()
    pred = logits.argmax(1)
    accuracy = float((pred == y_test).mean())
    per_class = {LABEL_NAMES[c]: {"test_pages": int((y_test == c).sum()),
                                  "correct": int(((pred == c) & (y_test == c)).sum())}
                 for c in range(len(LABEL_NAMES))}
    print(f"test accuracy {accuracy:.4f} ({int((pred == y_test).sum())}/{len(test)}; majority "
          f"baseline {baseline:.4f}); training {t_train:.0f} s on {args.threads} threads")

    out = args.out
    export_model(model.state_dict(), config, out, dtype="float32", model_name=args.model_name,
                 tokenizer=word_dict_tokenizer(word_dict, UNK, args.max_len))
    with open(os.path.join(out, "word_dict.json"), "w", encoding="utf-8") as f:
        json.dump(word_dict, f, ensure_ascii=False)
    with open(os.path.join(out, "labels.json"), "w", encoding="utf-8") as f:
        json.dump({"labels": LABEL_NAMES,
                   "sections": {s: LABEL_NAMES[l] for s, (l, _) in sorted(LABELS.items())}}, f, indent=2)
    with open(os.path.join(out, "test.jsonl"), "w", encoding="utf-8") as f:
        for p in test:
            f.write(json.dumps({"name": p.name, "section": p.section, "text": p.text,
                                "label": p.label, "label_name": LABEL_NAMES[p.label]},
                               ensure_ascii=False) + "\n")
    with open(os.path.join(out, "test_ids.jsonl"), "w") as f:
        for s in test_ids:
            f.write(json.dumps({"token_ids": s}) + "\n")
    with open(os.path.join(out, "test_logits.jsonl"), "w") as f:
        for row in logits:
            f.write(json.dumps({"logits": [float(v) for v in row]}) + "\n")
    report = {"corpus": {"packages": versions, "pages": len(pages), "train": len(train),
                         "test": len(test), "test_fraction": args.test_fraction},
              "word_dict_size": len(word_dict), "min_freq": args.min_freq, "max_len": args.max_len,
              "test_unk_rate": unk_rate, "config": config,
              "training": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                           "seed": args.seed, "threads": args.threads, "seconds": t_train,
                           "torch": torch.__version__},
              "test_accuracy": accuracy, "majority_baseline": baseline, "per_class": per_class,
              "history": history}

    status = 0
    if args.verify_with:
        # float32: the 1e-4 logit rule is float32's (the default, auto, is bfloat16 on a CPU
        # with AVX512_BF16 or AMX)
        r = subprocess.run([args.verify_with, "--model-dir", out, "--backend", "cpu", "--dtype", "float32",
                            "--return-logits", "--threads", str(args.threads),
                            "--input", os.path.join(out, "test_ids.jsonl")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print(f"fastformer-encode failed ({r.returncode}):\n{r.stderr}", file=sys.stderr)
            return 1
        ours = np.array([json.loads(l)["logits"] for l in r.stdout.splitlines() if l.strip()],
                        dtype=np.float64)
        if ours.shape != logits.shape:
            print(f"fastformer-encode gave logits of shape {ours.shape}, expected {logits.shape}",
                  file=sys.stderr)
            return 1
        mism, worst, over = compare_logits(ours, logits.astype(np.float64), args.rtol)
        engine_acc = float((ours.argmax(1) == y_test).mean())
        report["engine_parity"] = {"argmax_mismatches": mism, "max_rel_error": worst,
                                   "pages_over_rtol": over, "rtol": args.rtol,
                                   "engine_test_accuracy": engine_acc}
        ok = mism == 0 and over == 0
        print(f"engine parity: {'PASS' if ok else 'FAIL'}: argmax mismatches {mism}/{len(test)}, "
              f"max relative logit error {worst:.3g} (rtol {args.rtol}), engine accuracy {engine_acc:.4f}")
        status = 0 if ok else 1
    with open(os.path.join(out, "train_report.json"), "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    return status


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What tokenizing in the server costs (issue 15): the trained demo model's held-out pages sent
to one fastformer-server as text and as the same token ids, side by side, for
docs/benchmarks/serving.md ("Text in: the trained demo model and what tokenization costs").

    /usr/bin/python3 tools/bench_text.py --model-dir build/demo-model [--build-dir build]
        [--seconds 15] [--rounds 2] [--concurrency 4] [--pages-per-request 8] [--threads 2] [--json]

1. The tokenizer alone, one core: fastformer-tokenize --bench over the pages (texts/s, tokens/s).
2. End to end: fastformer-server (CPU, --threads) on the model; `--concurrency` client threads
   send Encode requests of `--pages-per-request` pages (cycling through the split, logits
   returned), for `--seconds`, as text and then as the notebook's ids (test_ids.jsonl), `--rounds`
   times alternately. Reported: pages/s and tokens/s of each, text ÷ ids, and the server's
   tokenize time (fastformer_tokenize_duration_seconds_sum) as a share of its CPU time
   (process_cpu_seconds_total) over the text runs.
The model directory is what tools/train_demo_model.py writes (tokenizer.json, test.jsonl,
test_ids.jsonl). Run it on a quiet machine: the client threads share the cores with the server.
The warm-up, the rounds and their order are the bench runner's (fastformer_testing/bench.py);
the JSON adds the command line and the commit to the machine and the date.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
from fastformer_testing import ServerProcess, free_port  # noqa: E402
from fastformer_testing.bench import Runner, Scenario, command, commit  # noqa: E402
from machine_info import describe  # noqa: E402


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(name)}(?:{{}})? ([0-9.eE+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def tokenizer_alone(bin_dir: Path, model_dir: Path, texts_file: Path) -> dict:
    out = subprocess.run([str(bin_dir / "fastformer-tokenize"), "--tokenizer", str(model_dir / "tokenizer.json"),
                          "--bench", "--repeat", "5"], stdin=open(texts_file), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"fastformer-tokenize failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_load(stub, pb, pages, seconds, concurrency, per_request) -> dict:
    """`concurrency` threads sending requests of `per_request` pages for `seconds`."""
    stop = time.monotonic() + seconds
    done = {"pages": 0, "tokens": 0, "requests": 0}
    lock = threading.Lock()
    errors = []

    def worker(k):
        i = k * per_request
        while time.monotonic() < stop:
            req = pb.EncodeRequest(return_logits=True)
            for j in range(per_request):
                page = pages[(i + j) % len(pages)]
                seq = req.sequences.add()
                if isinstance(page, str):
                    seq.text = page
                else:
                    seq.token_ids.extend(page)
            i += per_request * concurrency
            try:
                resp = stub.Encode(req, timeout=60)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            with lock:
                done["pages"] += len(resp.encodings)
                done["tokens"] += sum(e.num_tokens for e in resp.encodings)
                done["requests"] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        sys.exit(f"bench_text: a request failed: {errors[0]}")
    elapsed = time.monotonic() - start
    return {"pages_per_s": done["pages"] / elapsed, "tokens_per_s": done["tokens"] / elapsed, **done,
            "seconds": elapsed}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--pages-per-request", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="float32",
                    help="the server's --dtype (float32, as the figures of docs/benchmarks.md; its default is auto)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    model_dir, bin_dir = Path(args.model_dir), REPO / args.build_dir / "bin"

    work = Path(tempfile.mkdtemp(prefix="bench-text-"))
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(REPO / "proto"), f"--python_out={work}",
                    f"--grpc_python_out={work}", "fastformer/v1/encoder.proto"], check=True)
    sys.path.insert(0, str(work))
    import grpc
    from fastformer.v1 import encoder_pb2 as pb, encoder_pb2_grpc as pb_grpc

    texts = [json.loads(line)["text"] for line in (model_dir / "test.jsonl").read_text().splitlines() if line]
    ids = [json.loads(line)["token_ids"] for line in (model_dir / "test_ids.jsonl").read_text().splitlines() if line]
    texts_file = work / "texts.jsonl"
    texts_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    alone = tokenizer_alone(bin_dir, model_dir, texts_file)
    print(f"tokenizer alone: {alone}", file=sys.stderr)

    port, metrics_port = free_port(), free_port()
    server = ServerProcess(None, args=["--model-dir", str(model_dir),
                                       "--listen", f"127.0.0.1:{port}", "--metrics-listen", f"127.0.0.1:{metrics_port}",
                                       "--http-listen", "127.0.0.1:0", "--backend", "cpu", "--threads", str(args.threads),
                                       "--dtype", args.dtype],
                           bin_dir=bin_dir, base_env=os.environ, start_timeout=60, stop_grace=30)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.EncoderStub(channel)
    spent = {"tokenize_s": 0.0, "cpu_s": 0.0}  # the server's, over the text runs

    def ids_once():
        return run_load(stub, pb, ids, args.seconds, args.concurrency, args.pages_per_request)

    def text_once():
        t0, c0 = metric(metrics_port, "fastformer_tokenize_duration_seconds_sum"), \
            metric(metrics_port, "process_cpu_seconds_total")
        r = run_load(stub, pb, texts, args.seconds, args.concurrency, args.pages_per_request)
        spent["tokenize_s"] += metric(metrics_port, "fastformer_tokenize_duration_seconds_sum") - t0
        spent["cpu_s"] += metric(metrics_port, "process_cpu_seconds_total") - c0
        return r

    try:
        # Serves once GetModelInfo answers (the model is loaded): the harness's loop, which stops
        # at once, with the command, when the server exits first.
        server.wait_for(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=2) is not None, "GetModelInfo",
                        interval=0.2, retry_on=(grpc.RpcError,))
        # One warm-up (2 s of ids), then each round ids, text.
        scenarios = [Scenario("ids", ids_once,
                              warm_up=lambda: run_load(stub, pb, ids, 2, args.concurrency, args.pages_per_request)),
                     Scenario("text", text_once, warm_up=lambda: None)]
        measured = Runner(rounds=args.rounds, warmup=1, tool="bench_text",
                          on_run=lambda r, s, f: print(f"{s.name}: {f}", file=sys.stderr)).run(scenarios)
        runs = {"text": measured.runs["text"], "ids": measured.runs["ids"]}
        tokenize_s, cpu_s = spent["tokenize_s"], spent["cpu_s"]
    finally:
        channel.close()
        server.stop(check=False)

    text_rate = sum(r["pages_per_s"] for r in runs["text"]) / len(runs["text"])
    ids_rate = sum(r["pages_per_s"] for r in runs["ids"]) / len(runs["ids"])
    result = {"machine": describe(), "date": time.strftime("%Y-%m-%d"), "pages": len(texts),
              "tokenizer_alone": alone, "runs": runs, "text_over_ids": text_rate / ids_rate,
              "tokenize_share_of_server_cpu": tokenize_s / cpu_s if cpu_s else None,
              "command": command(), "commit": commit()}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['machine']}, {result['date']}; {len(texts)} held-out pages, {args.threads} server threads, "
          f"{args.concurrency} client threads, {args.pages_per_request} pages a request\n")
    print(f"tokenizer alone (one core): {alone.get('texts_per_s', 0):,.0f} texts/s, "
          f"{alone.get('tokens_per_s', 0):,.0f} tokens/s\n")
    print("| round | ids: pages/s | tokens/s | text: pages/s | tokens/s | text ÷ ids |")
    print("| --- | --- | --- | --- | --- | --- |")
    for k, (a, b) in enumerate(zip(runs["ids"], runs["text"]), 1):
        print(f"| {k} | {a['pages_per_s']:.1f} | {a['tokens_per_s']:,.0f} | {b['pages_per_s']:.1f} | "
              f"{b['tokens_per_s']:,.0f} | {b['pages_per_s'] / a['pages_per_s']:.3f} |")
    print(f"\ntext ÷ ids over all rounds: {result['text_over_ids']:.3f}; the server's tokenize time is "
          f"{100 * (result['tokenize_share_of_server_cpu'] or 0):.2f}% of its CPU time in the text runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The server on the GPU (issue 47): the GPU check's two server stages, run by gpu-check.sh.

    server_stage.py parity --bin-dir B --lib-path P --models M --out JSON --log-dir D
                           [--expected DIR] [--set gpu|smoke] [--backend cuda] [--dtype auto]
    server_stage.py load   --bin-dir B --lib-path P --models M --out JSON --log-dir D
                           [--set gpu|smoke] [--backend cuda] [--dtype auto] [--seconds 10]

`parity` starts `fastformer-server --backend cuda` on each model of the set (base-long, and
official with a tokenizer: two servers side by side), sends tests/gpu/server_expected.py's inputs,
half of base-long's sequences over gRPC Encode (fastformer-client, one sequence a request, the
65,536-token one among them) and half over HTTP /v1/embeddings, and the texts over both, and
compares every answer with the CPU float32 answers carried in --expected (made here, before the
lease): cosine >= 0.999 for each pooled embedding, and the same argmax of the logits where the
model has a head. When the carried answers are missing, or were made on a model whose SHA-256 is
not the lease's (another PyTorch's random numbers), it computes them there with the carried
fastformer-encode on the CPU, and says so.

`load` starts the server on base-long and runs fastformer-loadgen against it:
  saturation  closed loop, enough concurrency to fill 65,536-token batches, --seconds: the
              server's tokens/s, its batches and mean batch
              tokens from /metrics, the GPU memory (nvidia-smi, else the server's own gauge)
  low load    one client sending 128-token requests for --seconds: p50/p99 end to end, and the
              server's own queue and compute times (the replies' timings)
  drain       SIGTERM during saturation: every request answered or refused with UNAVAILABLE,
              none hangs, the server says "drained" and exits 0
then the carried fastformer-bench on the GPU the server has left (the same plugin, model, dtype,
lengths and batch budget): the server's tokens/s over the engine's (target >= 0.90).
Each writes one JSON file (--out; the schema report.py reads: tests/gpu/README.md), also when a
step fails (its "error" says why), and exits 0 when every verdict holds, 1 otherwise.

Only our binaries get --lib-path (LD_LIBRARY_PATH: the carried closure); this interpreter keeps
the machine's libraries. Standard library only (the lent machine has no grpcio): gRPC through
our own fastformer-client and fastformer-loadgen, HTTP through urllib.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(ROOT / "tools"))  # fastformer_testing: standard library only, no pytest
import server_expected  # noqa: E402
from fastformer_testing.server_ports import FASTFORMER as PORT_LINES  # noqa: E402  (the tests' start-up lines)

THRESHOLD = 0.999  # bfloat16 against float32: the parity rule
RATIO_TARGET = 0.90
# The drain's clear answers to a request it did not admit: UNAVAILABLE (a draining server's
# refusal, then a refused connection once it has exited), and CANCELLED, which the load
# generator itself gives the calls still waiting to retry such a refusal when its run ends
# ("cancelled: the client is being destroyed"). That no admitted request went unanswered is the
# server's own account: it exits 0 after "drained; exiting" only when none is left in flight.
REFUSAL_CODES = {"UNAVAILABLE", "CANCELLED"}


def log(*a):
    print("[server_stage %s]" % time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


class Binaries:
    def __init__(self, bin_dir: Path, lib_path: str, extra_env: dict | None = None):
        self.dir = bin_dir
        self.env = dict(os.environ)
        # The carried closure for our binaries only; FASTFORMER_* of the caller's are dropped
        # except the cuBLASLt library gpu-check.sh found.
        for k in list(self.env):
            if k.startswith("FASTFORMER_") and k != "FASTFORMER_CUBLASLT_LIBRARY":
                del self.env[k]
        if lib_path:
            self.env["LD_LIBRARY_PATH"] = lib_path + (":" + self.env["LD_LIBRARY_PATH"] if self.env.get("LD_LIBRARY_PATH") else "")
        self.env.update(extra_env or {})

    def __call__(self, name: str) -> str:
        path = self.dir / name
        if not os.access(path, os.X_OK):
            raise RuntimeError(f"no {path}: carry the server (deploy/carry-gpu-deps.sh --server)")
        return str(path)


class Server:
    """fastformer-server on loopback, every listener on port 0, its ports read from its log."""

    def __init__(self, bins: Binaries, model_dir: Path, backend: str, dtype: str, log_path: Path,
                 extra: list[str] | None = None):
        self.cmd = [bins("fastformer-server"), "--model-dir", str(model_dir), "--backend", backend,
                    "--dtype", dtype, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                    "--http-listen", "127.0.0.1:0"] + (extra or [])
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, env=bins.env)
        self.ports: dict[str, int] = {}
        self.model = ""

    def text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, n=12) -> str:
        return " | ".join(self.text().splitlines()[-n:])

    def wait_ready(self, timeout: float) -> None:
        t_end = time.time() + timeout
        while time.time() < t_end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fastformer-server exited with status {self.proc.returncode} before it "
                                   f"was ready: {self.tail()}")
            text = self.text()
            for name, pattern in PORT_LINES.items():
                m = pattern.search(text)
                if m:
                    self.ports[name] = int(m.group(1))
            if len(self.ports) == 3:
                try:
                    with urllib.request.urlopen(self.url("/v2/health/ready"), timeout=5) as r:
                        if r.status == 200:
                            models = json.load(urllib.request.urlopen(self.url("/v1/models"), timeout=5))
                            self.model = models["data"][0]["id"]
                            return
                except (OSError, ValueError, KeyError, IndexError):
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"fastformer-server not ready within {timeout:.0f} s: {self.tail()}")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.ports['http']}{path}"

    def metrics(self) -> dict[str, float]:
        """The unlabelled sums of /metrics: name -> value (labels summed)."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metrics']}/metrics", timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name = re.split(r"[{ ]", line, 1)[0]
            try:
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            except ValueError:
                pass
        return out

    def dtype_line(self) -> str:
        for line in self.text().splitlines():
            if "dtype" in line and ("auto" in line or "serving" in line):
                return line.strip()[-300:]
        return ""

    def stop(self, timeout: float = 40) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


# ---- parity ---------------------------------------------------------------------------------
def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return 1.0 if na == nb else 0.0
    return dot / (na * nb)


def argmax(v: list[float]) -> int:
    return max(range(len(v)), key=v.__getitem__)


def encode_grpc(bins: Binaries, server: Server, lines: list[dict], logits: bool, work: Path, tag: str) -> list[dict]:
    """Each line as one Encode call of fastformer-client: its answers, in order."""
    src = work / f"{tag}.in.jsonl"
    out = work / f"{tag}.out.jsonl"
    src.write_text("".join(json.dumps(line) + "\n" for line in lines))
    cmd = [bins("fastformer-client"), "encode", "--target", server.target, "--input", str(src),
           "--output", str(out), "--batch", "1", "--deadline-ms", "120000"]
    if logits:
        cmd.append("--return-logits")
    run = subprocess.run(cmd, capture_output=True, text=True, env=bins.env, timeout=150)
    if run.returncode != 0:
        raise RuntimeError(f"fastformer-client encode: exit {run.returncode}: {run.stderr.strip()[-400:]}")
    answers = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    if len(answers) != len(lines):
        raise RuntimeError(f"fastformer-client encode: {len(answers)} answers for {len(lines)} lines")
    return answers


def encode_http(server: Server, line: dict) -> dict:
    """One /v1/embeddings call (OpenAI's body: a text, or one sequence's token ids)."""
    body = {"model": server.model, "encoding_format": "float",
            "input": line["text"] if "text" in line else line["token_ids"]}
    req = urllib.request.Request(server.url("/v1/embeddings"), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.load(r)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')[:300]}") from None
    return {"embedding": answer["data"][0]["embedding"], "num_tokens": answer.get("usage", {}).get("prompt_tokens")}


def judge(name: str, model: str, lines: list[dict], expected: list[dict], answers: list, head: bool) -> dict:
    """One parity group: every answer's cosine to its expectation, and the argmax where asked."""
    group = {"name": name, "model": model, "requests": len(lines), "sequences": len(lines),
             "tokens": sum(e.get("num_tokens", 0) for e in expected), "min_cosine": None, "worst": "",
             "argmax": {"same": 0, "of": 0} if head else None, "failed_requests": 0, "errors": [], "ok": False}
    worst = None
    for i, (exp, got) in enumerate(zip(expected, answers)):
        if isinstance(got, Exception) or got is None:
            group["failed_requests"] += 1
            if len(group["errors"]) < 5:
                group["errors"].append(f"request {i} ({exp.get('num_tokens')} tokens): {got}")
            continue
        c = cosine(got["embedding"], exp["embedding"])
        if worst is None or c < worst:
            worst = c
            group["worst"] = f"request {i} ({exp.get('num_tokens', '?'):,} tokens)"
        if head and exp.get("logits") is not None:
            group["argmax"]["of"] += 1
            if got.get("logits") is not None and argmax(got["logits"]) == argmax(exp["logits"]):
                group["argmax"]["same"] += 1
            elif len(group["errors"]) < 5:
                group["errors"].append(f"request {i}: argmax {got.get('logits') and argmax(got['logits'])} "
                                       f"vs {argmax(exp['logits'])}")
    group["min_cosine"] = worst
    group["ok"] = (group["failed_requests"] == 0 and worst is not None and worst >= THRESHOLD
                   and (not head or group["argmax"]["same"] == group["argmax"]["of"]))
    return group


def expectations(a, bins: Binaries, models: Path, servers: list) -> tuple[dict, str]:
    """{model: (inputs, expected)} and where they came from: the carried ones where they apply.
    Before computing any on the CPU, the servers started meanwhile must still run: a server that
    refused to start (no GPU, no driver) is the stage's answer, at once."""
    spec = server_expected.SETS[a.set]
    carried, manifest = {}, {}
    if a.expected and (Path(a.expected) / "manifest.json").exists():
        manifest, carried = server_expected.load_expected(Path(a.expected))
    out, notes = {}, []
    for name, s in spec.items():
        model_dir = models / s["preset"]
        sha = server_expected.sha256_of(model_dir / "model.safetensors")
        m = manifest.get("models", {}).get(name)
        if name in carried and m and m.get("sha256") == sha:
            out[name] = carried[name]
            notes.append(f"{name}: carried (CPU float32 on {manifest.get('host')}, {manifest.get('created')})")
            continue
        why = "none carried" if name not in carried else "the carried ones are for another model file (SHA-256 differs)"
        time.sleep(0.5)
        for server in servers:
            if server.proc.poll() is not None:
                raise RuntimeError(f"fastformer-server exited with status {server.proc.returncode} at start-up: "
                                   f"{server.tail()}")
        t0 = time.time()
        lines = server_expected.inputs_for(name, s)
        answers = server_expected.encode_cpu(bins("fastformer-encode"), model_dir, lines, s["kind"] == "text",
                                             env=bins.env)
        out[name] = (lines, answers)
        notes.append(f"{name}: computed here on the CPU in float32 ({why}; {time.time() - t0:.1f} s)")
    return out, "; ".join(notes)


def parity(a) -> dict:
    bins = Binaries(Path(a.bin_dir), a.lib_path)
    models = Path(a.models)
    work = Path(a.log_dir)
    work.mkdir(parents=True, exist_ok=True)
    result = {"backend": a.backend, "dtype": None, "dtype_line": "", "server_cmd": "", "expected_from": "",
              "threshold": THRESHOLD, "groups": [], "ok": False, "error": None}
    spec = server_expected.SETS[a.set]
    servers: dict[str, Server] = {}
    try:
        # One server a model directory, started side by side while the expectations load.
        for name, s in spec.items():
            if s["preset"] not in servers:
                servers[s["preset"]] = Server(bins, models / s["preset"], a.backend, a.dtype,
                                              work / f"server-parity-{s['preset']}.log",
                                              ["--max-batch-tokens", str(a.max_batch_tokens)])
        result["server_cmd"] = shlex.join(next(iter(servers.values())).cmd)
        expected, result["expected_from"] = expectations(a, bins, models, list(servers.values()))
        for server in servers.values():
            server.wait_ready(a.ready_timeout)
        first = next(iter(servers.values()))
        line = first.dtype_line()
        result["dtype_line"] = line
        m = re.search(r"dtype auto: (\w+)", line)
        result["dtype"] = m.group(1) if m else a.dtype
        log("servers ready;", line)
        for name, s in spec.items():
            lines, exp = expected[name]
            server = servers[s["preset"]]
            head = s["kind"] == "text"  # the text model has a classifier head
            prefix = "text-" if s["kind"] == "text" else ""
            # Even lines over gRPC, odd ones over HTTP; the longest sequence over gRPC.
            longest = max(range(len(lines)), key=lambda i: exp[i].get("num_tokens", 0))
            grpc_idx = [i for i in range(len(lines)) if i % 2 == 0 or i == longest]
            http_idx = [i for i in range(len(lines)) if i not in grpc_idx]
            try:
                got = encode_grpc(bins, server, [lines[i] for i in grpc_idx], head, work, f"{name}-grpc")
            except Exception as e:  # noqa: BLE001 - the whole call failed: every request counts
                got = [e] * len(grpc_idx)
            result["groups"].append(judge(prefix + "grpc", s["preset"], [lines[i] for i in grpc_idx],
                                          [exp[i] for i in grpc_idx], got, head))
            got = []
            for i in http_idx:
                try:
                    got.append(encode_http(server, lines[i]))
                except Exception as e:  # noqa: BLE001
                    got.append(e)
            result["groups"].append(judge(prefix + "http", s["preset"], [lines[i] for i in http_idx],
                                          [exp[i] for i in http_idx], got, False))
            for g in result["groups"][-2:]:
                log(f"{g['name']} ({g['model']}): {g['requests']} requests, min cosine {g['min_cosine']}, "
                    f"argmax {g['argmax']}, ok {g['ok']}")
        result["ok"] = bool(result["groups"]) and all(g["ok"] for g in result["groups"])
    except Exception as e:  # noqa: BLE001 - written down, the report says why
        result["error"] = str(e)[:1000]
        log("error:", result["error"])
    finally:
        for server in servers.values():
            server.stop()
    return result


# ---- load -----------------------------------------------------------------------------------
def loadgen(bins: Binaries, server: Server, args: list[str], timeout: float) -> dict:
    cmd = [bins("fastformer-loadgen"), "--target", server.target, "--json"] + args
    run = subprocess.run(cmd, capture_output=True, text=True, env=bins.env, timeout=timeout)
    steps = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 and not steps:
        raise RuntimeError(f"fastformer-loadgen: exit {run.returncode}: {run.stderr.strip()[-400:]}")
    if not steps:
        raise RuntimeError(f"fastformer-loadgen printed no step: {run.stderr.strip()[-400:]}")
    return steps[-1]


def gpu_memory_mib(pid: int) -> tuple[float | None, str]:
    try:
        run = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10)
        for line in run.stdout.splitlines():
            p, mem = [x.strip() for x in line.split(",")[:2]]
            if int(p) == pid:
                return float(mem), "nvidia-smi --query-compute-apps"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return None, ""


def percentiles(d: dict | None) -> dict:
    d = d or {}
    return {"p50": d.get("p50"), "p99": d.get("p99")}


def load(a) -> dict:
    bins = Binaries(Path(a.bin_dir), a.lib_path)
    work = Path(a.log_dir)
    work.mkdir(parents=True, exist_ok=True)
    model_name = a.model or next(iter(server_expected.SETS[a.set].values()))["preset"]
    model_dir = Path(a.models) / model_name
    result = {"backend": a.backend, "dtype": None, "model": model_name, "max_batch_tokens": a.max_batch_tokens,
              "saturation": {}, "low_load": {}, "drain": {}, "ok": False, "error": None}
    sat_args = ["--lengths", a.lengths, "--sequences-per-request", str(a.sequences_per_request),
                "--concurrency", str(a.concurrency), "--pool-requests", "64", "--seed", "1"]
    server = None
    try:
        sat = result["saturation"]
        sat.update({"seconds": a.seconds, "concurrency": a.concurrency, "lengths": a.lengths,
                    "sequences_per_request": a.sequences_per_request, "target": RATIO_TARGET})
        server = Server(bins, model_dir, a.backend, a.dtype, work / "server-load.log",
                        ["--max-batch-tokens", str(a.max_batch_tokens),
                         "--max-queue-tokens", str(16 * a.max_batch_tokens)])
        server.wait_ready(a.ready_timeout)
        m = re.search(r"dtype auto: (\w+)", server.dtype_line())
        result["dtype"] = m.group(1) if m else (a.dtype if a.dtype != "auto" else
                                                 "bfloat16" if a.backend == "cuda" else "float32")

        # Saturation, with the GPU memory sampled meanwhile.
        before = server.metrics()
        peak = {"mib": None, "from": ""}
        stop = threading.Event()

        def sample():
            while not stop.wait(1.0):
                mib, src = gpu_memory_mib(server.proc.pid)
                if mib is not None and (peak["mib"] is None or mib > peak["mib"]):
                    peak.update(mib=mib, **{"from": src})
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        step = loadgen(bins, server, sat_args + ["--duration", str(a.seconds), "--warmup", str(a.warmup)],
                       a.seconds + a.warmup + 60)
        stop.set()
        sampler.join(5)
        after = server.metrics()
        batches = after.get("fastformer_batch_tokens_count", 0) - before.get("fastformer_batch_tokens_count", 0)
        btokens = after.get("fastformer_batch_tokens_sum", 0) - before.get("fastformer_batch_tokens_sum", 0)
        if peak["mib"] is None and after.get("fastformer_device_memory_used_bytes"):
            peak.update(mib=after["fastformer_device_memory_used_bytes"] / 2**20,
                        **{"from": "fastformer_device_memory_used_bytes (/metrics)"})
        sat.update({"requests": step.get("requests"), "succeeded": step.get("succeeded"),
                    "errors": step.get("errors", {}), "server_tokens_per_s": step.get("tokens_per_second"),
                    "latency_ms": percentiles(step.get("latency_ms")), "batches": int(batches),
                    "batch_tokens_mean": (btokens / batches) if batches else None,
                    "gpu_memory_mib": peak["mib"], "gpu_memory_from": peak["from"]})
        log(f"saturation: server {sat.get('server_tokens_per_s')} tokens/s, {batches:.0f} batches, "
            f"mean {sat['batch_tokens_mean']} tokens")

        # Low load: one client, 128-token requests.
        step = loadgen(bins, server, ["--lengths", "fixed:128", "--sequences-per-request", "1", "--concurrency", "1",
                                      "--seed", "2", "--duration", str(a.seconds), "--warmup", "1"],
                       a.seconds + 60)
        result["low_load"] = {"seconds": a.seconds, "lengths": "fixed:128", "requests": step.get("requests"),
                              "latency_ms": percentiles(step.get("latency_ms")),
                              "server_queue_ms": percentiles(step.get("server_queue_ms")),
                              "server_compute_ms": percentiles(step.get("server_compute_ms")),
                              "errors": step.get("errors", {})}
        log("low load:", result["low_load"])

        # Drain: SIGTERM in the middle of a saturation run.
        drain = result["drain"]
        signal_after = min(3.0, a.drain_seconds / 2)
        drain["signal_after_s"] = signal_after
        out_path = work / "server-drain-loadgen.out"
        with open(out_path, "w") as out:
            gen = subprocess.Popen([bins("fastformer-loadgen"), "--target", server.target, "--json"] + sat_args
                                   + ["--duration", str(a.drain_seconds), "--warmup", "0"],
                                   stdout=out, stderr=subprocess.STDOUT, env=bins.env)
            time.sleep(signal_after)
            t0 = time.time()
            server.proc.send_signal(signal.SIGTERM)
            try:
                drain["server_exit"] = server.proc.wait(45)
            except subprocess.TimeoutExpired:
                drain["server_exit"] = None
            drain["seconds_to_exit"] = round(time.time() - t0, 2)
            try:
                gen.wait(a.drain_seconds + 30)
                drain["hung"] = False
            except subprocess.TimeoutExpired:
                gen.kill()
                gen.wait()
                drain["hung"] = True
        steps = [json.loads(x) for x in out_path.read_text().splitlines() if x.startswith("{")]
        step = steps[-1] if steps else {}
        errors = step.get("errors", {})
        drain.update({"requests": step.get("requests"), "succeeded": step.get("succeeded"), "errors": errors,
                      "unclear": sum(n for code, n in errors.items() if code not in REFUSAL_CODES),
                      "drained_line": "drained; exiting" in server.text(),
                      "abandoned_line": "not answered" in server.text()})
        if not steps:
            drain["note"] = "fastformer-loadgen printed no report: " + out_path.read_text()[-300:]
        accounted = (step.get("succeeded") or 0) + sum(errors.values())
        drain["ok"] = bool(steps and drain["server_exit"] == 0 and drain["drained_line"] and not drain["hung"]
                           and drain["unclear"] == 0 and accounted == step.get("requests"))
        log("drain:", drain)
        server.log_file.close()
        server = None

        # The engine alone, on the GPU the server has left: the same plugin, model, dtype (the
        # one the server picked), lengths and batch budget.
        bench = [bins("fastformer-bench"), "--model-dir", str(model_dir), "--backend", a.backend,
                 "--dtype", result["dtype"], "--lengths", a.lengths, "--batch-tokens", str(a.max_batch_tokens),
                 "--seconds", str(max(1.0, a.seconds / 3)), "--json"]
        sat["engine_cmd"] = shlex.join(bench[1:]).replace(str(model_dir), model_name)
        run = subprocess.run(bench, capture_output=True, text=True, env=bins.env, timeout=60)
        (work / "server-load-bench.out").write_text(run.stdout + run.stderr)
        engine = None
        for line in run.stdout.splitlines():
            if line.startswith("{"):
                engine = json.loads(line)
        if engine is None:
            raise RuntimeError(f"fastformer-bench: exit {run.returncode}: {run.stderr.strip()[-400:]}")
        sat["engine_tokens_per_s"] = engine.get("tokens_per_second")
        sat["engine_dtype"] = engine.get("dtype")
        if sat.get("server_tokens_per_s"):
            sat["ratio"] = sat["server_tokens_per_s"] / sat["engine_tokens_per_s"]
        log(f"engine: {sat['engine_tokens_per_s']} tokens/s; server ÷ engine {sat.get('ratio')}")
        ratio = result["saturation"].get("ratio")
        result["ok"] = bool(ratio is not None and ratio >= RATIO_TARGET and drain["ok"]
                            and not result["saturation"].get("errors") and not result["low_load"].get("errors"))
    except Exception as e:  # noqa: BLE001 - written down, the report says why
        result["error"] = str(e)[:1000]
        log("error:", result["error"])
    finally:
        if server is not None:
            server.stop()
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["parity", "load"])
    ap.add_argument("--bin-dir", required=True)
    ap.add_argument("--lib-path", default="", help="LD_LIBRARY_PATH for our binaries (the carried closure)")
    ap.add_argument("--models", required=True, help="the check's models: <dir>/<preset>/")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--log-dir", required=True)
    ap.add_argument("--expected", help="server_expected.py's directory (carried)")
    ap.add_argument("--set", default="gpu", choices=sorted(server_expected.SETS))
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--model", help="load: the model (default: the set's first)")
    ap.add_argument("--max-batch-tokens", type=int, default=65536)
    ap.add_argument("--lengths", default="uniform:64:4096")
    ap.add_argument("--sequences-per-request", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    ap.add_argument("--drain-seconds", type=float, default=8)
    ap.add_argument("--ready-timeout", type=float, default=90)
    a = ap.parse_args()
    result = parity(a) if a.what == "parity" else load(a)
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    # The last line: what gpu-check.sh puts in the stage's note when a verdict does not hold.
    log("verdict:", "ok" if result["ok"] else "; ".join(failures(result)) or "not ok")
    return 0 if result["ok"] else 1


def failures(result: dict) -> list[str]:
    """What does not hold, in a few words each."""
    out = [f"error: {result['error'][:200]}"] if result.get("error") else []
    for g in result.get("groups", []):
        if not g["ok"]:
            out.append(f"{g['name']} ({g['model']}): min cosine {g['min_cosine']}, argmax {g['argmax']}, "
                       f"{g['failed_requests']} failed requests")
    sat = result.get("saturation") or {}
    if sat.get("ratio") is not None and sat["ratio"] < RATIO_TARGET:
        out.append(f"server ÷ engine {sat['ratio']:.3f} < {RATIO_TARGET}")
    for part in ("saturation", "low_load"):
        if (result.get(part) or {}).get("errors"):
            out.append(f"{part} errors {result[part]['errors']}")
    drain = result.get("drain") or {}
    if drain and drain.get("ok") is False:
        out.append(f"drain: exit {drain.get('server_exit')}, drained line {drain.get('drained_line')}, "
                   f"hung {drain.get('hung')}, unclear {drain.get('unclear')}")
    return out


if __name__ == "__main__":
    sys.exit(main())

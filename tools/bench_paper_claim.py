#!/usr/bin/env python3
"""The paper's efficiency claim on the CPU: one sequence of 512 ... 65,536 tokens through
our engine (fastformer-bench) and through a softmax-attention Transformer encoder of the
same width and depth (tools/bench_sdpa.py's SdpaEncoder around PyTorch's
scaled_dot_product_attention), time per token and peak memory against length.

    bench_paper_claim.py [--build-dir build | --bench PATH] [--torch-python PY]
                         [--preset base-long] [--models-dir models]
                         [--lengths 512,2048,8192,32768,65536] [--threads 2]
                         [--budget 200] [--memory-limit-gib 16]
                         [--json-out docs/images/paper-claim-cpu.json]
                         [--plot docs/images/paper-claim-cpu.png]
    bench_paper_claim.py --replot docs/images/paper-claim-cpu.json [--plot FILE.png]

`make bench-paper` runs it with a PyTorch 2.x virtual environment (CPU SDPA with its flash
kernel, O(L) memory); with a --torch-python whose PyTorch has no SDPA (Debian's 1.13) the
Transformer uses "math" attention (the [H, L, L] score matrix) and a length whose score
matrices would not fit under --memory-limit-gib is recorded as not run.

Per length, each model in a fresh process, one after the other:
  - L <= 2048: one warm-up pass, then three timed passes (three different random
    sequences of length L): the median. L > 2048: one pass, no warm-up.
  - time per token = wall time of the forward pass / L (microseconds).
  - peak memory = peak RSS of the whole process (ru_maxrss: fastformer-bench's
    `peak_rss_bytes`; the Python worker's own, torch import and weights included). The
    worker's baseline (RSS after import and model construction) is recorded as well.
  - the Transformer's full pass is run when its predicted time (a L + b L^2 per layer,
    fitted to the lengths measured so far) is within --budget seconds; else one layer
    (embedding + layer 1, all 12 layers' weights resident) is run when that fits, and
    the time is extrapolated as embedding + layers x layer 1 (the layers have one
    shape); else the length is not run and the prediction is recorded. Peak memory of
    the one-layer run is a lower bound of the full pass's: layers run one after another
    and each frees its activations, but the allocator's heap may grow over the first few
    (tensors under glibc's 32 MiB mmap threshold). Any run is killed past 1.5 x --budget (our engine: 600 s) or when its
    RSS passes --memory-limit-gib, and recorded as such.

Both models use --threads threads. The worker's weights are torch.nn's default init
(seeded); the engine's the preset's (make_demo_model.py --seed 1). Both have the preset's
position table (65,536 rows for base-long), vocabulary, width, depth, heads and FFN.

The results go to --json-out (raw, every field) and the plot to --plot (two panels,
log-x: microseconds per token, peak MiB); the Markdown table is printed.
Worker mode (run by the script under --torch-python):
    bench_paper_claim.py --worker transformer --model-dir DIR --length L --runs N
                         --warmup N --threads T [--one-layer]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
DEFAULT_LENGTHS = "512,2048,8192,32768,65536"
SHORT = 2048  # lengths up to this: 1 warm-up + median of 3; above: one cold pass


# ---------------------------------------------------------------- worker (any PyTorch)

def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def worker_transformer(a) -> dict:
    import torch

    sys.path.insert(0, str(TOOLS))
    from bench_sdpa import HAVE_SDPA, SdpaEncoder  # noqa: E402

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    d, h, n_layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    model = SdpaEncoder(d, h, n_layers, cfg["intermediate_size"], cfg.get("vocab_size", 30522),
                        cfg["max_position_embeddings"], "post", cfg.get("hidden_act", "gelu")).eval()
    L = a.length
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(1, cfg.get("vocab_size", 30522), (1, L), generator=gen)
            for _ in range(a.warmup + a.runs)]
    kernel = "math (this PyTorch has no scaled_dot_product_attention)"
    if HAVE_SDPA:
        kernel = "sdpa"
        try:  # which SDPA kernel PyTorch picks for [1, H, L, D/H] float32 on the CPU
            q = torch.empty(1, h, L, d // h)
            choice = torch._fused_sdp_choice(q, q, q)
            from torch.nn.attention import SDPBackend
            kernel = f"sdpa: {SDPBackend(choice).name}" if not isinstance(choice, SDPBackend) \
                else f"sdpa: {choice.name}"
            del q
        except Exception as e:  # noqa: BLE001 (private API; report what we know)
            kernel = f"sdpa (kernel not reported: {type(e).__name__})"
    baseline = _rss_now()

    def embed(ids):
        pos = torch.arange(ids.shape[1])
        return model.ln(model.word(ids) + model.position(pos)[None])

    times, embed_times, layer_times = [], [], []
    with torch.inference_mode():
        for i, ids in enumerate(seqs):
            if a.one_layer:
                t0 = time.perf_counter()
                x = embed(ids)
                t1 = time.perf_counter()
                x = model.layers[0](x)
                t2 = time.perf_counter()
                del x
                if i >= a.warmup:
                    embed_times.append(t1 - t0)
                    layer_times.append(t2 - t1)
                    times.append((t1 - t0) + n_layers * (t2 - t1))
            else:
                t0 = time.perf_counter()
                model(ids)
                dt = time.perf_counter() - t0
                if i >= a.warmup:
                    times.append(dt)
    med = sorted(times)[(len(times) - 1) // 2]
    out = {
        "model": "transformer", "length": L, "runs": a.runs, "warmup": a.warmup,
        "seconds": med, "seconds_all": times, "us_per_token": med / L * 1e6,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "baseline_rss_bytes": baseline, "mode": "one-layer" if a.one_layer else "full",
        "torch_version": torch.__version__, "attention": kernel, "threads": torch.get_num_threads(),
        "hidden": d, "heads": h, "layers": n_layers, "intermediate": cfg["intermediate_size"],
        "positions": cfg["max_position_embeddings"], "cpu_capability": None,
    }
    if a.one_layer:
        out["embed_seconds"] = sorted(embed_times)[(len(embed_times) - 1) // 2]
        out["layer_seconds"] = sorted(layer_times)[(len(layer_times) - 1) // 2]
    try:
        out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        pass
    return out


# ---------------------------------------------------------------- orchestration

HZ = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


def cpu_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / HZ


def wait_quiet(max_wait_s, threshold=0.10, window_s=2.0) -> float:
    """Wait until other work uses less than `threshold` of the machine's cores over a window
    (at most max_wait_s). Returns the seconds waited."""
    t0 = time.monotonic()
    while True:
        b0 = cpu_busy_seconds()
        time.sleep(window_s)
        frac = (cpu_busy_seconds() - b0) / (window_s * NCPU)
        waited = time.monotonic() - t0
        if frac < threshold or waited >= max_wait_s:
            if waited > window_s + 1:
                print(f"  waited {waited:.0f} s for a quiet machine (busy {frac:.0%})", file=sys.stderr)
            return waited


QUIET_WAIT_S = 300.0


def run_watched(cmd, timeout_s, mem_limit_bytes, label):
    """Run cmd, polling /proc for its RSS. Returns (status, stdout, peak_hwm_bytes, wall, other):
    status "ok", "failed (rc N)", "timeout" or "memory"; other = the share of the machine's
    cores that other processes used while it ran (busy CPU time minus the child's)."""
    wait_quiet(QUIET_WAIT_S)
    print(f"+ {' '.join(str(c) for c in cmd)}", file=sys.stderr, flush=True)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0 = cpu_busy_seconds()
    t0 = time.monotonic()
    p = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    hwm, status = 0, None
    while p.poll() is None:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                for line in f:
                    if line.startswith(("VmHWM:", "VmRSS:")):
                        hwm = max(hwm, int(line.split()[1]) * 1024)
        except OSError:
            pass
        if hwm > mem_limit_bytes:
            status = "memory"
        elif time.monotonic() - t0 > timeout_s:
            status = "timeout"
        if status:
            p.kill()
            break
        time.sleep(0.2)
    out, err = p.communicate()
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    other = max(0.0, (cpu_busy_seconds() - busy0 - child_cpu) / (wall * NCPU))
    if status is None:
        status = "ok" if p.returncode == 0 else f"failed (rc {p.returncode})"
    if status != "ok":
        print(f"  {label}: {status} after {wall:.0f} s; stderr tail:\n{err[-1500:]}", file=sys.stderr)
    else:
        print(f"  {label}: done in {wall:.1f} s (other work used {other:.0%} of the cores)",
              file=sys.stderr, flush=True)
    return status, out, hwm, wall, other


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


def ensure_model(models_dir: Path, preset: str) -> Path:
    out = models_dir / preset
    if not (out / "model.safetensors").exists():
        subprocess.run([sys.executable, TOOLS / "make_demo_model.py", "--preset", preset, "--seed", "1",
                        "--out", out], check=True)
    return out


def cpu_info() -> dict:
    info = {"model_name": "unknown", "family": None, "model": None, "flags": [], "cores": os.cpu_count()}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "model name" and info["model_name"] == "unknown":
                info["model_name"] = v
            elif k == "cpu family" and info["family"] is None:
                info["family"] = int(v)
            elif k == "model" and info["model"] is None:
                info["model"] = int(v)
            elif k == "flags" and not info["flags"]:
                fl = set(v.split())
                info["flags"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni") if f in fl]
    except OSError:
        pass
    info["kernel"] = f"{platform.system()} {platform.release()}"
    return info


def fit_layer_time(points, L):
    """Predicted seconds of one layer at L from [(L_i, layer_seconds_i)]: a L + b L^2 through the
    two largest points (b >= 0), or proportional to L^2 from one point."""
    pts = sorted(points)[-2:]
    if not pts:
        return None
    if len(pts) == 1:
        (l1, t1), = pts
        return t1 * (L / l1) ** 2
    (l1, t1), (l2, t2) = pts
    # t = a l + b l^2  ->  t/l = a + b l
    b = (t2 / l2 - t1 / l1) / (l2 - l1)
    b = max(b, 0.0)
    a = t2 / l2 - b * l2
    return max(a * L + b * L * L, t2 * L / l2)


def math_attention_bytes(L, heads):
    """Float32 score matrix and its softmax, [H, L, L] each: math attention's peak for one layer."""
    return 2 * heads * L * L * 4


def run_ours(bench, model_dir, L, threads, timeout_s, mem_limit):
    runs, warm = (3, 1) if L <= SHORT else (1, 0)
    cmd = [bench, "--backend", "cpu", "--model-dir", model_dir, "--threads", threads, "--batch-tokens", L,
           "--lengths", f"fixed:{L}", "--pool-batches", runs, "--warmup-batches", warm, "--seconds", 0,
           "--seed", 1, "--json"]
    status, out, hwm, wall, other = run_watched(cmd, timeout_s, mem_limit, f"ours L={L}")
    r = {"model": "fastformer", "length": L, "status": status, "runs": runs, "warmup": warm,
         "command": " ".join(str(c) for c in cmd), "process_seconds": wall, "other_load": other}
    if status == "ok":
        j = last_json(out)
        r.update(seconds=j["batch_latency_p50_ms"] / 1e3, us_per_token=j["batch_latency_p50_ms"] * 1e3 / L,
                 peak_rss_bytes=j["peak_rss_bytes"], device=j.get("device"), engine=j)
    else:
        r.update(peak_rss_bytes_at_least=hwm, seconds_at_least=wall)
    return r


def run_transformer(py, model_dir, cfg, L, threads, budget, mem_limit, history):
    """history: [(L, layer_seconds, has_sdpa)] measured so far (to predict the next)."""
    runs, warm = (3, 1) if L <= SHORT else (1, 0)
    layers = cfg["num_hidden_layers"]
    pred_layer = fit_layer_time([(l, t) for l, t in history], L)
    r = {"model": "transformer", "length": L, "runs": runs, "warmup": warm}
    mode = "full"
    if pred_layer is not None:
        pred_full = pred_layer * layers * (runs + warm)
        pred_one = pred_layer * (runs + warm)
        r.update(predicted_seconds=pred_layer * layers, predicted_us_per_token=pred_layer * layers / L * 1e6)
        if pred_full > budget:
            mode = "one-layer" if pred_one <= budget else "skip"
    r["mode"] = mode
    if mode == "skip":
        r["status"] = (f"not run: predicted {pred_layer * layers:,.0f} s for {layers} layers, "
                       f"{pred_layer:,.0f} s for one (budget {budget:.0f} s)")
        return r
    cmd = [py, Path(__file__).resolve(), "--worker", "transformer", "--model-dir", model_dir, "--length", L,
           "--runs", runs, "--warmup", warm, "--threads", threads] + (["--one-layer"] if mode == "one-layer" else [])
    status, out, hwm, wall, other = run_watched(cmd, 1.5 * budget + 60, mem_limit, f"transformer L={L} ({mode})")
    r.update(status=status, command=" ".join(str(c) for c in cmd), process_seconds=wall, other_load=other)
    if status == "ok":
        j = last_json(out)
        r.update(j)
        r["status"] = "ok"
    else:
        r.update(peak_rss_bytes_at_least=hwm, seconds_at_least=wall)
    return r


RETRY_OTHER_LOAD = 0.20  # rerun (once) a run during which other work used more of the cores


def with_retry(run):
    """run() -> result; once more (after waiting for a quiet machine) when other work took more
    than RETRY_OTHER_LOAD of the cores and the run was short (< 120 s): the less disturbed one."""
    r = run()
    if r.get("status") == "ok" and r.get("other_load", 0) > RETRY_OTHER_LOAD and r.get("process_seconds", 1e9) < 120:
        print(f"  other work used {r['other_load']:.0%} of the cores: once more", file=sys.stderr)
        r2 = run()
        if r2.get("status") == "ok" and r2.get("other_load", 1) < r["other_load"]:
            r2["retried_other_load"] = r["other_load"]
            return r2
        r["retried_other_load"] = r2.get("other_load")
    return r


def fmt_int(v):
    return f"{v:,.0f}"


def table(results) -> str:
    rows = ["| length | ours us/token | ours peak MiB | Transformer us/token | Transformer peak MiB | Transformer run "
            "| other work (ours / Transformer) |",
            "| ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for L in results["lengths"]:
        o = results["ours"].get(str(L), {})
        t = results["transformer"].get(str(L), {})
        if o.get("status") == "ok":
            ou, om = fmt_int(o["us_per_token"]), fmt_int(o["peak_rss_bytes"] / 2**20)
        else:
            ou, om = o.get("status", "-"), "-"
        if t.get("status") == "ok" and t["mode"] == "full":
            tu, tm = fmt_int(t["us_per_token"]), fmt_int(t["peak_rss_bytes"] / 2**20)
            how = "full pass" + (f", median of {t['runs']}" if t["runs"] > 1 else ", one pass")
        elif t.get("status") == "ok":
            tu, tm = "~" + fmt_int(t["us_per_token"]), ">= " + fmt_int(t["peak_rss_bytes"] / 2**20)
            how = (f"{t['layers']} layers over budget: layer 1 measured ({t['layer_seconds']:,.0f} s), "
                   f"time = embedding + {t['layers']} x layer 1")
        elif t.get("mode") == "skip":
            pred = t.get("predicted_us_per_token")
            tu = f"not run (~{fmt_int(pred)} predicted)" if pred and math.isfinite(pred) else "not run"
            tm = "-"
            how = t["status"]
        elif t:
            tu = f"> {fmt_int(t['seconds_at_least'] / L * 1e6)} ({t['status']})"
            tm = f"> {fmt_int(t['peak_rss_bytes_at_least'] / 2**20)}"
            how = t["status"]
        else:
            tu, tm, how = "-", "-", "-"
        load = " / ".join(f"{r['other_load']:.0%}" if "other_load" in r else "-" for r in (o, t))
        rows.append(f"| {L:,} | {ou} | {om} | {tu} | {tm} | {how} | {load} |")
    return "\n".join(rows)


def plot(results, out_png):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    lengths = results["lengths"]
    layers = results["layers"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=120)
    attention = results["attention"].replace("sdpa: FLASH_ATTENTION", "SDPA, flash kernel")
    series = [("ours", "Fastformer, our engine (fastformer-bench)", "tab:blue", "o"),
              ("transformer", f"Transformer, PyTorch {results['torch_version'].split('+')[0]} ({attention})",
               "tab:red", "s")]
    for key, label, color, marker in series:
        pts = results[key]
        meas = [(L, pts[str(L)]) for L in lengths if pts.get(str(L), {}).get("status") == "ok"]
        part = [(L, r) for L, r in meas if r.get("mode") == "one-layer"]
        pred = [(L, pts[str(L)]) for L in lengths if pts.get(str(L), {}).get("mode") == "skip"
                and math.isfinite(pts[str(L)].get("predicted_us_per_token", float("nan")))]
        for ax, y in ((ax1, lambda r: r["us_per_token"]), (ax2, lambda r: r["peak_rss_bytes"] / 2**20)):
            ax.plot([L for L, _ in meas], [y(r) for _, r in meas], color=color, marker=marker, label=label)
            if part:
                ax.plot([L for L, _ in part], [y(r) for _, r in part], color=color, marker=marker,
                        markerfacecolor="white", linestyle="none",
                        label=f"Transformer: {layers} layers over budget, layer 1 measured"
                              + (f", time x{layers}" if ax is ax1 else ""))
        if pred and meas:
            last = meas[-1]
            ax1.plot([last[0]] + [L for L, _ in pred],
                     [last[1]["us_per_token"]] + [r["predicted_us_per_token"] for _, r in pred],
                     color=color, linestyle=":", marker="x", label="Transformer: not run, predicted")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(lengths))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1024:g}K" if v >= 1024 else f"{v:g}"))
        ax.xaxis.set_minor_locator(FixedLocator([]))
        ax.set_xlabel("sequence length (tokens, one sequence)")
        ax.grid(True, which="major", alpha=0.3)
    ax1.set_yscale("log")
    ax1.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax1.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax1.yaxis.set_minor_formatter(NullFormatter())
    ax1.set_ylabel("microseconds per token (log scale)")
    ax1.set_title("Time per token (forward pass / length)")
    ax2.set_ylabel("peak RSS of the whole process (MiB)")
    ax2.set_ylim(bottom=0, top=ax2.get_ylim()[1] * 1.35)
    ax2.set_title("Peak memory")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"One sequence, {results['preset']} shape (D {results['hidden']}, {layers} layers, "
                 f"{results['heads']} heads, FFN {results['intermediate']}), float32, "
                 f"{results['threads']} threads, {results['cpu']['model_name']}, {results['date'][:10]}",
                 fontsize=9)
    fig.tight_layout()
    Path(out_png).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, format="png")
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--bench", help="fastformer-bench to run (default BUILD_DIR/bin/fastformer-bench)")
    ap.add_argument("--torch-python", default=sys.executable,
                    help="the Python whose PyTorch runs the Transformer (default: this one)")
    ap.add_argument("--preset", default="base-long")
    ap.add_argument("--models-dir", default="models")
    ap.add_argument("--lengths", default=DEFAULT_LENGTHS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", type=float, default=200, help="seconds one Transformer run may take")
    ap.add_argument("--memory-limit-gib", type=float, default=16)
    ap.add_argument("--json-out", default="docs/images/paper-claim-cpu.json")
    ap.add_argument("--plot", default="docs/images/paper-claim-cpu.png")
    ap.add_argument("--replot", metavar="JSON", help="only redraw the plot and table from a results file")
    # worker mode
    ap.add_argument("--worker", choices=["transformer"], help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--one-layer", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)

    if a.worker:
        print(json.dumps(worker_transformer(a)))
        return 0

    if a.replot:
        results = json.load(open(a.replot))
    else:
        results = measure(a)
        Path(a.json_out).parent.mkdir(parents=True, exist_ok=True)
        with open(a.json_out, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {a.json_out}", file=sys.stderr)
    try:
        plot(results, a.plot)
        print(f"wrote {a.plot}", file=sys.stderr)
    except ImportError as e:
        print(f"bench_paper_claim: no plot, matplotlib is needed ({e}); Debian: apt-get install "
              "python3-matplotlib", file=sys.stderr)
    c = results["cpu"]
    print(f"{results['date']}: {c['model_name']} (family {c['family']}, model {c['model']}; "
          f"{' '.join(c['flags'])}), {c['cores']} cores, {c['kernel']}; load average "
          f"{results['load_before']} before, {results['load_after']} after; {results['total_seconds']:.0f} s")
    print(f"engine: {results['engine_device']}; Transformer: PyTorch {results['torch_version']}, "
          f"attention {results['attention']}, {results['threads']} threads\n")
    print(table(results))
    return 0


def measure(a) -> dict:
    t_start = time.monotonic()
    bench = Path(a.bench) if a.bench else REPO / a.build_dir / "bin" / "fastformer-bench"
    if not bench.exists():
        raise SystemExit(f"bench_paper_claim: {bench} not found (make build)")
    lengths = [int(x) for x in a.lengths.split(",")]
    model_dir = ensure_model(Path(a.models_dir), a.preset)
    cfg = json.load(open(model_dir / "config.json"))
    too_long = [L for L in lengths if L > cfg["max_position_embeddings"]]
    if too_long:
        raise SystemExit(f"bench_paper_claim: {too_long} longer than the preset's positions")
    mem_limit = int(a.memory_limit_gib * 2**30)
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_info(), "load_before": " ".join(open("/proc/loadavg").read().split()[:3]),
        "preset": a.preset, "hidden": cfg["hidden_size"], "layers": cfg["num_hidden_layers"],
        "heads": cfg["num_attention_heads"], "intermediate": cfg["intermediate_size"],
        "threads": a.threads, "lengths": lengths, "budget_seconds": a.budget,
        "memory_limit_bytes": mem_limit, "bench": str(bench), "torch_python": a.torch_python,
        "ours": {}, "transformer": {},
    }
    for L in lengths:
        results["ours"][str(L)] = with_retry(lambda: run_ours(bench, model_dir, L, a.threads, 600, mem_limit))
    history, sdpa = [], None
    for L in lengths:
        failed = [r for r in results["transformer"].values() if r.get("mode") != "skip" and r["status"] != "ok"]
        if failed:  # a shorter length timed out, hit the memory limit or failed: this one would too
            results["transformer"][str(L)] = {
                "model": "transformer", "length": L, "mode": "skip",
                "status": f"not run: {failed[0]['length']:,} tokens already {failed[0]['status']}"}
            continue
        if sdpa is False:  # math attention: its L x L scores must fit
            need = math_attention_bytes(L, cfg["num_attention_heads"])
            if need > mem_limit:
                pred = fit_layer_time(history, L)
                results["transformer"][str(L)] = {
                    "model": "transformer", "length": L, "mode": "skip",
                    "predicted_us_per_token": (pred or float("nan")) * cfg["num_hidden_layers"] / L * 1e6,
                    "status": f"not run: math attention's scores need at least {need / 2**30:,.0f} GiB "
                              f"(limit {a.memory_limit_gib:g} GiB)"}
                continue
        r = with_retry(lambda: run_transformer(a.torch_python, model_dir, cfg, L, a.threads, a.budget, mem_limit,
                                               history))
        results["transformer"][str(L)] = r
        if r.get("status") == "ok":
            sdpa = r["attention"].startswith("sdpa")
            layer_s = r["layer_seconds"] if r["mode"] == "one-layer" else r["seconds"] / cfg["num_hidden_layers"]
            history.append((L, layer_s))
    ok_t = [r for r in results["transformer"].values() if r.get("status") == "ok"]
    ok_o = [r for r in results["ours"].values() if r.get("status") == "ok"]
    results["torch_version"] = ok_t[0]["torch_version"] if ok_t else "?"
    results["attention"] = ok_t[0]["attention"] if ok_t else "?"
    results["engine_device"] = ok_o[0]["device"] if ok_o else "?"
    results["load_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
    results["total_seconds"] = time.monotonic() - t_start
    return results


if __name__ == "__main__":
    sys.exit(main())

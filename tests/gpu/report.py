#!/usr/bin/env python3
"""Writes the markdown report of tests/gpu/gpu-check.sh from its run directory.

    report.py --run DIR --out REPORT.md [--summary SUMMARY.txt]
    report.py --verdict ctest|gtest|sanitizer|ncu OUTPUT_FILE... --gpu 0|1

DIR holds what gpu-check.sh left: meta.env (key=value), stages.tsv (id, title,
status, rc, seconds, note, limit, at: the limit it ran under and when it started, in
seconds into the run; a later record of an ID replaces the earlier one),
benches.tsv (id|engine|model|dtype|lengths|batch_tokens|role), cublaslt.env and the
dirs searched for it, nvcc.env and nvcc-candidates.txt, driver.env, env.txt,
gpu-query.csv, ncu.csv, and per stage ID.out (stdout; the benchmarks print one JSON
object) and ID.err.

--verdict reads a stage's output and prints `keep` (its exit status says it all), or
`failed<TAB>why` or `skipped<TAB>why`: with a GPU present (--gpu 1) a skipped GPU test is
a failure, since ctest and GoogleTest both count it as passed; compute-sanitizer or ncu
refused by the machine's runtime is a skip. Standard library only: it runs under any python3.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys

# The targets of issues 4 and 13.
TARGET_TOKENS_PER_S = 2.5e6
TARGET_VS_PYTORCH = 3.0
TARGET_VS_SDPA_8192 = 2.0
TARGET_LONG_VS_SHORT = 0.8
TARGET_COPY_FRACTION = 0.70
# A non-GEMM kernel counts for the 70% target when one launch moves at least this much
# (smaller ones are latency-bound: per-sequence partial combines and the like).
SIGNIFICANT_BYTES_PER_LAUNCH = 32e6
GEMM_RE = re.compile(r"gemm|xmma|nvjet|cutlass|cublas|splitk|wgmma|sm\d\d_|ampere_|hopper_", re.I)
# --profile ops that are host transfers or batch set-up, not kernels: PCIe, not DRAM, bounds them.
TRANSFER_RE = re.compile(r"download|upload|begin_batch|memcpy|h2d|d2h", re.I)


def read_text(path, default=""):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def tail(path, n=25):
    lines = read_text(path).splitlines()
    return lines[-n:]


def last_json(path):
    """The last line of the file that parses as a JSON object, or None."""
    for line in reversed(read_text(path).splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                v = json.loads(line)
            except ValueError:
                continue
            if isinstance(v, dict):
                return v
    return None


def load_meta(run):
    meta = {}
    for line in read_text(os.path.join(run, "meta.env")).splitlines():
        k, sep, v = line.partition("=")
        if sep:
            meta[k.strip()] = v.strip()
    return meta


def load_stages(run):
    """The stages in the order they first appear; a later record of an ID (the verdict
    gpu-check.sh read from the stage's output) replaces the earlier one."""
    stages = {}
    for line in read_text(os.path.join(run, "stages.tsv")).splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) < 8:
            parts += [""] * (8 - len(parts))
        sid, title, status, rc, seconds, note, limit, at = parts[:8]
        stages[sid] = {"id": sid, "title": title, "status": status, "rc": rc,
                       "seconds": seconds, "note": note, "limit": limit, "at": at}
    return list(stages.values())


def load_env(path):
    env = {}
    for line in read_text(path).splitlines():
        k, sep, v = line.partition("=")
        if sep:
            env[k.strip()] = v.strip()
    return env


def load_benches(run):
    benches = []
    for line in read_text(os.path.join(run, "benches.tsv")).splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7:
            continue
        b = dict(zip(("id", "engine", "model", "dtype", "lengths", "batch_tokens", "role"), parts))
        b["result"] = last_json(os.path.join(run, b["id"] + ".out"))
        benches.append(b)
    return benches


# ----------------------------------------------------------------------------- formatting


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fmt_rate(v):
    if not num(v):
        return "—"
    if v >= 1e6:
        return f"{v / 1e6:.2f} M"
    if v >= 1e3:
        return f"{v / 1e3:.1f} k"
    return f"{v:.1f}"


def fmt_ms(v):
    return f"{v:.2f}" if num(v) else "—"


def fmt_bytes(v):
    if not num(v):
        return "—"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if v >= scale:
            return f"{v / scale:.1f} {unit}"
    return f"{v:.0f} B"


def fmt_bw(v):
    return f"{v / 1e12:.2f} TB/s" if num(v) and v >= 1e11 else (f"{v / 1e9:.2f} GB/s" if num(v) else "—")


def ratio(a, b):
    return a / b if num(a) and num(b) and b > 0 else None


def md_escape(s):
    return str(s).replace("|", "\\|").replace("\n", " ")


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    for r in rows:
        out.append("| " + " | ".join(md_escape(c) for c in r) + " |")
    return out


# ----------------------------------------------------------------------------- parsers


def parse_ctest(text):
    """{'passed', 'failed', 'skipped', 'total'} from ctest's summary (CMake 3 or 4); 'none' when no test
    matched; None when there is no summary. ctest's "N% tests passed" counts a skipped test
    (GTEST_SKIP, listed as "(Skipped)") as not failed: here 'passed' excludes the skipped ones."""
    if re.search(r"No tests were found", text):
        return "none"
    # CMake 3.x: "100% tests passed, 0 tests failed out of 9"; CMake 4.x leaves out a nought:
    # "100% tests passed out of 9" (and "67% tests passed, 1 tests failed out of 3").
    m = re.search(r"(\d+)% tests passed(?:, (\d+) tests? failed)? out of (\d+)", text)
    if not m:
        return None
    failed, total = int(m.group(2) or 0), int(m.group(3))
    # CMake 4 may follow a listed test with its labels ("3 - A.Fails (Failed)   gpu").
    skipped = len(re.findall(r"^\s*\d+ - .*\(Skipped\)(?:\s+[\w;, -]*)?$", text, re.M))
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped, "total": total}


def parse_gtest(text):
    """{'total', 'passed', 'failed', 'skipped'} from a GoogleTest binary's summary, or None."""
    m = re.search(r"^\[==========\]\s+(\d+)\s+tests? from .* ran", text, re.M)
    if not m:
        return None
    out = {"total": int(m.group(1)), "passed": 0, "failed": 0, "skipped": 0}
    for key, label in (("passed", "PASSED"), ("failed", "FAILED"), ("skipped", "SKIPPED")):
        m = re.search(r"^\[\s*" + label + r"\s*\]\s+(\d+)\s+tests?[,.]", text, re.M)
        if m:
            out[key] = int(m.group(1))
    return out


def skip_reasons(text):
    """The messages of GoogleTest's skips ("FILE:LINE: Skipped" then the message), in order,
    each once; also in `ctest -V` output, whose lines carry a "N: " prefix."""
    reasons = []
    lines = [re.sub(r"^\d+: ", "", ln) for ln in text.splitlines()]
    for i, ln in enumerate(lines):
        if re.search(r":\d+: Skipped\s*$", ln) and i + 1 < len(lines):
            msg = lines[i + 1].strip()
            if msg and not msg.startswith("[") and msg not in reasons:
                reasons.append(msg)
    return reasons


# How compute-sanitizer and ncu say that this machine will not let them run (no access to
# the performance counters, no debugger interface in the container, an unsupported device).
REFUSED_RE = re.compile(r"ERR_NVGPUCTRPERM|not supported|permission|privilege|"
                        r"unable to (find|load|launch|initialize|open|create)|"
                        r"failed to (initialize|create|attach|load|launch)|"
                        r"terminated before first instrumented|not allowed", re.I)


def refusal(text):
    """The first line where a tool says it cannot run here, or None."""
    for line in text.splitlines():
        if REFUSED_RE.search(line):
            return line.strip()[:200]
    return None


def stage_verdict(kind, text, gpu):
    """What the output of a stage says beyond its exit status: (None, '') to keep the status,
    ('failed', why) or ('skipped', why).
    ctest (`ctest -V`) and gtest (a GoogleTest binary): with a GPU present a skipped test
    fails the stage, as it ran nothing on the GPU; so do failed tests and a missing summary.
    sanitizer and ncu: a tool that checked or profiled nothing and says that this machine
    refuses it is skipped, with its words as the reason."""
    if kind in ("sanitizer", "ncu"):
        ran = ("SUMMARY:" in text if kind == "sanitizer"
               else "==PROF== Profiling" in text or '"Kernel Name"' in text)
        why = None if ran else refusal(text)
        return ("skipped", "refused by this machine's runtime: " + why) if why else (None, "")
    if kind == "ctest":
        r = parse_ctest(text)
        if r == "none":
            return "failed", "no test carries the label gpu"
        what = "gpu tests"
    else:
        r = parse_gtest(text)
        if r is not None and r["total"] == 0:
            return "failed", "no test matched the filter"
        what = "tests"
    if r is None:
        return "failed", "no test summary in the output (crashed?)"
    reasons = skip_reasons(text)
    if r["skipped"] and gpu:
        every = " (every one)" if r["skipped"] == r["total"] else ""
        return "failed", (f"{r['skipped']} of {r['total']} {what} skipped with a GPU present{every}: "
                          + ("; ".join(reasons) if reasons else "no reason printed"))
    if r["failed"]:
        return "failed", f"{r['failed']} of {r['total']} {what} failed"
    return None, ""


def parse_sanitizer(text):
    """Summary of a compute-sanitizer run over a GoogleTest binary."""
    out = {}
    m = re.search(r"ERROR SUMMARY:\s*(\d+)\s+error", text)
    if m:
        out["errors"] = int(m.group(1))
    m = re.search(r"RACECHECK SUMMARY:\s*(\d+)\s+hazards? displayed\s*\((\d+)\s+errors?,\s*(\d+)\s+warnings?\)", text)
    if m:
        out["hazards"], out["errors"], out["warnings"] = int(m.group(1)), int(m.group(2)), int(m.group(3))
    m = re.search(r"\[==========\]\s+(\d+)\s+tests? from .* ran", text)
    if m:
        out["tests"] = int(m.group(1))
    m = re.search(r"\[  PASSED  \]\s+(\d+)\s+test", text)
    if m:
        out["passed"] = int(m.group(1))
    m = re.search(r"\[  FAILED  \]\s+(\d+)\s+test", text)
    if m:
        out["failed"] = int(m.group(1))
    m = re.search(r"\[  SKIPPED \]\s+(\d+)\s+test", text)
    if m:
        out["skipped"] = int(m.group(1))
    return out


TIME_UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
              "second": 1.0, "s": 1.0, "cycle": None}
BYTE_UNITS = {"byte": 1.0, "b": 1.0, "kbyte": 1e3, "kb": 1e3, "mbyte": 1e6, "mb": 1e6, "gbyte": 1e9,
              "gb": 1e9, "tbyte": 1e12, "tb": 1e12, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30}


def parse_number(s):
    s = s.strip().strip('"')
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    elif re.fullmatch(r"-?\d+,\d+", s):
        s = s.replace(",", ".")
    try:
        return float(s)
    except ValueError:
        return None


def metric_value(name, unit, value):
    v = parse_number(value)
    if v is None:
        return None
    u = (unit or "").strip().lower()
    if name.startswith("gpu__time_duration"):
        scale = TIME_UNITS.get(u, 1e-9 if u == "" else None)
    else:
        scale = BYTE_UNITS.get(u, 1.0 if u == "" else None)
    return None if scale is None else v * scale


def parse_ncu(text):
    """Per-launch {name, time_s, bytes} from ncu --csv (long 'details' or wide 'raw' form)."""
    rows = list(csv.reader([ln for ln in text.splitlines() if ln.startswith('"')]))
    launches = {}
    i = 0
    while i < len(rows):
        hdr = rows[i]
        if "Kernel Name" not in hdr:
            i += 1
            continue
        col = {h: k for k, h in enumerate(hdr)}
        i += 1
        if "Metric Name" in col:  # long: one row per (launch, metric)
            while i < len(rows) and "Kernel Name" not in rows[i]:
                r = rows[i]
                i += 1
                if len(r) < len(hdr):
                    continue
                key = (r[col["ID"]] if "ID" in col else str(i), r[col.get("Process ID", 0)])
                d = launches.setdefault(key, {"name": r[col["Kernel Name"]], "m": {}})
                v = metric_value(r[col["Metric Name"]], r[col["Metric Unit"]], r[col["Metric Value"]])
                if v is not None:
                    d["m"][r[col["Metric Name"]]] = v
        else:  # wide: metric columns, then a row of units
            units = {}
            if i < len(rows) and (not rows[i][col.get("ID", 0)].strip().isdigit()):
                units = {h: rows[i][k] for h, k in col.items() if k < len(rows[i])}
                i += 1
            while i < len(rows) and "Kernel Name" not in rows[i]:
                r = rows[i]
                i += 1
                if len(r) < len(hdr):
                    continue
                key = (r[col["ID"]] if "ID" in col else str(i), r[col.get("Process ID", 0)])
                d = launches.setdefault(key, {"name": r[col["Kernel Name"]], "m": {}})
                for h, k in col.items():
                    if h.startswith(("gpu__time_duration", "dram__bytes")):
                        v = metric_value(h, units.get(h, ""), r[k])
                        if v is not None:
                            d["m"][h] = v
    out = []
    for d in launches.values():
        m = d["m"]
        t = m.get("gpu__time_duration.sum")
        b = (m.get("dram__bytes_read.sum") or 0.0) + (m.get("dram__bytes_write.sum") or 0.0)
        if t and t > 0:
            out.append({"name": d["name"], "time_s": t, "bytes": b})
    return out


def kernel_table(launches, copy_bw):
    agg = {}
    for l in launches:
        a = agg.setdefault(l["name"], {"name": l["name"], "launches": 0, "time_s": 0.0, "bytes": 0.0})
        a["launches"] += 1
        a["time_s"] += l["time_s"]
        a["bytes"] += l["bytes"]
    rows = sorted(agg.values(), key=lambda a: -a["time_s"])
    for a in rows:
        a["gemm"] = bool(GEMM_RE.search(a["name"]))
        a["bw"] = a["bytes"] / a["time_s"] if a["time_s"] > 0 else None
        a["fraction"] = ratio(a["bw"], copy_bw)
        a["significant"] = (not a["gemm"]) and a["bytes"] / a["launches"] >= SIGNIFICANT_BYTES_PER_LAUNCH
    return rows


def cublaslt_line(c):
    """One line: which cuBLASLt the check used, or that it found none."""
    if not c:
        return "not looked for"
    head = (f"header {c['include_dir']} ({c.get('include_version') or 'version unknown'}, {c.get('include_from')})"
            if c.get("include_dir") else "header **not found**")
    lib = (f"library {c.get('library_file') or c['library']} ({c.get('library_version') or 'version not read'}, "
           f"{c.get('library_from')})" if c.get("library") else "library **not found**")
    return head + "; " + lib


def nvcc_line(n, run):
    """One line: which nvcc the check used (path, version, where from), or where it looked."""
    if not n:
        return "not looked for"
    if n.get("path"):
        return (f"{n['path']} ({n.get('version') or 'version not read'}"
                + (f", {n['from']}" if n.get("from") else "") + ")")
    looked = [ln.split("\t")[0] for ln in read_text(os.path.join(run, "nvcc-candidates.txt")).splitlines()
              if ln.strip()]
    return "**not found**" + (f" (looked at {len(looked)} paths: " + ", ".join(looked[:8])
                              + (", ..." if len(looked) > 8 else "") + ")" if looked else "")


def driver_line(d, gpu_why=""):
    """One line: the NVIDIA driver the GPU stages ran on, or why there was none."""
    if d.get("version"):
        return (f"{d['version']} ({d.get('from') or 'nvidia-smi'}"
                + (f"; supports CUDA {d['cuda']}" if d.get("cuda") else "") + ")")
    return "**not found**" + (f" ({d.get('why') or gpu_why})" if (d.get("why") or gpu_why) else "")


def seconds_of(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def cublaslt_section(c, run):
    out = []
    if not c:
        return ["Not looked for (no cublaslt.env in the run directory)."]
    if c.get("include_dir"):
        out.append(f"- header: `{c['include_dir']}/cublasLt.h`, cuBLAS {c.get('include_version') or '(version unknown)'}"
                   f", from the {c.get('include_from')}: the build's FASTFORMER_CUBLASLT_INCLUDE_DIR")
    else:
        out.append("- header: cublasLt.h **not found**: the CUDA engine could not be built")
    if c.get("library"):
        out.append(f"- library: `{c['library']}`" + (f" (the file `{c['library_file']}`)"
                                                    if c.get("library_file") not in ("", c["library"]) else "")
                   + f", version {c.get('library_version') or '(not read)'}, from the {c.get('library_from')}: "
                   "given to our binaries as FASTFORMER_CUBLASLT_LIBRARY, which the engine opens alone")
    else:
        out.append("- library: libcublasLt **not found**: the engine falls back to the loader's search "
                   "(libcublasLt.so.<major>, LD_LIBRARY_PATH and the ldconfig cache)")
    if not (c.get("include_dir") and c.get("library")):
        for what, name in (("cublasLt.h", "cublaslt-include-dirs.txt"), ("libcublasLt", "cublaslt-library-dirs.txt")):
            dirs = [d for d in read_text(os.path.join(run, name)).splitlines() if d.strip()]
            out.append(f"- looked for {what} in: " + (", ".join(f"`{d}`" for d in dirs) if dirs else "(no directory)"))
    return out


def cost_model_estimate(bench):
    """tools/cost_model.py's expected ms per op and tokens/s for a benchmark of base-long
    bf16 in one of its two shapes (65,536-token batches of 512-token sequences, or one
    65,536-token sequence): ({op: ms}, tokens/s), else ({}, None)."""
    shapes = {("fixed:512", "65536"): 0, ("fixed:65536", "65536"): 1}
    if not bench or (bench["model"], bench["dtype"]) != ("base-long", "bfloat16") \
            or (bench["lengths"], bench["batch_tokens"]) not in shapes:
        return {}, None
    try:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "tools"))
        import cost_model
        _, sequences, tokens = cost_model.SHAPES[shapes[(bench["lengths"], bench["batch_tokens"])]]
        rows = cost_model.model(sequences, tokens)
        return ({r["op"]: r["expected_ms"] for r in rows},
                cost_model.summary(rows, tokens)["expected_tokens_per_s"])
    except Exception:  # an older tree, or a changed model: the report goes on without it
        return {}, None


def profile_ops(rows, copy_bw):
    """fastformer-bench --profile rows (one per op and layer: name, layer, calls, ms, bytes,
    flops, ...) summed per op name, slowest first, each with its achieved bandwidth, that
    bandwidth's fraction of copy bandwidth, and its kind: GEMM, transfer (host copies and
    batch set-up), or a kernel that 'counts' for the 70% target (moving at least
    SIGNIFICANT_BYTES_PER_LAUNCH per launch) or is too 'small' to (latency-bound)."""
    agg = {}
    for r in rows or []:
        if not isinstance(r, dict) or not num(r.get("ms")):
            continue
        name = str(r.get("name", "?"))
        a = agg.setdefault(name, {"name": name, "rows": 0, "calls": 0.0, "ms": 0.0, "bytes": 0.0,
                                  "flops": 0.0, "share": 0.0})
        a["rows"] += 1
        a["calls"] += r["calls"] if num(r.get("calls")) and r["calls"] > 0 else 1
        a["ms"] += r["ms"]
        for k in ("bytes", "flops", "share"):
            a[k] += r[k] if num(r.get(k)) else 0.0
    ops = sorted(agg.values(), key=lambda a: -a["ms"])
    for a in ops:
        seconds = a["ms"] / 1e3
        a["bw"] = a["bytes"] / seconds if seconds > 0 else None
        a["tflops"] = a["flops"] / seconds / 1e12 if seconds > 0 else None
        a["fraction"] = ratio(a["bw"], copy_bw)
        if GEMM_RE.search(a["name"]):
            a["kind"] = "GEMM"
        elif TRANSFER_RE.search(a["name"]):
            a["kind"] = "transfer"
        else:
            a["kind"] = "counts" if a["bytes"] / a["calls"] >= SIGNIFICANT_BYTES_PER_LAUNCH else "small"
    return ops


# ----------------------------------------------------------------------------- the run

# The --profile benchmarks by role, and the shape each one measures.
PROFILE_SHAPES = (("profile-short", "512-token sequences"), ("profile-long", "one 65,536-token sequence"))


class CheckRun:
    """What gpu-check.sh left in its run directory, read once, and the judgements that the
    report's sections share: a benchmark's throughput by role, its status or why it is
    missing, and a target's verdict in this run's mode."""

    def __init__(self, run):
        self.run = run
        self.meta = load_meta(run)
        self.stages = load_stages(run)
        self.by_id = {s["id"]: s for s in self.stages}
        self.failed = [s for s in self.stages if s["status"] in ("failed", "timeout")]
        self.counts = {}
        for s in self.stages:
            self.counts[s["status"]] = self.counts.get(s["status"], 0) + 1
        self.benches = load_benches(run)
        self.by_role = {}
        for b in self.benches:
            self.by_role.setdefault(b["role"], b)
        self.mode = self.meta.get("mode", "?")
        self.measured = self.mode == "gpu"
        self.ncu_workload = self.meta.get("ncu_workload") or "official bf16 fixed:512 @65536"
        self.copy = last_json(self.path("copy-bandwidth.out"))
        self.copy_bw = self.copy.get("bandwidth_bytes_per_second") if self.copy else None
        self.launches = parse_ncu(read_text(self.path("ncu.csv")))
        self.kernels = kernel_table(self.launches, self.copy_bw) if self.launches else []
        self.profiles = {}  # role: (shape, bench, ops summed per name, or None without a profile array)
        for role, shape in PROFILE_SHAPES:
            b = self.by_role.get(role)
            r = b and b["result"]
            rows = r.get("profile") if r else None
            self.profiles[role] = (shape, b, profile_ops(rows, self.copy_bw) if isinstance(rows, list) else None)
        self.ctest = parse_ctest(read_text(self.path("ctest-gpu.out")))
        self.parity = parse_gtest(read_text(self.path("parity-base-long.out")))
        self.cublaslt = load_env(self.path("cublaslt.env"))
        self.nvcc = load_env(self.path("nvcc.env"))
        self.driver = load_env(self.path("driver.env"))
        q = read_text(self.path("gpu-query.csv")).splitlines()
        self.gpu_name = q[1].split(",")[0].strip() if len(q) >= 2 else ""

    def path(self, name):
        return os.path.join(self.run, name)

    def tps(self, role):
        b = self.by_role.get(role)
        r = b and b["result"]
        return r.get("tokens_per_second") if r else None

    def bench_status(self, b):
        r = b["result"]
        if r and r.get("tokens_per_second") is not None:
            return "ok"
        if r and r.get("compile_error"):
            return "torch.compile failed: " + r["compile_error"][:160]
        s = self.by_id.get(b["id"])
        if not s:
            return "not run"
        if s["status"] == "ok":
            return "ok, but no JSON result"
        why = s["status"] + (": " + s["note"] if s["note"] else "")
        last = [ln.strip() for ln in tail(self.path(b["id"] + ".err"), 5) if ln.strip()]
        return why + (" — " + last[-1][:160] if last and s["status"] != "skipped" else "")

    def why_missing(self, role):
        b = self.by_role.get(role)
        return self.bench_status(b) if b else "not run"

    def why_ratio_missing(self, first, second):
        """Why a ratio of two roles' throughputs is missing: the first role's reason when it
        has no figure, else the second's."""
        return self.why_missing(first) if self.tps(first) is None else self.why_missing(second)

    def verdict(self, value, ok, missing):
        if value is None:
            return "not measured: " + missing
        if not self.measured:
            return f"not a GPU figure ({self.mode})"
        return "PASS" if ok else "FAIL"

    def with_model(self, v, role):
        """The measured rate, and the cost model's beside it."""
        _, expected = cost_model_estimate(self.by_role.get(role))
        return (fmt_rate(v) + " tokens/s" if v else "—") + (
            f" (cost model {fmt_rate(expected)})" if expected else "")


# ----------------------------------------------------------------------------- the targets


def throughput_targets(c):
    """The throughput targets: base-long bf16 on both shapes, long ÷ short, and the ratios to
    PyTorch eager and to the SDPA encoder."""
    rows = []
    for label, role in (("base-long bf16, 512-token sequences, 65,536-token batches", "short"),
                        ("base-long bf16, one 65,536-token sequence", "long")):
        v = c.tps(role)
        rows.append([label, "≥ 2.5 M tokens/s", c.with_model(v, role),
                     c.verdict(v, num(v) and v >= TARGET_TOKENS_PER_S, c.why_missing(role))])
    v = ratio(c.tps("long"), c.tps("short"))
    rows.append(["per-token speed, one 65,536-token sequence ÷ 512-token sequences", "≥ 0.80",
                 f"{v:.2f}" if v else "—",
                 c.verdict(v, v is not None and v >= TARGET_LONG_VS_SHORT, c.why_ratio_missing("long", "short"))])
    v = ratio(c.tps("mix-ref"), c.tps("ref"))
    rows.append(["vs the PyTorch reference (bf16, eager, padded), base-long uniform:64:4096", "≥ 3x",
                 f"{v:.2f}x" if v else "—",
                 c.verdict(v, v is not None and v >= TARGET_VS_PYTORCH, c.why_ratio_missing("ref", "mix-ref"))])
    v = ratio(c.tps("seq8192"), c.tps("sdpa8192"))
    rows.append(["vs the SDPA BERT-size encoder at 8,192 tokens per sequence (bf16)", "≥ 2x",
                 f"{v:.2f}x" if v else "—",
                 c.verdict(v, v is not None and v >= TARGET_VS_SDPA_8192,
                           c.why_ratio_missing("sdpa8192", "seq8192"))])
    return rows


def copy_fraction_targets(c):
    """The 70%-of-copy target, from --profile on each shape and from ncu: the worst non-GEMM
    op (kernel) among those that move enough bytes per launch to count."""
    rows = []
    for role, (shape, b, ops) in c.profiles.items():
        counted = [o for o in ops or [] if o["kind"] == "counts" and o["fraction"] is not None]
        label = f"non-GEMM kernels vs copy bandwidth, --profile, base-long bf16 {shape}"
        if counted:
            w = min(counted, key=lambda o: o["fraction"])
            rows.append([f"{label} (worst op moving ≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch: "
                         f"{w['name']})", "≥ 70%", f"{100 * w['fraction']:.0f}%",
                         c.verdict(w["fraction"], w["fraction"] >= TARGET_COPY_FRACTION, "")])
        else:
            why = (c.why_missing(role) if not (b and b["result"]) else
                   "the JSON has no profile array" if ops is None else
                   "no copy bandwidth (stage copy-bandwidth)" if c.copy_bw is None else
                   f"no non-GEMM op moved ≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch")
            rows.append([label, "≥ 70%", "—", "not measured: " + why])
    significant = [k for k in c.kernels if k["significant"] and k["fraction"] is not None]
    worst = min(significant, key=lambda k: k["fraction"]) if significant else None
    if worst:
        v = worst["fraction"]
        rows.append([f"non-GEMM kernels vs device-to-device copy bandwidth, ncu, {c.ncu_workload} (worst kernel "
                     f"moving ≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch: {worst['name'][:60]})",
                     "≥ 70%", f"{100 * v:.0f}%", c.verdict(v, v >= TARGET_COPY_FRACTION, "")])
    else:
        ncu = c.by_id.get("ncu", {})
        reason = ("no ncu figures (" + (ncu.get("note") or ncu.get("status", "not run")) + ")"
                  if not c.kernels else "no copy bandwidth" if c.copy_bw is None
                  else "no non-GEMM kernel moved enough bytes")
        rows.append([f"non-GEMM kernels vs device-to-device copy bandwidth, ncu, {c.ncu_workload}", "≥ 70%", "—",
                     "not measured: " + reason])
    return rows


def parity_targets(c):
    """The parity targets: every gpu test under ctest, and the base-long-shaped parity test."""
    rows = []
    measured, mode, ctest, g = c.measured, c.mode, c.ctest, c.parity
    s = c.by_id.get("ctest-gpu")
    parity = "parity with the CPU engine, all dtypes (ctest -L gpu, base-long apart)"
    if isinstance(ctest, dict):
        got = f"{ctest['passed']}/{ctest['total']} passed" + (
            f", {ctest['skipped']} skipped" if ctest["skipped"] else "") + (
            f", {ctest['failed']} failed" if ctest["failed"] else "")
        ok = ctest["failed"] == 0 and ctest["skipped"] == 0 and ctest["total"] > 0
        rows.append([parity, "all gpu tests pass", got,
                     ("PASS" if ok else "FAIL" + (" (skipped tests: no usable GPU?)" if ctest["skipped"] else ""))
                     if measured else f"not a GPU figure ({mode})"])
    else:
        note = "no test carries the label gpu" if ctest == "none" else (
            f"{s['status']}: {s['note']}" if s else "not run")
        rows.append([parity, "all gpu tests pass", "—",
                     ("FAIL: " if measured and s and s["status"] != "skipped" else "not measured: ") + note])
    s = c.by_id.get("parity-base-long")
    parity = "base-long-shaped parity (768 hidden, 12 heads, 3,072, two layers; each dtype vs the CPU engine)"
    need = "fp32 1e-4; bf16/fp16 cosine ≥ 0.999, same argmax"
    if g and s and s["status"] != "skipped":
        got = f"{g['passed']}/{g['total']} passed" + (f", {g['skipped']} skipped" if g["skipped"] else "") + (
            f", {g['failed']} failed" if g["failed"] else "")
        ok = s["status"] == "ok" and g["total"] > 0 and g["passed"] == g["total"]
        rows.append([parity, need, got, ("PASS" if ok else "FAIL" + (f": {s['note']}" if s["note"] else ""))
                     if measured else f"not a GPU figure ({mode})"])
    else:
        note = f"{s['status']}: {s['note']}" if s else "not run"
        rows.append([parity, need, "—",
                     ("FAIL: " if measured and s and s["status"] != "skipped" else "not measured: ") + note])
    return rows


def target_rows(c):
    """The Targets table's rows (target, required, measured, result), also in the summary."""
    return throughput_targets(c) + copy_fraction_targets(c) + parity_targets(c)


# ----------------------------------------------------------------------------- the sections


def header_section(c, t_rows):
    """The title, the run's header (when, mode, the tools it used, its time) and the Targets."""
    meta, mode, stages = c.meta, c.mode, c.stages
    lines = []
    lines.append("# GPU check report (CUDA engine: issues 4 and 13)")
    lines.append("")
    lines.append(f"- when: {meta.get('started', '?')} to {meta.get('finished', '?')} "
                 f"({meta.get('elapsed_s', '?')} s of a {meta.get('budget_s', '?')} s budget)")
    lines.append(f"- mode: **{mode}**" + (f" ({meta['gpu_why']})" if meta.get("gpu_why") else "")
                 + (f", GPU: {c.gpu_name}" if c.gpu_name else ""))
    lines.append("- stages: " + ", ".join(f"{n} {k}" for k, n in sorted(c.counts.items())))
    lines.append(f"- benchmarks: --seconds {meta.get('bench_seconds', '?')} each, seed 1, "
                 f"CMAKE_CUDA_ARCHITECTURES={meta.get('cuda_arch', '?')}")
    lines.append("- nvcc: " + nvcc_line(c.nvcc, c.run))
    lines.append("- cuBLASLt: " + cublaslt_line(c.cublaslt))
    lines.append("- driver: " + driver_line(c.driver, meta.get("gpu_why", "")))
    # The stages that ran one after the other: cuBLASLt's search is part of the probes, and
    # the models are made in the background during the build.
    timed = [seconds_of(s["seconds"]) for s in stages
             if s["id"] != "cublaslt" and not s["id"].startswith("model")]
    lines.append(f"- time: {meta.get('elapsed_s', '?')} s in all, {sum(t for t in timed if t):.0f} s of it in "
                 "the stages run one after the other (every stage's wall time, start and limit: Stages "
                 "below; the models are made in the background, during the build)")
    if meta.get("stopped") == "1":
        lines.append(f"- **stopped after stage {meta.get('stop_after')}** (GPU_CHECK_STOP_AFTER): "
                     "the later stages did not run")
    if mode == "cpu-smoke":
        lines.append("")
        lines.append("> **CPU smoke run, no GPU.** The figures below come from the CPU engine, PyTorch on "
                     "the CPU and the tiny model: they test gpu-check.sh and this report, they are not "
                     "measurements of anything the targets are about.")
    elif mode == "no-gpu":
        lines.append("")
        lines.append("> **No GPU on this machine**: every GPU stage was skipped (reasons below).")
    lines.append("")
    lines.append("## Targets")
    lines.append("")
    lines += table(["target", "required", "measured", "result"], t_rows)
    lines.append("")
    return lines


def engine_section(c):
    """fastformer-bench's figures, one row per benchmark of this engine."""
    lines = ["## fastformer-bench (this engine)", ""]
    rows = []
    for b in c.benches:
        if not b["engine"].startswith("ours"):
            continue
        r = b["result"] or {}
        lengths = b["lengths"] + (" --profile" if b["engine"] == "ours-profile" else "")
        rows.append([b["model"], b["dtype"], lengths, b["batch_tokens"],
                     fmt_rate(r.get("tokens_per_second")), fmt_rate(r.get("sequences_per_second")),
                     fmt_ms(r.get("batch_latency_p50_ms")), fmt_ms(r.get("batch_latency_p99_ms")),
                     r.get("batches", "—"), r.get("backend", "—"), c.bench_status(b)])
    lines += table(["model", "dtype", "lengths", "batch tokens", "tokens/s", "seq/s", "p50 ms", "p99 ms",
                    "batches", "backend", "status"], rows)
    lines.append("")
    return lines


def baselines_section(c):
    """The PyTorch reference (eager, torch.compile) and SDPA encoder figures."""
    lines = ["## Baselines (PyTorch reference, SDPA encoder)", ""]
    rows = []
    for b in c.benches:
        if b["engine"].startswith("ours"):
            continue
        r = b["result"] or {}
        extra = []
        if r.get("padded_tokens") and r.get("tokens"):
            extra.append(f"padding {r['padded_tokens'] / r['tokens']:.2f}x")
        if num(r.get("compile_seconds")):
            extra.append(f"compile {r['compile_seconds']:.0f} s")
        if num(r.get("tflops")):
            extra.append(f"{r['tflops']:.0f} TFLOP/s" if r["tflops"] >= 10 else f"{r['tflops']:.3g} TFLOP/s")
        if r.get("attention") == "math":
            extra.append("math attention (no SDPA in this torch)")
        if num(r.get("peak_gpu_memory_bytes")):
            extra.append("peak " + fmt_bytes(r["peak_gpu_memory_bytes"]))
        what = {"pytorch": "PyTorch reference, eager", "pytorch-compile": "PyTorch reference, torch.compile",
                "sdpa": "SDPA encoder"}.get(b["engine"], b["engine"])
        lengths = b["lengths"] if b["engine"] != "sdpa" else f"{r.get('tokens_per_sequence', b['lengths'])} tokens/seq"
        status = c.bench_status(b)
        rows.append([what, b["model"], b["dtype"], lengths, b["batch_tokens"],
                     fmt_rate(r.get("tokens_per_second")), fmt_ms(r.get("batch_latency_p50_ms")),
                     fmt_ms(r.get("batch_latency_p99_ms")), "; ".join(extra) or "", status])
    lines += table(["baseline", "shape of", "dtype", "lengths", "batch tokens", "tokens/s", "p50 ms", "p99 ms",
                    "notes", "status"], rows)
    lines.append("")
    return lines


def ratios_section(c):
    """This engine's throughput over the baselines', and long over short."""
    lines = ["## Ratios", ""]
    r_rows = []
    for label, num_role, den_role, target in (
            ("ours ÷ PyTorch eager (base-long bf16 uniform:64:4096)", "mix-ref", "ref", "≥ 3"),
            ("ours ÷ PyTorch torch.compile (same workload)", "mix-ref", "ref-compile", ""),
            ("ours fixed:512 ÷ SDPA at 512", "short", "sdpa512", ""),
            ("ours fixed:8192 ÷ SDPA at 8192", "seq8192", "sdpa8192", "≥ 2"),
            ("one 65,536-token sequence ÷ 512-token sequences (per token)", "long", "short", "≥ 0.8")):
        v = ratio(c.tps(num_role), c.tps(den_role))
        r_rows.append([label, f"{v:.2f}" if v else "—", target,
                       "" if v else "missing: " + c.why_ratio_missing(den_role, num_role)])
    lines += table(["ratio", "value", "target", "note"], r_rows)
    lines.append("")
    return lines


def profile_section(c):
    """Where the time goes: fastformer-bench --profile's ops on each shape, beside the cost model."""
    lines = ["## Where the time goes (fastformer-bench --profile)", ""]
    for role, (shape, b, ops) in c.profiles.items():
        if not ops:
            lines.append(f"{shape}: no profile ("
                         + (c.why_missing(role) if not (b and b["result"]) else "the JSON has no profile array")
                         + ").")
            lines.append("")
            continue
        r = b["result"]
        lines.append(f"{b['model']} {b['dtype']}, {shape} ({b['lengths']} @{b['batch_tokens']}; per batch, ops "
                     f"summed over layers; 'counts' marks the ops the 70% target is judged on):")
        lines.append("")
        expected, expected_tps = cost_model_estimate(b)
        rows = []
        for o in ops:
            rows.append([o["name"], o["rows"], f"{o['ms']:.3f}",
                         f"{expected[o['name']]:.3f}" if o["name"] in expected else "—",
                         f"{100 * o['share']:.1f}%", fmt_bytes(o["bytes"]),
                         fmt_bw(o["bw"]), f"{o['tflops']:.1f}" if o["tflops"] and o["flops"] else "—",
                         f"{100 * o['fraction']:.0f}%" if o["fraction"] is not None else "—", o["kind"]])
        lines += table(["op", "rows", "ms", "cost model ms", "share", "bytes", "bandwidth", "TFLOP/s", "of copy",
                        "kind"], rows)
        total = sum(o["ms"] for o in ops)
        if total > 0 and num(r.get("tokens_per_second")):
            lines.append("")
            lines.append(f"The ops add up to {total:.2f} ms per batch; the timed run's throughput was "
                         f"{fmt_rate(r['tokens_per_second'])} tokens/s"
                         + (f"; the cost model (tools/cost_model.py, docs/kernels.md) expects "
                            f"{sum(expected.values()):.2f} ms and {fmt_rate(expected_tps)} tokens/s." if expected_tps
                            else "."))
        lines.append("")
    return lines


def bandwidth_section(c):
    """Memory bandwidth: the device-to-device copy, then ncu's per-kernel DRAM bandwidth."""
    copy, copy_bw, kernels = c.copy, c.copy_bw, c.kernels
    lines = ["## Memory bandwidth", ""]
    if copy:
        lines.append(f"Device-to-device copy of {fmt_bytes(copy.get('bytes'))} ({copy.get('device')}"
                     f"{', ' + copy['device_name'] if copy.get('device_name') else ''}): "
                     f"**{fmt_bw(copy_bw)}** counting bytes read and written "
                     f"(best copy {fmt_bw(copy.get('best_bandwidth_bytes_per_second'))}; "
                     f"{copy.get('repeats')} copies, timed with "
                     f"{'CUDA events' if copy.get('device') == 'cuda' else 'a wall clock'}). "
                     f"70% of it: {fmt_bw(copy_bw * 0.7) if copy_bw else '—'}.")
    else:
        s = c.by_id.get("copy-bandwidth", {})
        lines.append(f"Copy bandwidth not measured ({s.get('status', 'not run')}: {s.get('note', '')}).")
    lines.append("")
    if kernels:
        lines.append(f"Per kernel (ncu, our kernels, one {c.ncu_workload} batch; DRAM bytes read + "
                     f"written over GPU time, caches flushed between kernels; {len(c.launches)} launches). "
                     f"'counts' marks the non-GEMM kernels the 70% target is judged on "
                     f"(≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch).")
        lines.append("")
        rows = []
        for k in kernels[:30]:
            rows.append([k["name"][:80], k["launches"], f"{k['time_s'] * 1e3:.3f}", fmt_bytes(k["bytes"]),
                         fmt_bw(k["bw"]), f"{100 * k['fraction']:.0f}%" if k["fraction"] is not None else "—",
                         "GEMM" if k["gemm"] else ("counts" if k["significant"] else "small")])
        lines += table(["kernel", "launches", "total ms", "DRAM bytes", "bandwidth", "of copy", "kind"], rows)
        if len(kernels) > 30:
            lines.append(f"\n({len(kernels) - 30} more kernels in the logs' ncu.csv)")
    else:
        s = c.by_id.get("ncu", {})
        lines.append(f"Per-kernel bandwidth not measured (ncu: {s.get('status', 'not run')}"
                     f"{': ' + s['note'] if s.get('note') else ''}).")
    lines.append("")
    return lines


def stage_result(s):
    """A stage's status and note, for the Correctness table's stage column."""
    return f"{s.get('status', 'not run')}" + (f": {s['note']}" if s.get("note") else "")


def sanitizer_row(c, sid, label):
    """One compute-sanitizer stage's row of the Correctness table."""
    p = parse_sanitizer(read_text(c.path(sid + ".out")) + read_text(c.path(sid + ".err")))
    parts = []
    if "tests" in p:
        parts.append(f"{p['tests']} tests ran" + (" (no test matched *Small*)" if p["tests"] == 0 else ""))
    if "errors" in p:
        parts.append(f"{p['errors']} errors")
    if "hazards" in p:
        parts.append(f"{p['hazards']} hazards ({p.get('warnings', 0)} warnings)")
    if "failed" in p:
        parts.append(f"{p['failed']} tests failed")
    if p.get("skipped"):
        parts.append(f"{p['skipped']} tests skipped (the sanitizer checked nothing they would run)")
    return [label, ", ".join(parts) or "—", stage_result(c.by_id.get(sid, {}))]


def correctness_section(c):
    """Correctness on the GPU: ctest -L gpu, the base-long parity test and the sanitizers."""
    ctest, g = c.ctest, c.parity
    lines = ["## Correctness on the GPU", ""]
    c_rows = []
    s = c.by_id.get("ctest-gpu", {})
    if isinstance(ctest, dict):
        c_rows.append(["ctest -L gpu", f"{ctest['passed']} passed, {ctest['skipped']} skipped, "
                       f"{ctest['failed']} failed of {ctest['total']}", s.get("status", "")])
    else:
        c_rows.append(["ctest -L gpu", "no test carries the label gpu" if ctest == "none" else "—",
                       f"{s.get('status', 'not run')}: {s.get('note', '')}"])
    c_rows.append(["base-long parity (fastformer_gpu_tests --gtest_filter=*BaseLong*)",
                   f"{g['passed']} passed, {g['skipped']} skipped, {g['failed']} failed of {g['total']}" if g else "—",
                   stage_result(c.by_id.get("parity-base-long", {}))])
    c_rows.append(sanitizer_row(c, "memcheck", "compute-sanitizer memcheck (*Small*)"))
    c_rows.append(sanitizer_row(c, "racecheck", "compute-sanitizer racecheck (*Small*)"))
    lines += table(["check", "result", "stage"], c_rows)
    lines.append("")
    return lines


def stages_section(c):
    """Every stage in the order it ran, with its wall time, start and limit."""
    meta = c.meta
    lines = ["## Stages", ""]
    lines.append("In the order they ran: wall time, start (seconds into the run) and the limit each ran "
                 "under (its cap, or what was left of the budget). For planning the next lease.")
    lines.append("")
    lines += table(["stage", "what", "status", "seconds", "at (s)", "limit (s)", "note"],
                   [[s["id"], s["title"], s["status"], s["seconds"], s["at"], s["limit"], s["note"]]
                    for s in c.stages])
    lines.append("")
    lines.append(f"Total: {meta.get('elapsed_s', '?')} s of the {meta.get('budget_s', '?')} s budget "
                 f"(the report and the log archive come after the last stage).")
    lines.append("")
    return lines


def failures_section(c):
    """The last lines of each failed stage's output; nothing when none failed."""
    lines = []
    if c.failed:
        lines.append("## Failures (last lines of each failed stage)")
        lines.append("")
        for s in c.failed:
            lines.append(f"### {s['id']}: {s['status']} ({s['note']})")
            lines.append("")
            lines.append("```")
            err = tail(c.path(s["id"] + ".err"), 25)
            out = tail(c.path(s["id"] + ".out"), 25 if not err else 10)
            if err:
                lines.append("--- stderr")
                lines += [ln[:300] for ln in err]
            if out:
                lines.append("--- stdout")
                lines += [ln[:300] for ln in out]
            lines.append("```")
            lines.append("")
    return lines


def environment_section(c):
    """The environment the check recorded, every benchmark's raw JSON, and where the logs are."""
    lines = ["## Environment", ""]
    lines.append("```")
    lines += read_text(c.path("env.txt")).splitlines()
    lines.append("```")
    smi = read_text(c.path("nvidia-smi.out")).strip()
    if smi:
        lines.append("")
        lines.append("```")
        lines += smi.splitlines()
        lines.append("```")
    lines.append("")
    lines.append("## Raw results (one JSON object per benchmark)")
    lines.append("")
    lines.append("```")
    for b in c.benches:
        if b["result"]:
            lines.append(json.dumps(dict(b["result"], check_id=b["id"]), sort_keys=True))
    if c.copy:
        lines.append(json.dumps(dict(c.copy, check_id="copy-bandwidth"), sort_keys=True))
    lines.append("```")
    lines.append("")
    lines.append(f"Logs: {c.meta.get('run_dir', c.run)} on the machine that ran the check"
                 " (with OUT set, also gpu-check-logs.tar.gz beside this report).")
    return lines


def report_lines(c, t_rows):
    """The whole report, section by section."""
    return (header_section(c, t_rows) + engine_section(c) + baselines_section(c) + ratios_section(c)
            + profile_section(c) + ["## cuBLASLt", ""] + cublaslt_section(c.cublaslt, c.run) + [""]
            + bandwidth_section(c) + correctness_section(c) + stages_section(c) + failures_section(c)
            + environment_section(c))


def summary_lines(c, t_rows):
    """The few lines the script's output tail ends with: tools, times, targets, failed stages."""
    meta = c.meta
    sm = [f"gpu-check summary ({c.mode}{', ' + c.gpu_name if c.gpu_name else ''}): "
          + ", ".join(f"{n} {k}" for k, n in sorted(c.counts.items())),
          "  nvcc: " + nvcc_line(c.nvcc, c.run).replace("**", ""),
          "  cuBLASLt: " + cublaslt_line(c.cublaslt).replace("**", ""),
          "  driver: " + driver_line(c.driver, meta.get("gpu_why", "")).replace("**", ""),
          f"  time: {meta.get('elapsed_s', '?')} s of {meta.get('budget_s', '?')} s; per stage: "
          + ", ".join(f"{s['id']} {s['seconds']}" for s in c.stages if s["status"] != "skipped")]
    for t in t_rows:
        sm.append(f"  [{t[3][:100]}] {t[0][:90]}: {t[2]} (target {t[1]})")
    for s in c.failed:  # with the stage's last words: the output tail may be all one reads
        last = [ln.strip() for ln in tail(c.path(s["id"] + ".err"), 5)
                + tail(c.path(s["id"] + ".out"), 3) if ln.strip()]
        sm.append(f"  stage {s['id']}: {s['status']} ({s['note']})"
                  + (f" — {last[-1][:160]}" if last and s["note"].startswith(("exit", "stopped")) else ""))
    return sm


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run")
    ap.add_argument("--out")
    ap.add_argument("--summary")
    ap.add_argument("--verdict", nargs="+", metavar="KIND FILE",
                    help="ctest, gtest, sanitizer or ncu, then the stage's output files")
    ap.add_argument("--gpu", type=int, default=1, help="with --verdict: 1 when a GPU is present")
    a = ap.parse_args(argv)
    if a.verdict:
        text = "\n".join(read_text(f) for f in a.verdict[1:])
        status, why = stage_verdict(a.verdict[0], text, bool(a.gpu))
        print(f"{status}\t{why}" if status else "keep")
        return 0
    if not (a.run and a.out):
        ap.error("--run and --out are required")
    c = CheckRun(a.run)
    t_rows = target_rows(c)
    write_lines(a.out, report_lines(c, t_rows))
    if a.summary:
        write_lines(a.summary, summary_lines(c, t_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
`failed<TAB>why`, `skipped<TAB>why` or (sanitizer only) `tool-error<TAB>why`: with a GPU
present (--gpu 1) a skipped GPU test is a failure, since ctest and GoogleTest both count it
as passed; compute-sanitizer or ncu refused by the machine's runtime is a skip; a hazard or
memory error that compute-sanitizer found fails the stage, with the counts; the sanitizer's
own internal error ("Internal Sanitizer Error", "failed to handle a hardware exception") is a
tool failure, never a hazard (gpu-check.sh records it as `tool-error` and retries the stage
once as <ID>-retry with the other CUDA_MODULE_LOADING); a real hazard beside an internal error
still fails. Standard library only: it runs under any python3 (3.9 or later).

The run directory may also hold server-parity.json and server-load.json (the stages
server-parity and server-load, tests/gpu/server_stage.py): the report's "The server on the
GPU" section and three rows of its Targets.

Issue 48: cutlass.env (the CUTLASS headers the build was given, or why none: the header's build
line); ctest-gpu-opt-in and parity-base-long-opt-in (the GPU tests with FASTFORMER_CUDA_OPT_IN=all);
bench-old-new.json and bench-opt-in.json (tests/gpu/bench_ab.py's alternated runs): the sections
"Old and new in one run" (new ÷ old per shape, acceptance ≥ 1.2x, rows of the Targets too) and
"Opt-in kernels" (per opt-in: parity, tokens/s against the default's, and which kernel may become
the default: its parity passed and it is faster on every shape).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys

# How the report names a sanitizer stage whose status is tool-error (gpu-check.sh's verdict).
TOOL_ERROR_LABEL = "tool failure (sanitizer internal error)"

# The targets of issues 4 and 13.
TARGET_TOKENS_PER_S = 2.5e6
# Issue 48: the new engine over the baseline commit's, per shape (bench-old-new).
TARGET_NEW_VS_OLD = 1.2
# An opt-in kernel is "faster" when its mean over the default's is at least this on every shape:
# 1% above the run-to-run spread of one run's alternated default runs on an H200 (well under 1%).
OPT_IN_FASTER = 1.01
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
    return last_json_in(read_text(path))


def last_json_in(text):
    """The last line of `text` that parses as a JSON object, or None (bench_ab.py reads a run's
    stdout with it)."""
    for line in reversed(text.splitlines()):
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


def load_json(path):
    """A JSON object from a file (the whole file, else its last line that parses), or None."""
    text = read_text(path)
    if not text.strip():
        return None
    try:
        v = json.loads(text)
    except ValueError:
        return last_json(path)
    return v if isinstance(v, dict) else None


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
    ('failed', why), ('skipped', why) or, for a sanitizer, ('tool-error', why).
    ctest (`ctest -V`) and gtest (a GoogleTest binary): with a GPU present a skipped test
    fails the stage, as it ran nothing on the GPU; so do failed tests and a missing summary.
    sanitizer and ncu: a tool that checked or profiled nothing and says that this machine
    refuses it is skipped, with its words as the reason. sanitizer: see sanitizer_verdict."""
    if kind == "sanitizer":
        return sanitizer_verdict(text)
    if kind == "ncu":
        ran = "==PROF== Profiling" in text or '"Kernel Name"' in text
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


# compute-sanitizer's own failures (on the first H200 lease, 2026-12-04, racecheck printed
# "Internal Sanitizer Error: The Sanitizer failed to handle a hardware exception." and counted it
# in its summary as "1 hazard displayed (1 error, 0 warnings)"): the tool broke, the program
# under test was not found at fault. Read on the sanitizer's own lines (the "=========" prefix)
# or a line that names the sanitizer, so that the program's output cannot pass for one.
SANITIZER_INTERNAL_RE = re.compile(r"Internal Sanitizer Error|Sanitizer (?:internal error|failed to|"
                                   r"encountered an (?:internal )?error)|failed to handle|internal error", re.I)
# The records of real findings, after the "=========" prefix: memcheck's invalid accesses and
# the hardware exceptions it attributes, leaks and allocation errors; racecheck's races
# (analysis mode: "Error: Race reported between ...", a warning when the hazard may be benign)
# and hazards (hazard mode); initcheck's and synccheck's records.
SANITIZER_FINDING_RE = re.compile(
    r"(?:Error|Warning): (?:Race reported between|Potential (?:RAW|WAR|WAW) hazard)"
    r"|Potential (?:RAW|WAR|WAW) hazard"
    r"|Invalid __\w+__ (?:read|write|atomic)|Invalid (?:PC|address space)|Misaligned (?:PC|address)"
    r"|Warp (?:Illegal|Misaligned|Out-of-range|Hardware|MMU)|Lane (?:Illegal|Misaligned|User Stack)"
    r"|Illegal (?:Instruction|Address)|Hardware Exception|Out-of-range (?:Shared|Address)"
    r"|Uninitialized __\w+__ memory read|Barrier error|Invalid arguments|Leaked [\d,]+ bytes"
    r"|Malloc/Free error|Cuda(?:Malloc|Free|Memcpy)\w* \w+ error")
# A CUDA API call that returned an error ("Program hit cudaErrorLaunchFailure (error 719) due to
# ... on CUDA API call to cudaStreamSynchronize."): after an internal error, its consequence.
SANITIZER_API_ERROR_RE = re.compile(r"Program hit \w+ \(error \d+\)")


def gtest_runs(text):
    """The tests a GoogleTest binary ran, in order: [(name, outcome)], outcome 'ok', 'failed',
    'skipped', or 'did not finish' for one that started and never ended (a crash, a sanitizer
    that stopped it)."""
    runs, ended = [], {}
    for m in re.finditer(r"^\[ *(RUN|OK|FAILED|SKIPPED) *\] ([^\s,]+)", text, re.M):
        what, name = m.group(1), m.group(2)
        if what == "RUN":
            runs.append(name)
        elif name in runs and name not in ended:
            ended[name] = {"OK": "ok", "FAILED": "failed", "SKIPPED": "skipped"}[what]
    return [(name, ended.get(name, "did not finish")) for name in runs]


def gtest_filter(text, title=""):
    """The --gtest_filter a run used: GoogleTest's own note, else the stage's title, else None."""
    m = (re.search(r"^Note: Google Test filter = (\S+)", text, re.M)
         or re.search(r"--gtest_filter=(\S+)", title or ""))
    return m.group(1).strip("'\"") if m else None


def sanitizer_analysis(text):
    """What one compute-sanitizer run over a GoogleTest binary found: its summary
    (parse_sanitizer), the sanitizer's internal errors (tool failures), the records of real
    findings (errors; racecheck's benign-looking races as warnings), the CUDA API errors, and
    'real', the number of real errors. An internal error is not one of them, though racecheck's
    summary counts it ("1 hazard displayed (1 error, 0 warnings)"): the summary's count less the
    internal errors, and after an internal error the API errors it caused are not counted either;
    a summary that counts more than the records, the internal and the API errors counts as real."""
    s = parse_sanitizer(text)
    lines = text.splitlines()
    internal, errors, warnings, api = [], [], [], []
    for i, ln in enumerate(lines):
        prefixed = ln.startswith("=")
        body = re.sub(r"^=+\s*", "", ln).strip()
        if prefixed and SANITIZER_API_ERROR_RE.match(body):
            api.append(body)
        elif SANITIZER_INTERNAL_RE.search(ln) and (prefixed or "sanitizer" in ln.lower()):
            internal.append(body)
        elif prefixed and SANITIZER_FINDING_RE.match(body):
            record = body
            for nxt in lines[i + 1:i + 3]:  # "and Read access at ... [4 hazards]", "at kernel+0x... in file:line"
                more = re.sub(r"^=+\s*", "", nxt).strip()
                if nxt.startswith("=") and re.match(r"(?:and|at) ", more):
                    record += " " + more
            (warnings if body.startswith("Warning") else errors).append(record)
    summary = s.get("errors")
    if not internal:
        real = summary if summary is not None else len(errors) + len(api)
    else:
        beyond = (summary - len(internal) - len(errors) - len(api)) if summary is not None else 0
        real = len(errors) + max(beyond, 0)
    runs = gtest_runs(text)
    return {"summary": s, "ran": "SUMMARY:" in text, "racecheck": "hazards" in s, "internal": internal,
            "errors": errors, "warnings": warnings, "api": api, "real": real, "runs": runs,
            "filter": gtest_filter(text),
            "stopped_in": next((n for n, o in reversed(runs) if o == "did not finish"), None)}


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


def short_record(record):
    """A sanitizer record with each kernel's signature cut to its name and template arguments
    and its source to file:line: "Race reported between Write access at pool_combine_kernel<float,
    float> (additive_pooling.cu:162) and Read access at ..."."""
    return re.sub(r"(?:void )?(?:[\w:<>]+::)?(\w+)(<[^()]*>)?\((?:[^()]|\([^()]*\))*\)\+0x[0-9a-f]+"
                  r"(?: in (?:\S*/)?(\S+))?", lambda m: f"{m.group(1)}{m.group(2) or ''}"
                  + (f" ({m.group(3)})" if m.group(3) else ""), record)


def sanitizer_counts(a):
    """The summary's words: 'RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)' or
    'ERROR SUMMARY: 3 errors'; '' without a summary."""
    s = a["summary"]
    if a["racecheck"]:
        return (f"RACECHECK SUMMARY: {plural(s['hazards'], 'hazard')} displayed ({plural(s['errors'], 'error')}, "
                f"{plural(s.get('warnings', 0), 'warning')})")
    return f"ERROR SUMMARY: {plural(s['errors'], 'error')}" if "errors" in s else ""


def sanitizer_verdict(text):
    """A compute-sanitizer stage's verdict: ('failed', why) when it found real errors (hazards,
    invalid accesses), naming the counts, even beside an internal error; ('tool-error', why) when
    the sanitizer itself failed and found nothing else; ('skipped', why) when it checked
    nothing and says this machine refuses it; else (None, '') and the exit status stands."""
    a = sanitizer_analysis(text)
    counts = sanitizer_counts(a)
    internal = (f"{plural(len(a['internal']), 'sanitizer internal error')} (a tool failure, not counted): "
                f"{a['internal'][0][:100]}") if a["internal"] else ""
    if a["real"] > 0:
        kinds = []
        if a["errors"]:
            kinds.append(plural(len(a["errors"]), "race" if a["racecheck"] else "invalid access"
                                if all(e.startswith("Invalid") for e in a["errors"]) else "error record"))
        if a["api"] and not a["internal"]:
            kinds.append(plural(len(a["api"]), "CUDA API error"))
        first = short_record((a["errors"] or ([] if a["internal"] else a["api"]) or [""])[0])
        why = (f"compute-sanitizer found {plural(a['real'], 'hazard' if a['racecheck'] else 'error')}"
               + (f" ({counts})" if counts else "") + (": " + ", ".join(kinds) if kinds else "")
               + (f"; first: {first[:200]}" if first else "") + (f"; besides {internal}" if internal else ""))
        return "failed", why
    refused = None if a["ran"] else refusal(text)
    if refused and not any(re.search(r"Internal Sanitizer Error|failed to handle", x, re.I) for x in a["internal"]):
        # "The Sanitizer failed to initialize: ... not supported": this machine, not a broken run
        return "skipped", "refused by this machine's runtime: " + refused
    if a["internal"]:
        during = f" during {a['stopped_in']}" if a["stopped_in"] else ""
        why = (f"sanitizer internal error{during} (a tool failure, not a hazard): {a['internal'][0][:160]}"
               + (f"; its summary counted it: {counts}" if counts and a["summary"].get("errors") else ""))
        return "tool-error", why
    return None, ""


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


# L2 sectors (lts__t_sectors_*) are counts; without --print-units base ncu may scale them.
SECTOR_UNITS = {"sector": 1.0, "": 1.0, "ksector": 1e3, "msector": 1e6, "gsector": 1e9}
# An L2 sector is 32 bytes: lts__t_sectors_op_write x 32 is what a kernel wrote, whether or
# not the lines left the L2 for DRAM before it ended.
L2_SECTOR_BYTES = 32
# The metrics the ncu stage collects (gpu-check.sh's --metrics): time, DRAM bytes, L2 sectors.
NCU_METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
               "lts__t_sectors_op_write.sum", "lts__t_sectors_op_read.sum")


def metric_value(name, unit, value):
    v = parse_number(value)
    if v is None:
        return None
    u = (unit or "").strip().lower()
    if name.startswith("gpu__time_duration"):
        scale = TIME_UNITS.get(u, 1e-9 if u == "" else None)
    elif name.startswith("lts__t_sectors"):
        scale = SECTOR_UNITS.get(u)
    else:
        scale = BYTE_UNITS.get(u, 1.0 if u == "" else None)
    return None if scale is None else v * scale


def parse_ncu(text):
    """Per-launch {name, time_s, bytes, bytes_from, dram_read, dram_write, l2_write, l2_read} from
    ncu --csv (long 'details' or wide 'raw' form). bytes is what the kernel moved: the DRAM
    bytes it read plus the L2 write sectors x 32 (bytes_from 'l2-write') when the CSV has
    lts__t_sectors_op_write, since dram__bytes_write misses the writes still held in the L2
    when the kernel ends (50 MB on an H200: on the official model bias_activation was credited
    36 MiB of the 64 MiB it moves); else, on an older CSV, DRAM bytes read plus written
    (bytes_from 'dram'), which understates the writes. l2_write and l2_read are in bytes."""
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
                    if h.startswith(("gpu__time_duration", "dram__bytes", "lts__t_sectors")):
                        v = metric_value(h, units.get(h, ""), r[k])
                        if v is not None:
                            d["m"][h] = v
    out = []
    for d in launches.values():
        m = d["m"]
        t = m.get("gpu__time_duration.sum")
        read, write = m.get("dram__bytes_read.sum"), m.get("dram__bytes_write.sum")
        sectors_w, sectors_r = m.get("lts__t_sectors_op_write.sum"), m.get("lts__t_sectors_op_read.sum")
        l2_write = sectors_w * L2_SECTOR_BYTES if sectors_w is not None else None
        if l2_write is not None:
            b, source = (read or 0.0) + l2_write, "l2-write"
        else:
            b, source = (read or 0.0) + (write or 0.0), "dram"
        if t and t > 0:
            out.append({"name": d["name"], "time_s": t, "bytes": b, "bytes_from": source, "dram_read": read,
                        "dram_write": write, "l2_write": l2_write,
                        "l2_read": sectors_r * L2_SECTOR_BYTES if sectors_r is not None else None})
    return out


def kernel_table(launches, copy_bw):
    """ncu's launches summed per kernel name, slowest first: launches, time, bytes (parse_ncu's:
    DRAM read + L2 write sectors x 32, or DRAM read + written on an older CSV) and the parts
    they come from, the bandwidth over copy bandwidth, and whether the kernel counts for the
    70% target (non-GEMM, at least SIGNIFICANT_BYTES_PER_LAUNCH a launch)."""
    agg = {}
    for l in launches:
        a = agg.setdefault(l["name"], {"name": l["name"], "launches": 0, "time_s": 0.0, "bytes": 0.0,
                                       "dram_read": 0.0, "dram_write": 0.0, "l2_write": 0.0, "from": set()})
        a["launches"] += 1
        a["time_s"] += l["time_s"]
        a["bytes"] += l["bytes"]
        for k in ("dram_read", "dram_write", "l2_write"):
            if l.get(k) is not None and a[k] is not None:
                a[k] += l[k]
            else:
                a[k] = None
        a["from"].add(l.get("bytes_from", "dram"))
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


# --profile rows that an older fastformer-bench gave as one and the cost model prices apart:
# {the GEMM's row: the row of the pass that follows it}. Without the pass's row, the GEMM's row
# includes the pass and is left out of the comparison with the cost model.
PROFILE_SPLITS = {"ffn_in_gemm": "ffn_in_bias_gelu"}


def cost_model_comparison(ops, expected):
    """The cost model's ms of each profile op it can be compared with, by name ({op: ms}), and
    the ops left out, [(the GEMM's row, the missing pass's row)]: a GEMM's row that in this
    profile still includes the bias or activation pass which the cost model prices apart."""
    names = {o["name"] for o in ops}
    compared, left_out = {}, []
    for o in ops:
        name = o["name"]
        if name not in expected:
            continue
        part = PROFILE_SPLITS.get(name)
        if part and part not in names and part in expected:
            left_out.append((name, part))
            continue
        compared[name] = expected[name]
    return compared, left_out


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
        self.tool_errors = [s for s in self.stages if s["status"] == "tool-error"]
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
        self.server_parity = load_json(self.path("server-parity.json"))
        self.server_load = load_json(self.path("server-load.json"))
        self.cutlass = load_env(self.path("cutlass.env"))
        self.ctest_opt_in = parse_ctest(read_text(self.path("ctest-gpu-opt-in.out")))
        self.parity_opt_in = parse_gtest(read_text(self.path("parity-base-long-opt-in.out")))
        self.old_new = load_json(self.path("bench-old-new.json"))
        self.opt_in = load_json(self.path("bench-opt-in.json"))

    def path(self, name):
        return os.path.join(self.run, name)

    def status_label(self, s):
        """A stage's status in words: a sanitizer's internal error ('tool-error') is a tool failure,
        retried once as <ID>-retry, never a hazard."""
        if not s:
            return "not run"
        if s["status"] != "tool-error":
            return s["status"]
        retry = self.by_id.get(s["id"] + "-retry")
        if retry is None:
            how = "not retried"
        elif retry["status"] == "skipped":
            how = "retry skipped" + (f": {retry['note']}" if retry["note"] else "")
        else:
            how = "retried"
        return f"{TOOL_ERROR_LABEL}, {how}"

    def stage_result(self, s):
        """A stage's status in words and its note."""
        return self.status_label(s) + (f": {s['note']}" if s and s.get("note") else "")

    def stage_why(self, sid):
        """Why a stage gave no figure: its status and note, or 'not run'."""
        s = self.by_id.get(sid)
        return self.stage_result(s) if s else f"not run (no stage {sid})"

    def sanitizer(self, sid):
        """One compute-sanitizer stage, its retry taken when there is one that ran: {'stage': the
        stage whose result stands, 'first': the first run when a retry stands, 'analysis':
        sanitizer_analysis of its output, 'filter': the tests it ran, 'loading': the
        CUDA_MODULE_LOADING its title names}."""
        first = self.by_id.get(sid)
        retry = self.by_id.get(sid + "-retry")
        stands = retry if retry and retry["status"] != "skipped" else first
        out = {"stage": stands, "first": first if stands is retry else None, "retry": retry}
        rid = stands["id"] if stands else sid
        text = read_text(self.path(rid + ".out")) + "\n" + read_text(self.path(rid + ".err"))
        out["analysis"] = sanitizer_analysis(text)
        out["filter"] = gtest_filter("", stands["title"] if stands else "") or out["analysis"]["filter"]
        m = re.search(r"CUDA_MODULE_LOADING=(\w+)", stands["title"] if stands else "")
        out["loading"] = m.group(1) if m else None
        return out

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
        source = ("DRAM read + L2 write sectors" if worst["from"] == {"l2-write"}
                  else "DRAM read + written, understating writes held in the L2")
        rows.append([f"non-GEMM kernels vs device-to-device copy bandwidth, ncu, {c.ncu_workload} ({source}; worst "
                     f"kernel moving ≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch: {worst['name'][:60]})",
                     "≥ 70%", f"{100 * v:.0f}%", c.verdict(v, v >= TARGET_COPY_FRACTION, "")])
    else:
        ncu = c.by_id.get("ncu", {})
        reason = ("no ncu figures (" + (ncu.get("note") or ncu.get("status", "not run")) + ")"
                  if not c.kernels else "no copy bandwidth" if c.copy_bw is None
                  else "no non-GEMM kernel moved enough bytes")
        rows.append([f"non-GEMM kernels vs device-to-device copy bandwidth, ncu, {c.ncu_workload}", "≥ 70%", "—",
                     "not measured: " + reason])
    return rows


def parity_targets(c, suffix="", label=""):
    """The parity targets: every gpu test under ctest, and the base-long-shaped parity test; with
    suffix "-opt-in", the same two with every opt-in kernel on (FASTFORMER_CUDA_OPT_IN=all)."""
    rows = []
    opt_in = suffix == "-opt-in"
    measured, mode = c.measured, c.mode
    ctest, g = (c.ctest_opt_in, c.parity_opt_in) if opt_in else (c.ctest, c.parity)
    s = c.by_id.get("ctest-gpu" + suffix)
    parity = "parity with the CPU engine, all dtypes (ctest -L gpu, base-long apart)" + label
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
    s = c.by_id.get("parity-base-long" + suffix)
    parity = "base-long-shaped parity (768 hidden, 12 heads, 3,072, two layers; each dtype vs the CPU engine)" + label
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


# ----------------------------------------------------------------------------- the server on the GPU

TARGET_SERVER_VS_ENGINE = 0.90
TARGET_SERVER_COSINE = 0.999


def server_target_rows_missing(c, sid, data):
    """Why a server figure is missing: the JSON's error, else the stage's status and note."""
    err = data.get("error") if isinstance(data, dict) else None
    stage = c.by_id.get(sid)
    why = c.stage_result(stage) if stage else f"not run (no stage {sid}, no {sid}.json)"
    if stage and stage["status"] == "ok" and not data:
        why = f"stage {sid} ok, but no readable {sid}.json"
    if err:
        why = (c.status_label(stage) + ": " if stage and stage["status"] != "ok" else "") + str(err)
    return why


def parity_group_check(g, threshold):
    """One group of the server's parity: (True, []) within bf16 parity, (False, the problems),
    or (None, why) when the group has no figure to judge."""
    problems = []
    cos, am, failed = g.get("min_cosine"), g.get("argmax"), g.get("failed_requests")
    if num(cos) and cos < threshold:
        problems.append(f"min cosine {cos:.5f} < {threshold:g}" + (f" ({g['worst']})" if g.get("worst") else ""))
    if isinstance(am, dict) and num(am.get("same")) and num(am.get("of")) and am["same"] < am["of"]:
        problems.append(f"argmax differs in {am['of'] - am['same']} of {am['of']}")
    if num(failed) and failed > 0:
        problems.append(f"{plural(failed, 'request')} failed")
    if g.get("ok") is False and not problems:
        errors = g.get("errors") or []
        problems.append("marked failed by the stage" + (f": {errors[0]}" if errors else ""))
    if problems:
        return False, problems
    if not num(cos):
        return None, ["no cosine measured"]
    return True, []


def server_parity_target(c):
    p = c.server_parity or {}
    label = "server parity (bf16 cosine >= 0.999 to CPU float32, same argmax)"
    threshold = p.get("threshold") if num(p.get("threshold")) else TARGET_SERVER_COSINE
    required = f"cosine ≥ {threshold:g} in every group, same argmax"
    groups = [g for g in p.get("groups") or [] if isinstance(g, dict)]
    if not groups:
        return [label, required, "—", "not measured: " + server_target_rows_missing(c, "server-parity", p)]
    checks = [(g, parity_group_check(g, threshold)) for g in groups]
    cosines = [g["min_cosine"] for g in groups if num(g.get("min_cosine"))]
    same = sum(g["argmax"]["same"] for g in groups if isinstance(g.get("argmax"), dict)
               and num(g["argmax"].get("same")) and num(g["argmax"].get("of")))
    of = sum(g["argmax"]["of"] for g in groups if isinstance(g.get("argmax"), dict)
             and num(g["argmax"].get("same")) and num(g["argmax"].get("of")))
    requests = sum(g["requests"] for g in groups if num(g.get("requests")))
    measured = (f"min cosine {min(cosines):.5f}" if cosines else "no cosine") + \
        f" over {plural(len(groups), 'group')} ({', '.join(str(g.get('name', '?')) for g in groups)}), " \
        f"{plural(requests, 'request')}" + (f"; argmax {same}/{of} same" if of else "")
    bad = [f"{g.get('name', '?')}: {'; '.join(why)}" for g, (ok, why) in checks if ok is False]
    unknown = [f"{g.get('name', '?')}: {'; '.join(why)}" for g, (ok, why) in checks if ok is None]
    if not c.measured:
        verdict = f"not a GPU figure ({c.mode})"
    elif bad:
        verdict = "FAIL: " + "; ".join(bad)
    elif p.get("ok") is False or p.get("error"):
        verdict = "FAIL: " + str(p.get("error") or "the stage says parity failed")
    elif unknown:
        verdict = "not measured: " + "; ".join(unknown)
    else:
        verdict = "PASS"
    return [label, required, measured, verdict]


def server_ratio_target(c):
    load = c.server_load or {}
    sat = load.get("saturation") if isinstance(load.get("saturation"), dict) else {}
    label = "server ÷ engine tokens/s >= 0.90"
    target = sat.get("target") if num(sat.get("target")) else TARGET_SERVER_VS_ENGINE
    required = f"≥ {target:.2f} (the same plugin, model, lengths and batch budget in fastformer-bench)"
    v = sat.get("ratio") if num(sat.get("ratio")) else ratio(sat.get("server_tokens_per_s"),
                                                              sat.get("engine_tokens_per_s"))
    if v is None:
        return [label, required, "—", "not measured: " + server_target_rows_missing(c, "server-load", load)]
    failed = sum(n for n in (sat.get("errors") or {}).values() if num(n)) if isinstance(sat.get("errors"), dict) else 0
    measured = (f"{v:.2f} (server {fmt_rate(sat.get('server_tokens_per_s'))} ÷ engine "
                f"{fmt_rate(sat.get('engine_tokens_per_s'))} tokens/s)"
                + (f"; {plural(failed, 'request')} failed under saturation ({fmt_codes(sat['errors'])})"
                   if failed else ""))
    return [label, required, measured, c.verdict(v, v >= target, "")]


def drain_figures(d):
    """The drain's figures: requests, answered, ended with a code (sum and by code), unclear
    (a code that is not a clear refusal, by the stage's count), unaccounted (neither answered
    nor ended with a code: the counts do not add up), lost (unclear + unaccounted), hung, exit
    code; None where missing."""
    codes = d.get("errors") if isinstance(d.get("errors"), dict) else {}
    coded = sum(n for n in codes.values() if num(n))
    requests, answered, unclear = d.get("requests"), d.get("succeeded"), d.get("unclear")
    unaccounted = max(requests - answered - coded, 0) if num(requests) and num(answered) else None
    lost = None
    if num(unclear) or unaccounted is not None:
        lost = (unclear if num(unclear) else 0) + (unaccounted or 0)
    return {"requests": requests, "answered": answered, "coded": coded, "codes": codes, "unclear": unclear,
            "unaccounted": unaccounted, "lost": lost, "hung": d.get("hung"), "exit": d.get("server_exit")}


def drain_check(d):
    """(True, []) when every accepted request was answered or refused with a clear code, none
    hung and the server exited 0; (False, the problems); (None, why) without the figures."""
    f = drain_figures(d)
    problems = []
    if num(f["lost"]) and f["lost"] > 0:
        problems.append(f"{plural(f['lost'], 'request')} lost (neither answered nor refused with a clear code)")
    if f["hung"]:
        problems.append("a request hung")
    if f["exit"] is not None and f["exit"] != 0:
        problems.append(f"the server exited {f['exit']}")
    if d.get("drained_line") is False:
        problems.append("no 'drained; exiting' in the server's log")
    if d.get("ok") is False and not problems:
        problems.append("marked failed by the stage")
    if problems:
        return False, problems
    if f["lost"] is None or f["exit"] is None:
        return None, ["no " + ("request counts" if f["lost"] is None else "exit code")]
    return True, []


def server_drain_target(c):
    load = c.server_load or {}
    d = load.get("drain") if isinstance(load.get("drain"), dict) else None
    label = "drain: 0 lost, exit 0"
    required = "SIGTERM under saturation: every request answered or refused with a clear code, none hung, exit 0"
    if not d:
        return [label, required, "—", "not measured: " + server_target_rows_missing(c, "server-load", load)]
    f = drain_figures(d)
    codes = ", ".join(f"{k} {v}" for k, v in f["codes"].items() if num(v) and v)
    measured = (f"{known(f['requests'])} requests: {known(f['answered'])} answered, {f['coded']} refused"
                + (f" ({codes})" if codes else "")
                + f", {known(f['lost'])} lost, "
                + ("one or more hung" if f["hung"] else "none hung" if f["hung"] is False else "hung unknown")
                + f", exit {f['exit'] if f['exit'] is not None else '?'}")
    ok, why = drain_check(d)
    if not c.measured:
        verdict = f"not a GPU figure ({c.mode})"
    elif ok is None:
        verdict = "not measured: " + "; ".join(why)
    else:
        verdict = "PASS" if ok else "FAIL: " + "; ".join(why)
    return [label, required, measured, verdict]


def server_targets(c):
    """The server on the GPU: parity through it, its throughput over the engine's, the drain."""
    return [server_parity_target(c), server_ratio_target(c), server_drain_target(c)]


def known(v):
    return v if num(v) else "?"


def fmt_num(v, spec=","):
    return format(v, spec) if num(v) else "—"


def fmt_pair(d, a="p50", b="p99"):
    """'1.20 / 2.50' from {'p50': 1.2, 'p99': 2.5}."""
    d = d if isinstance(d, dict) else {}
    return f"{fmt_ms(d.get(a))} / {fmt_ms(d.get(b))}"


def fmt_codes(codes):
    if not isinstance(codes, dict) or not any(num(v) and v for v in codes.values()):
        return "none"
    return ", ".join(f"{k} {v}" for k, v in codes.items() if num(v) and v)


def server_section(c):
    """The server on the GPU (stages server-parity and server-load): the dtype it picked, parity
    through gRPC, HTTP and text against the CPU's float32, saturation against the engine, low
    load latencies, and the drain."""
    lines = ["## The server on the GPU", ""]
    p, load = c.server_parity, c.server_load
    if p is None and load is None:
        lines.append("Not measured: server-parity " + c.stage_why("server-parity") + "; server-load "
                     + c.stage_why("server-load") + ".")
        lines.append("")
        return lines
    p = p or {}
    load = load or {}
    first = p if p.get("dtype") or p.get("backend") else load
    if first.get("backend") or first.get("dtype"):
        lines.append(f"- backend **{first.get('backend') or '?'}**, dtype auto picked: **{first.get('dtype') or '?'}**"
                     + (f"; the server's log: `{p['dtype_line']}`" if p.get("dtype_line") else ""))
    if p.get("server_cmd"):
        lines.append(f"- server: `{p['server_cmd']}`")
    if c.meta.get("server_configure"):
        lines.append(f"- the carried binaries' configure line (the image's): `{c.meta['server_configure']}`")
    if p.get("expected_from"):
        lines.append(f"- expected outputs (CPU float32): {p['expected_from']}")
    lines.append("")

    lines.append("### Parity through the server")
    lines.append("")
    lines.append(f"Stage server-parity: {c.stage_why('server-parity')}.")
    lines.append("")
    threshold = p.get("threshold") if num(p.get("threshold")) else TARGET_SERVER_COSINE
    groups = [g for g in p.get("groups") or [] if isinstance(g, dict)]
    if groups:
        rows = []
        for g in groups:
            ok, why = parity_group_check(g, threshold)
            am = g.get("argmax")
            rows.append([g.get("name", "?"), g.get("model", "?"), fmt_num(g.get("requests")),
                         fmt_num(g.get("sequences")), fmt_num(g.get("tokens")),
                         f"{g['min_cosine']:.5f}" if num(g.get("min_cosine")) else "—", f"≥ {threshold:g}",
                         g.get("worst") or "—",
                         f"{am.get('same', '?')}/{am.get('of', '?')}" if isinstance(am, dict) else "no head",
                         fmt_num(g.get("failed_requests")),
                         "ok" if ok else ("not measured: " if ok is None else "FAIL: ") + "; ".join(why)])
        lines += table(["group", "model", "requests", "sequences", "tokens", "min cosine", "threshold", "worst",
                        "argmax same", "failed requests", "verdict"], rows)
        errors = [(g.get("name", "?"), e) for g in groups for e in (g.get("errors") or [])]
        if errors:
            lines.append("")
            lines.append("Errors:")
            lines += [f"- {name}: {str(e)[:300]}" for name, e in errors[:10]]
    else:
        lines.append("No parity figures (" + server_target_rows_missing(c, "server-parity", p) + ").")
    if p.get("error") and groups:
        lines.append("")
        lines.append(f"The stage did not complete: {p['error']}")
    lines.append("")

    lines.append("### Saturation, low load and drain")
    lines.append("")
    lines.append(f"Stage server-load: {c.stage_why('server-load')}"
                 + (f"; model {load['model']}" if load.get("model") else "")
                 + (f", {fmt_num(load.get('max_batch_tokens'))} tokens a batch at most" if load.get("max_batch_tokens")
                    else "") + ".")
    lines.append("")
    sat = load.get("saturation") if isinstance(load.get("saturation"), dict) else None
    if sat:
        v = sat.get("ratio") if num(sat.get("ratio")) else ratio(sat.get("server_tokens_per_s"),
                                                                  sat.get("engine_tokens_per_s"))
        target = sat.get("target") if num(sat.get("target")) else TARGET_SERVER_VS_ENGINE
        mem = sat.get("gpu_memory_mib")
        rows = [["server tokens/s (fastformer-loadgen)", fmt_rate(sat.get("server_tokens_per_s"))],
                ["engine tokens/s (fastformer-bench, the same plugin, model, lengths and budget)",
                 fmt_rate(sat.get("engine_tokens_per_s"))
                 + (f" ({sat['engine_dtype']})" if sat.get("engine_dtype") else "")],
                ["server ÷ engine", (f"**{v:.2f}**" if v is not None else "—") + f" (target ≥ {target:.2f})"],
                ["load", f"{sat.get('seconds', '?')} s, concurrency {sat.get('concurrency', '?')}, lengths "
                         f"{sat.get('lengths', '?')}, {sat.get('sequences_per_request', '?')} sequences a request"],
                ["requests (errors)", f"{fmt_num(sat.get('requests'))} ({fmt_codes(sat.get('errors'))})"],
                ["request latency p50 / p99 (ms)", fmt_pair(sat.get("latency_ms"))],
                ["batches, mean batch tokens (/metrics)",
                 f"{fmt_num(sat.get('batches'))}, {fmt_num(sat.get('batch_tokens_mean'), ',.0f')}"],
                ["GPU memory", (f"{fmt_num(mem)} MiB" if num(mem) else "—")
                 + (f" ({sat['gpu_memory_from']})" if sat.get("gpu_memory_from") else "")]]
        if sat.get("engine_cmd"):
            rows.append(["engine's command", f"`{sat['engine_cmd']}`"])
        lines += table(["saturation", "value"], rows)
    else:
        lines.append("Saturation: not measured (" + server_target_rows_missing(c, "server-load", load) + ").")
    lines.append("")
    low = load.get("low_load") if isinstance(load.get("low_load"), dict) else None
    if low:
        lines.append(f"Low load: one client, {low.get('lengths', '?')}, {low.get('seconds', '?')} s, "
                     f"{fmt_num(low.get('requests'))} requests (errors: {fmt_codes(low.get('errors'))}).")
        lines.append("")
        lines += table(["latency (ms)", "p50 / p99"],
                       [["end to end (client)", fmt_pair(low.get("latency_ms"))],
                        ["the server's queue", fmt_pair(low.get("server_queue_ms"))],
                        ["the server's compute", fmt_pair(low.get("server_compute_ms"))]])
    else:
        lines.append("Low load: not measured.")
    lines.append("")
    d = load.get("drain") if isinstance(load.get("drain"), dict) else None
    if d:
        f = drain_figures(d)
        ok, why = drain_check(d)
        lines.append(f"Drain: SIGTERM {d.get('signal_after_s', '?')} s into saturation.")
        lines.append("")
        lines += table(["drain", "value"], [
            ["requests", fmt_num(f["requests"])], ["answered", fmt_num(f["answered"])],
            ["refused, by code", f"{f['coded']} ({fmt_codes(f['codes'])})"],
            ["of them unclear (not a clear refusal)", fmt_num(f["unclear"])],
            ["neither answered nor refused", fmt_num(f["unaccounted"])], ["lost", fmt_num(f["lost"])],
            ["hung", "yes" if f["hung"] else "no" if f["hung"] is False else "—"],
            ["server exit code", str(f["exit"]) if f["exit"] is not None else "—"],
            ["'drained' logged", "yes" if d.get("drained_line") else "no" if d.get("drained_line") is False else "—"],
            ["seconds to exit", fmt_ms(d.get("seconds_to_exit"))],
            ["requests the server logged as not answered", "yes" if d.get("abandoned_line") else
             "no" if d.get("abandoned_line") is False else "—"],
            ["verdict", "ok" if ok else ("not measured: " if ok is None else "FAIL: ") + "; ".join(why)]])
    else:
        lines.append("Drain: not measured.")
    if d and d.get("note"):
        lines.append("")
        lines.append(f"Drain note: {d['note']}")
    if load.get("error"):
        lines.append("")
        lines.append(f"The stage did not complete: {load['error']}")
    lines.append("")
    return lines


def target_rows(c):
    """The Targets table's rows (target, required, measured, result), also in the summary."""
    return (throughput_targets(c) + old_new_targets(c) + copy_fraction_targets(c) + parity_targets(c)
            + parity_targets(c, "-opt-in", ", FASTFORMER_CUDA_OPT_IN=all") + sanitizer_targets(c)
            + server_targets(c))


# ----------------------------------------------------------------------------- issue 48: old and new, opt-in

# How a shape of the alternated runs is named in the report.
AB_SHAPES = {"fixed:512": "512-token sequences, 65,536-token batches", "fixed:65536": "one 65,536-token sequence"}


def ab_shape(lengths):
    return AB_SHAPES.get(lengths, lengths)


def ab_figures(doc):
    """tests/gpu/bench_ab.py's runs, by shape then arm: {"runs": [tokens/s, in order], "errors":
    [why a run gave no figure], "mean": the mean of the runs, or None}. Shapes and arms in the
    order they ran."""
    out = {}
    for r in (doc or {}).get("runs") or []:
        if not isinstance(r, dict):
            continue
        a = out.setdefault(r.get("lengths", "?"), {}).setdefault(r.get("arm", "?"),
                                                                 {"runs": [], "errors": [], "device": None})
        result = r.get("result") if isinstance(r.get("result"), dict) else {}
        a["device"] = a["device"] or result.get("device")
        v = r.get("tokens_per_second")
        if num(v) and not r.get("error"):
            a["runs"].append(v)
        else:
            a["errors"].append(str(r.get("error") or "no figure"))
    for arms in out.values():
        for a in arms.values():
            a["mean"] = sum(a["runs"]) / len(a["runs"]) if a["runs"] else None
    return out


def fmt_runs(a):
    """A mean and its runs: '2.00 M (2.01 M, 1.99 M)'."""
    if not a or a["mean"] is None:
        return "—" + (f" ({a['errors'][0][:100]})" if a and a["errors"] else "")
    runs = ", ".join(fmt_rate(v) for v in a["runs"])
    return fmt_rate(a["mean"]) + (f" ({runs})" if len(a["runs"]) > 1 else "")


def ab_shapes(doc):
    """The shapes the stage meant to run (its --lengths), else those it ran."""
    return list((doc or {}).get("lengths") or ab_figures(doc).keys())


def old_new_rows(c):
    """Per shape: the shape, old, new, new ÷ old, the verdict (acceptance ≥ 1.2x)."""
    doc = c.old_new
    figures = ab_figures(doc)
    why_none = c.stage_why("bench-old-new")
    rows = []
    for lengths in ab_shapes(doc) or list(AB_SHAPES):
        arms = figures.get(lengths, {})
        old, new = arms.get("old"), arms.get("new")
        v = ratio(new and new["mean"], old and old["mean"])
        missing = why_none if not doc else (
            "no old figure" + (f": {old['errors'][0]}" if old and old["errors"] else "") if not (old and old["mean"])
            else "no new figure" + (f": {new['errors'][0]}" if new and new["errors"] else ""))
        rows.append([lengths, fmt_runs(old), fmt_runs(new), f"{v:.2f}x" if v else "—",
                     c.verdict(v, v is not None and v >= TARGET_NEW_VS_OLD, missing)])
    return rows


def old_commit(c):
    meta = (c.old_new or {}).get("meta") or {}
    return meta.get("old_commit") or ""


def old_new_targets(c):
    commit = old_commit(c)[:7] or "the baseline commit"
    return [[f"new ÷ old ({commit}), base-long bf16, {ab_shape(lengths)} (bench-old-new)", f"≥ {TARGET_NEW_VS_OLD:g}x",
             ratio_cell, verdict] for lengths, _, _, ratio_cell, verdict in old_new_rows(c)]


def old_new_section(c):
    """Old and new in one run: the baseline commit's fastformer-bench against the new, alternated."""
    lines = ["## Old and new in one run", ""]
    doc = c.old_new
    meta = (doc or {}).get("meta") or {}
    if not doc:
        lines.append(f"Not run: {c.stage_why('bench-old-new')}.")
        lines.append("")
        return lines
    commit = meta.get("old_commit") or "unknown"
    lines.append(f"- old: commit `{commit}`, the last before issue 48's work: its fastformer-bench and CUDA engine "
                 "plugin, built with the server's configure line and carried in `.deps/baseline`")
    lines.append(f"- new: {meta.get('new_from') or 'unknown'}"
                 + (f", commit {meta['new_commit']}" if meta.get("new_commit") else ""))
    arms = {a.get("label"): a for a in doc.get("arms") or [] if isinstance(a, dict)}
    rounds = max((a.get("rounds", 0) for a in arms.values()), default=0)
    lines.append(f"- runs: old, new alternated, {rounds} of each per shape, --seconds {doc.get('seconds', '?')} each, "
                 f"in the same run ({'all done' if doc.get('complete') else 'stopped before the end'}); "
                 "tokens/s is the mean, each run's in brackets")
    lines.append("")
    lines += table(["shape (base-long bf16, 65,536-token batches)", "old tokens/s", "new tokens/s", "new ÷ old",
                    f"≥ {TARGET_NEW_VS_OLD:g}x"], [[ab_shape(r[0])] + r[1:] for r in old_new_rows(c)])
    lines.append("")
    return lines


def opt_in_parity(c):
    """(True/False/None, words): the GPU tests and the base-long parity with every opt-in kernel on."""
    parts, ok = [], True
    for sid, parsed, what in (("ctest-gpu-opt-in", c.ctest_opt_in, "ctest -L gpu"),
                              ("parity-base-long-opt-in", c.parity_opt_in, "base-long")):
        s = c.by_id.get(sid)
        if not s or s["status"] == "skipped":
            return None, f"not measured: {c.stage_why(sid)}"
        if isinstance(parsed, dict) and parsed.get("total"):
            fig = f"{parsed['passed']}/{parsed['total']}"
            good = parsed.get("failed", 0) == 0 and parsed.get("skipped", 0) == 0 and s["status"] == "ok"
        else:
            fig, good = s["status"], False
        ok = ok and good
        parts.append(f"{what} {fig}" + ("" if good else f" ({c.stage_result(s)})"))
    return ok, ", ".join(parts)


def engine_opt_in(device):
    """The engine's own word on the opt-in kernels that ran, from its device string
    ("NVIDIA H200 (device 0, bfloat16, opt-in cutlass-gelu, fused-key-pool)"): "" for none."""
    m = re.search(r", opt-in (.*)\)$", device or "")
    return m.group(1) if m else ""


def opt_in_rows(c):
    """Per opt-in (all, then each kernel): its parity, per shape its tokens/s against the default's
    (ratio), and whether it may become the default."""
    doc = c.opt_in
    figures = ab_figures(doc)
    shapes = ab_shapes(doc) or list(AB_SHAPES)
    labels = [a.get("label") for a in (doc or {}).get("arms") or [] if isinstance(a, dict)]
    names = [n for n in labels if n and n != "default"] or ["all"]
    par_ok, par_words = opt_in_parity(c)
    rows = []
    for name in names:
        if par_ok is None:
            parity = f"parity {par_words}"
        elif name == "all":
            parity = f"parity {'passed' if par_ok else 'failed'} ({par_words})"
        else:
            parity = (f"parity passed (with all: {par_words})" if par_ok else
                      f"parity failed with all ({par_words}): which kernel, not told apart")
        speeds, ratios, said = [], [], ""
        for lengths in shapes:
            arms = figures.get(lengths, {})
            a, d = arms.get(name), arms.get("default")
            said = said or engine_opt_in(a and a["device"])
            v = ratio(a and a["mean"], d and d["mean"])
            ratios.append(v)
            if v is None:
                why = (c.stage_why("bench-opt-in") if not doc else
                       (a["errors"][0] if a and a["errors"] else (d["errors"][0] if d and d["errors"] else "not run")))
                speeds.append(f"not measured: {why[:160]}")
            else:
                speeds.append(f"{fmt_rate(a['mean'])} tokens/s vs {fmt_rate(d['mean'])} default ({v:.2f}x)")
        faster = all(v is not None and v >= OPT_IN_FASTER for v in ratios)
        # A kernel asked for that the engine did not run (its note says "<name> off: why", or
        # does not name it) was not measured, whatever the figures say.
        off = name != "all" and said and (f"{name} off" in said or name not in said)
        if name == "all":
            verdict = "(the set)"
        elif off:
            verdict = f"no: it did not run ({said})"
        elif not c.measured:
            verdict = f"no: not a GPU figure ({c.mode})"
        elif par_ok is None or any(v is None for v in ratios):
            verdict = "no: not measured"
        elif not par_ok:
            verdict = "no: parity failed"
        elif not faster:
            verdict = f"no: not faster on every shape (≥ {OPT_IN_FASTER:.2f}x)"
        else:
            verdict = "**yes**: parity passed, faster on every shape"
        rows.append([name, parity, said or "—"] + speeds + [verdict])
    return shapes, rows


def opt_in_decision(c):
    """One line: which opt-in kernels may become the default."""
    _, rows = opt_in_rows(c)
    yes = [r[0] for r in rows if r[-1].startswith("**yes**")]
    if yes:
        return "May become the default (parity passed, faster on every shape): " + ", ".join(yes) + "."
    named = [r for r in rows if r[0] != "all"]
    if not named:
        return "No opt-in kernel was measured: " + (rows[0][1] if rows else c.stage_why("bench-opt-in")) + "."
    return "No opt-in kernel may become the default yet: " + "; ".join(f"{r[0]}: {r[-1][4:]}" for r in named) + "."


def opt_in_section(c):
    """Opt-in kernels: per opt-in, its parity and its speed against the default, and the decision."""
    lines = ["## Opt-in kernels", ""]
    doc = c.opt_in or {}
    meta = doc.get("meta") or {}
    lines.append("New kernels stay opt-in (`fastformer-bench --cuda-opt-in LIST`, `FASTFORMER_CUDA_OPT_IN=LIST`) "
                 "until a lease shows their parity (the GPU tests and base-long parity with "
                 "`FASTFORMER_CUDA_OPT_IN=all`) and their speed (default and opt-in alternated in one stage, "
                 + (f"--seconds {doc['seconds']} each; " if doc.get("seconds") else "")
                 + "tokens/s are means). A kernel may become the "
                 f"default when its parity passed and it is at least {OPT_IN_FASTER:.2f}x the default on every shape.")
    lines.append("")
    lines.append("- " + cutlass_line(c.cutlass) + (f"; the bench's build: CUTLASS {meta['cutlass']}" if meta.get("cutlass") else ""))
    lines.append("")
    shapes, rows = opt_in_rows(c)
    lines += table(["opt-in", "parity", "the engine ran (its device line)"]
                   + [f"{ab_shape(x)}: tokens/s vs default" for x in shapes]
                   + ["may become the default"], rows)
    lines.append("")
    lines.append(opt_in_decision(c))
    lines.append("")
    return lines


def cutlass_line(e):
    """The build's CUTLASS: the headers carried, or why the CUTLASS kernel is not built."""
    if e.get("version"):
        return f"CUTLASS {e['version']} headers: carried (`{e.get('include_dir', '?')}`, -DFASTFORMER_CUTLASS_DIR)"
    if not e:
        return "CUTLASS headers: not recorded (a run before issue 48)"
    return "CUTLASS headers absent: the CUTLASS kernel is not built" + (f" ({e['why']})" if e.get("why") else "")


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
    lines.append("- build: " + cutlass_line(c.cutlass))
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
        compared, left_out = cost_model_comparison(ops, expected)
        rows = []
        for o in ops:
            rows.append([o["name"], o["rows"], f"{o['ms']:.3f}",
                         f"{compared[o['name']]:.3f}" if o["name"] in compared else "—",
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
        if compared:
            measured = sum(o["ms"] for o in ops if o["name"] in compared)
            lines.append("")
            lines.append(f"The {len(compared)} ops compared with the cost model by name take {measured:.2f} ms "
                         f"against its {sum(compared.values()):.2f} ms.")
            for combined, part in PROFILE_SPLITS.items():
                if combined in compared and part in compared:
                    lines.append(f"`{combined}` is the GEMM alone and `{part}` the pass after it (the profile "
                                 "splits them, as the cost model does): both are compared.")
        for combined, part in left_out:
            lines.append("")
            lines.append(f"`{combined}` is left out of the comparison: this profile has no `{part}` row, so its "
                         f"`{combined}` includes that pass (the exact-erf GELU), which the cost model prices apart "
                         f"({expected[combined]:.3f} ms for the GEMM, {expected[part]:.3f} ms for the pass).")
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
        lines.append(f"Per kernel (ncu, our kernels, one {c.ncu_workload} batch; bytes moved over GPU time, "
                     f"caches flushed between kernels; {len(c.launches)} launches). "
                     f"'counts' marks the non-GEMM kernels the 70% target is judged on "
                     f"(≥ {SIGNIFICANT_BYTES_PER_LAUNCH / 1e6:.0f} MB per launch).")
        lines.append("")
        rows = []
        for k in kernels[:30]:
            rows.append([k["name"][:80], k["launches"], f"{k['time_s'] * 1e3:.3f}", fmt_bytes(k["bytes"]),
                         fmt_bytes(k["dram_read"]), fmt_bytes(k["l2_write"]), fmt_bytes(k["dram_write"]),
                         fmt_bw(k["bw"]), f"{100 * k['fraction']:.0f}%" if k["fraction"] is not None else "—",
                         "GEMM" if k["gemm"] else ("counts" if k["significant"] else "small")])
        lines += table(["kernel", "launches", "total ms", "bytes", "DRAM read", "written (L2 sectors x 32)",
                        "DRAM written", "bandwidth", "of copy", "kind"], rows)
        if len(kernels) > 30:
            lines.append(f"\n({len(kernels) - 30} more kernels in the logs' ncu.csv)")
        lines.append("")
        lines.append(ncu_bytes_note(c.launches))
    else:
        s = c.by_id.get("ncu", {})
        lines.append(f"Per-kernel bandwidth not measured (ncu: {s.get('status', 'not run')}"
                     f"{': ' + s['note'] if s.get('note') else ''}).")
    lines.append("")
    return lines


def ncu_bytes_note(launches):
    """The note under ncu's per-kernel table: where its bytes come from."""
    l2 = sum(1 for l in launches if l.get("bytes_from") == "l2-write")
    if l2 == len(launches):
        return ("Bytes: DRAM bytes read (`dram__bytes_read`) + L2 write sectors x 32 B "
                "(`lts__t_sectors_op_write`): every byte a kernel wrote, including the writes still held in "
                "the 50 MB L2 when it ended, which `dram__bytes_write` (the 'DRAM written' column) misses. "
                "The bandwidths and the 70% target use these bytes.")
    if l2 == 0:
        return ("Bytes: DRAM bytes read + written (`dram__bytes_read` + `dram__bytes_write`): this ncu.csv "
                "has no L2 write sectors (`lts__t_sectors_op_write`), so the writes still held in the 50 MB L2 "
                "when a kernel ended are not counted, and the bytes and bandwidths **understate the writes**.")
    return (f"Bytes: DRAM read + L2 write sectors x 32 B for {l2} of {len(launches)} launches; the other "
            "launches have no `lts__t_sectors_op_write` and count DRAM bytes read + written, which understate "
            "the writes still held in the L2.")


# The compute-sanitizer stages of gpu-check.sh (each may have a <ID>-retry after a tool failure):
# (stage ID, tool, the --gtest_filter it runs). The small model, then base-long's launch shapes,
# each its own capped stage.
SANITIZERS = (("memcheck", "memcheck", "*Small*"), ("memcheck-base-long", "memcheck", "*BaseLong*"),
              ("racecheck", "racecheck", "*Small*"), ("racecheck-base-long", "racecheck", "*BaseLong*"))


def runs_text(runs):
    """The tests a run went through, each with its outcome, their common prefix said once:
    'Dtypes/GpuEngineTest.: SmallBatchMatchesTheCpuEngine/0 ok, ...'."""
    if not runs:
        return ""
    names = [n for n, _ in runs]
    prefix = os.path.commonprefix(names) if len(names) > 1 else ""
    prefix = prefix[:prefix.rfind(".") + 1] if "." in prefix else ""
    return (f"{prefix}: " if prefix else "") + ", ".join(f"{n[len(prefix):]} {o}" for n, o in runs)


def sanitizer_result(c, sid, tool, default_filter=None):
    """One compute-sanitizer check, the retry's result when a retry ran: {'measured', 'verdict',
    'stage', 'tests', 'filter'} for the Targets and the Correctness tables. A hazard or an
    invalid access fails it; the sanitizer's own internal error does not (a tool failure: not
    measured, unless a retry measured it)."""
    r = c.sanitizer(sid)
    a, s, first = r["analysis"], r["stage"], r["first"]
    noun = "hazard" if tool == "racecheck" else "error"
    parts = []
    if a["real"] > 0:
        parts.append(f"**{plural(a['real'], noun)}**")
        if sanitizer_counts(a):
            parts.append(sanitizer_counts(a))
        if a["errors"]:
            parts.append("first: " + short_record(a["errors"][0])[:200])
    elif a["internal"]:
        parts.append(f"{TOOL_ERROR_LABEL}: {a['internal'][0][:120]}, not a hazard"
                     + (f" (its summary counted it: {sanitizer_counts(a)})" if a["summary"].get("errors") else ""))
    elif a["ran"]:
        parts.append(plural(0, noun) if not a["summary"].get("errors") else sanitizer_counts(a))
        if a["warnings"]:
            parts.append(f"{plural(len(a['warnings']), 'race warning')} (hazards that may be benign)")
    if a["internal"] and a["real"] > 0:
        parts.append(f"and {plural(len(a['internal']), 'sanitizer internal error')} (a tool failure, not counted)")
    if a["runs"]:
        bad = [n for n, o in a["runs"] if o != "ok"]
        parts.append(f"{plural(len(a['runs']), 'test')} ran" + (f", {len(bad)} not ok" if bad else ""))
    elif a["summary"].get("tests") == 0:
        parts.append(f"no test matched {r['filter'] or 'the filter'}")
    if a["stopped_in"]:
        parts.append(f"stopped in {a['stopped_in']}")
    if first:
        parts.append(f"retry ({s['id']}{', CUDA_MODULE_LOADING=' + r['loading'] if r['loading'] else ''}) "
                     f"after the first run's {TOOL_ERROR_LABEL}")
    measured = "; ".join(parts) or "—"
    stage = c.stage_result(s) if s else c.stage_why(sid)
    if first:
        stage = f"{first['id']}: {c.stage_result(first)}; {s['id']}: {c.stage_result(s)}"
    if not s or s["status"] == "skipped":
        verdict = "not measured: " + (c.stage_result(s) if s else f"not run (no stage {sid})")
    elif not c.measured:
        verdict = f"not a GPU figure ({c.mode})"
    elif a["real"] > 0:
        verdict = "FAIL"
    elif s["status"] == "tool-error" or (a["internal"] and s["status"] != "ok"):
        verdict = "not measured: " + TOOL_ERROR_LABEL + (" (again on the retry)" if first else "")
    elif s["status"] == "timeout":
        verdict = "not measured: " + c.stage_result(s)
    elif s["status"] == "ok" and a["ran"]:
        verdict = "PASS"
    elif a["ran"]:
        bad = [f"{n} {o}" for n, o in a["runs"] if o != "ok"]
        verdict = (f"FAIL: tests not ok under the sanitizer ({', '.join(bad)[:160]})" if bad
                   else "FAIL: " + c.stage_result(s))
    else:
        verdict = "FAIL: " + c.stage_result(s) + " (no sanitizer summary)"
    tests = []
    if first:
        fa = sanitizer_analysis(read_text(c.path(first["id"] + ".out")) + "\n"
                                + read_text(c.path(first["id"] + ".err")))
        if fa["runs"]:
            tests.append(f"{first['id']} (first run, {TOOL_ERROR_LABEL}): {runs_text(fa['runs'])}")
    if a["runs"]:
        tests.append(f"{s['id']}: {runs_text(a['runs'])}")
    return {"measured": measured, "verdict": verdict, "stage": stage, "tests": tests,
            "filter": r["filter"] or default_filter,
            "required": f"{plural(0, noun)}"}


def sanitizer_targets(c):
    """compute-sanitizer memcheck and racecheck: a hazard or a memory error fails; a tool failure
    (the sanitizer's internal error) is not measured, unless its retry measured it."""
    rows = []
    for sid, tool, filt in SANITIZERS:
        r = sanitizer_result(c, sid, tool, filt)
        rows.append([f"compute-sanitizer {tool}, fastformer_gpu_tests {r['filter'] or '(filter unknown)'}",
                     r["required"], r["measured"].replace("**", ""), r["verdict"]])
    return rows


def correctness_section(c):
    """Correctness on the GPU: ctest -L gpu, the base-long parity test and the sanitizers, with
    the tests each sanitizer ran."""
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
                   c.stage_why("parity-base-long")])
    for what, parsed, sid in (("ctest -L gpu, FASTFORMER_CUDA_OPT_IN=all", c.ctest_opt_in, "ctest-gpu-opt-in"),
                              ("base-long parity, FASTFORMER_CUDA_OPT_IN=all", c.parity_opt_in,
                               "parity-base-long-opt-in")):
        c_rows.append([what, f"{parsed['passed']} passed, {parsed['skipped']} skipped, {parsed['failed']} failed of "
                       f"{parsed['total']}" if isinstance(parsed, dict) else "—", c.stage_why(sid)])
    tests = []
    for sid, tool, filt in SANITIZERS:
        r = sanitizer_result(c, sid, tool, filt)
        c_rows.append([f"compute-sanitizer {tool} ({r['filter'] or 'filter unknown'})", r["measured"], r["stage"]])
        tests += [f"- {t}" for t in r["tests"]]
    lines += table(["check", "result", "stage"], c_rows)
    lines.append("")
    if tests:
        lines.append("The tests each sanitizer ran:")
        lines.append("")
        lines += tests
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
                   [[s["id"], s["title"], c.status_label(s), s["seconds"], s["at"], s["limit"], s["note"]]
                    for s in c.stages])
    lines.append("")
    lines.append(f"Total: {meta.get('elapsed_s', '?')} s of the {meta.get('budget_s', '?')} s budget "
                 f"(the report and the log archive come after the last stage).")
    lines.append("")
    return lines


def failures_section(c):
    """The last lines of each failed stage's output; nothing when none failed."""
    lines = []
    shown = [s for s in c.stages if s in c.failed or s in c.tool_errors]
    if shown:
        lines.append("## Failures (last lines of each failed stage)")
        lines.append("")
        for s in shown:
            lines.append(f"### {s['id']}: {c.status_label(s)} ({s['note']})")
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
    return (header_section(c, t_rows) + engine_section(c) + old_new_section(c) + opt_in_section(c)
            + server_section(c) + baselines_section(c)
            + ratios_section(c)
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
          "  build: " + cutlass_line(c.cutlass),
          "  opt-in: " + opt_in_decision(c).replace("**", ""),
          f"  time: {meta.get('elapsed_s', '?')} s of {meta.get('budget_s', '?')} s; per stage: "
          + ", ".join(f"{s['id']} {s['seconds']}" for s in c.stages if s["status"] != "skipped")]
    for t in t_rows:
        sm.append(f"  [{t[3][:100]}] {t[0][:90]}: {t[2]} (target {t[1]})")
    for s in c.stages:  # with the stage's last words: the output tail may be all one reads
        if s in c.tool_errors:
            sm.append(f"  stage {s['id']}: {c.status_label(s)} ({s['note'][:200]})")
        if s not in c.failed:
            continue
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

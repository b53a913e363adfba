#!/usr/bin/env python3
"""Alternated fastformer-bench runs in one stage of tests/gpu/gpu-check.sh (issue 48): A, B, A, B
on the same shapes, so that a clock or thermal drift during the run falls on both sides alike.

    bench_ab.py --out RUN/ID.json --log-dir RUN/ID-logs --seconds 2 \\
        --lengths fixed:512 --lengths fixed:65536 \\
        --common "--model-dir M --backend cuda --dtype bfloat16 --batch-tokens 65536 --json" \\
        --arm old  .deps/baseline/bin/fastformer-bench  LD_LIBRARY_PATH  ""  2 \\
        --arm new  .deps/server/bin/fastformer-bench    LD_LIBRARY_PATH  ""  2 \\
        [--meta KEY=VALUE ...]

Each --arm is LABEL BINARY LD_LIBRARY_PATH EXTRA_ARGS ROUNDS. For each --lengths in turn, round r
runs every arm with at least r rounds, in the order given (old, new, old, new; or default, all,
cutlass-gelu, fused-key-pool, default, all). A run is `BINARY COMMON --lengths L --seconds S
EXTRA_ARGS` with LD_LIBRARY_PATH set (the rest of the environment, FASTFORMER_CUBLASLT_LIBRARY
included, passed on); its stdout's last JSON object is its result. The JSON file is rewritten
after every run, so a stage stopped by its cap keeps the runs it finished; report.py computes the
means and ratios from it ("Old and new in one run", "Opt-in kernels"). Exits 0 when every run gave
a figure, else 1. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

from report import last_json_in  # beside this file: its directory is on sys.path


def run_one(arm, common, lengths, seconds, log_dir, tag, timeout):
    cmd = [arm["bin"], *common, "--lengths", lengths, "--seconds", str(seconds), *arm["args"]]
    env = dict(os.environ)
    if arm["lib_path"]:
        env["LD_LIBRARY_PATH"] = arm["lib_path"]
    t = time.monotonic()
    run = {"arm": arm["label"], "lengths": lengths, "command": shlex.join(cmd)}
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc, err = 124, f"did not end in {timeout:g} s"
    except OSError as e:
        rc, out, err = 127, "", str(e)
    run["wall_s"] = round(time.monotonic() - t, 2)
    run["rc"] = rc
    if log_dir:
        with open(os.path.join(log_dir, tag + ".out"), "w") as f:
            f.write(out)
        with open(os.path.join(log_dir, tag + ".err"), "w") as f:
            f.write(err)
    result = last_json_in(out)
    tps = result.get("tokens_per_second") if result else None
    run["tokens_per_second"] = tps
    run["result"] = result
    if rc != 0 or not isinstance(tps, (int, float)):
        last = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()]
        run["error"] = f"exit {rc}" + (f": {last[-1][:300]}" if last else "")
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--log-dir")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--lengths", action="append", required=True)
    ap.add_argument("--common", default="", help="arguments of every run, split like a shell")
    ap.add_argument("--arm", nargs=5, action="append", required=True,
                    metavar=("LABEL", "BINARY", "LD_LIBRARY_PATH", "EXTRA_ARGS", "ROUNDS"))
    ap.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--timeout", type=float, default=None, help="per run [seconds + 60]")
    a = ap.parse_args(argv)
    arms = [{"label": label, "bin": b, "lib_path": lib, "args": shlex.split(extra), "rounds": int(rounds)}
            for label, b, lib, extra, rounds in a.arm]
    common = shlex.split(a.common)
    if a.log_dir:
        os.makedirs(a.log_dir, exist_ok=True)
    meta = dict(m.partition("=")[::2] for m in a.meta)
    doc = {"seconds": a.seconds, "lengths": a.lengths, "common": a.common, "meta": meta,
           "arms": [{k: v for k, v in arm.items()} for arm in arms], "runs": [], "complete": False}
    timeout = a.timeout or a.seconds + 60

    def write():
        tmp = a.out + ".part"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, a.out)

    write()
    ok = True
    for lengths in a.lengths:
        for r in range(1, max(arm["rounds"] for arm in arms) + 1):
            for arm in arms:
                if arm["rounds"] < r:
                    continue
                tag = f"{lengths.replace(':', '-')}-{arm['label']}-{r}"
                run = run_one(arm, common, lengths, a.seconds, a.log_dir, tag, timeout)
                run["round"] = r
                doc["runs"].append(run)
                ok = ok and "error" not in run
                print(f"bench_ab: {lengths} {arm['label']} round {r}: "
                      + (f"{run['tokens_per_second']:.6g} tokens/s" if "error" not in run else run["error"])
                      + f" ({run['wall_s']} s)", flush=True)
                write()
    doc["complete"] = True
    write()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

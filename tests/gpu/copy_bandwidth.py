#!/usr/bin/env python3
"""Device-to-device copy bandwidth, the ceiling for issue 4's "non-GEMM kernels at no
less than 70% of the measured copy bandwidth".

    copy_bandwidth.py [--bytes 1073741824] [--repeats 20] [--warmup 3] [--device cuda|cpu]

Copies one tensor of --bytes into another (dst.copy_(src)) --repeats times, timed
with CUDA events after --warmup copies, and prints one JSON object:
bandwidth_bytes_per_second counts the bytes read AND written (2 x bytes per copy,
the same convention as a kernel's "bytes moved"), copy_bytes_per_second the bytes
copied; best_* use the fastest single copy, the others the mean. --device cpu
(small --bytes) exists to test the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def measure(nbytes: int, repeats: int, warmup: int, device: str) -> dict:
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch.cuda.is_available() is False")
    dev = torch.device(device)
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    times = []
    for _ in range(warmup):
        dst.copy_(src)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    if not torch.equal(dst[:4096], src[:4096]):
        raise RuntimeError("the copy is wrong")
    mean = sum(times) / len(times)
    best = min(times)
    out = {
        "device": device,
        "bytes": nbytes,
        "repeats": repeats,
        "seconds_per_copy_mean": mean,
        "seconds_per_copy_best": best,
        "bandwidth_bytes_per_second": 2 * nbytes / mean,
        "best_bandwidth_bytes_per_second": 2 * nbytes / best,
        "copy_bytes_per_second": nbytes / mean,
        "torch_version": torch.__version__,
    }
    if dev.type == "cuda":
        out["device_name"] = torch.cuda.get_device_name()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=int, default=1 << 30)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    a = ap.parse_args(argv)
    if a.bytes < 4096 or a.repeats < 1:
        print("copy_bandwidth: --bytes must be >= 4096 and --repeats >= 1", file=sys.stderr)
        return 2
    try:
        r = measure(a.bytes, a.repeats, a.warmup, a.device)
    except ValueError as e:
        print(f"copy_bandwidth: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The CPU as /proc/cpuinfo gives it, for benchmark headers and JSON (no dependencies).

cpu_info() -> {"model_name", "vendor", "family", "model", "stepping", "logical_cpus",
               "flags": {flag: bool for FLAGS}}
cpu_flags() -> every flag of the first processor, as a set.
describe(info) -> one line: model name, family/model, and the flags present.
"""

from __future__ import annotations

import os
import platform

# The flags that decide which GEMM kernels a library dispatches to (MLAS, OpenBLAS, oneDNN).
FLAGS = ("fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
         "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8")


def _first_processor(path) -> dict:
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                k, _, v = line.partition(":")
                fields.setdefault(k.strip(), v.strip())
    except OSError:
        pass
    return fields


def cpu_flags(path="/proc/cpuinfo") -> set:
    return set(_first_processor(path).get("flags", "").split())


def cpu_info(path="/proc/cpuinfo") -> dict:
    fields = _first_processor(path)
    flags = set(fields.get("flags", "").split())
    return {
        "model_name": fields.get("model name", "unknown CPU"),
        "vendor": fields.get("vendor_id"),
        "family": fields.get("cpu family"),
        "model": fields.get("model"),
        "stepping": fields.get("stepping"),
        "logical_cpus": os.cpu_count(),
        "flags": {fl: fl in flags for fl in FLAGS},
    }


def describe(info=None) -> str:
    info = info or cpu_info()
    present = [f for f, on in info["flags"].items() if on]
    absent = [f for f, on in info["flags"].items() if not on]
    return (f"{info['model_name']} (family {info['family']}, model {info['model']}, "
            f"stepping {info['stepping']}), {info['logical_cpus']} logical CPUs, "
            f"{platform.system()} {platform.release()}; flags: {' '.join(present) or 'none'}"
            + (f"; not: {' '.join(absent)}" if absent else ""))


if __name__ == "__main__":
    print(describe())

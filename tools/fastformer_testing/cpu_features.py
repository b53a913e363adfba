"""What this CPU offers the CPU engine, read independently of the engine (for the tests of what it
chose): the flags of /proc/cpuinfo, and ONEDNN_MAX_CPU_ISA, which caps what oneDNN uses.

  cpu_flags()          the kernel's flags for the first CPU (empty where /proc/cpuinfo is not)
  has_bf16_gemms(env)  whether oneDNN runs bfloat16 GEMMs in hardware here (AVX512_BF16 or AMX)
                       under `env`'s ONEDNN_MAX_CPU_ISA: what --dtype auto turns into bfloat16
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

# The kernel's names for the bfloat16 dot-product instructions: AVX512_BF16 (Cooper Lake, Zen 4
# and later) and AMX's bfloat16 tiles (Sapphire Rapids and later).
BF16_FLAGS = {"avx512_bf16", "amx_bf16"}
# The values of ONEDNN_MAX_CPU_ISA that leave oneDNN its bfloat16 GEMMs (oneDNN's ISA names at or
# above avx512_core_bf16); any other cap (AVX2, AVX512_CORE, ...) takes them away.
BF16_ISA_CAPS = {"ALL", "AVX512_CORE_BF16", "AVX512_CORE_AMX", "AVX512_CORE_FP16", "AVX512_CORE_AMX_FP16",
                 "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2"}


def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_bf16_gemms(env: Optional[Mapping[str, str]] = None) -> bool:
    """True when the CPU has AVX512_BF16 or AMX and `env` (default: this process's) does not cap
    oneDNN below them."""
    cap = (os.environ if env is None else env).get("ONEDNN_MAX_CPU_ISA")
    return bool(BF16_FLAGS & cpu_flags()) and (not cap or cap.upper() in BF16_ISA_CAPS)

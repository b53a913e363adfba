#!/usr/bin/env python3
"""Which BLAS PyTorch runs its CPU matmuls on, how fast, and what to do when it is slow.

Debian's python3-torch is built with BLAS_INFO=generic: libtorch_cpu.so links
libblas.so.3, which is whatever the libblas.so.3-<multiarch> alternative points at. With
only libblas3 installed that is netlib's reference BLAS (a single-threaded torch matmul
2048x256x256 ran at 6.3 GFLOP/s there, 80.9 on OpenBLAS: issue 21), so training the demo
model and the golden tests' PyTorch reference crawl. deploy/install-deps.sh installs
libopenblas0-pthread and checks the alternative; this module checks what a process
actually got:

    import torch_blas
    note = torch_blas.preset_openblas_coretype()   # BEFORE torch or numpy is imported
    import torch
    result = torch_blas.check()                    # one timed matmul, well under a second
    print(result.verdict)                          # "torch BLAS: ..." one line
    if result.warning: print(result.warning)       # what to install or set, or None

preset_openblas_coretype: OpenBLAS picks its kernels ("core") at load by the CPU model;
releases older than the CPU (Debian 12's 0.3.21 on a Sapphire/Emerald Rapids Xeon:
family 6 model 207) fall back to the generic "Prescott" SSE3 core, 3-5x slower than its
SkylakeX AVX-512 one. When OPENBLAS_CORETYPE is unset, the CPU has AVX-512 (or AVX2) and a
probe in a child process (OpenBLAS's choice is fixed once it is loaded in this one) finds
OpenBLAS on a core below that, it sets os.environ["OPENBLAS_CORETYPE"] (SkylakeX, or
Haswell) for this process and its children and returns a line saying so. It must run
before anything loads libblas.so.3 (torch, numpy); it does nothing when OPENBLAS_CORETYPE
is already set, so setting it yourself (to any core) keeps OpenBLAS's own choice out.

check() names the library from /proc/self/maps (libblas/libopenblas/MKL/BLIS paths), asks
OpenBLAS its core (openblas_get_corename through ctypes), times the matmul on one thread
(torch's and OpenBLAS's thread counts set to 1 for the timing, then restored) and returns
a warning naming the fix when the BLAS is the reference one, when OpenBLAS runs a core
below the CPU's, or when the speed is under `threshold_gflops`. Everything it reads
(maps text, core name, CPU flags, speed) can be passed in, for the tests.

    /usr/bin/python3 tools/torch_blas.py     # prints the verdict (and the warning)

Standard library and torch only.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_info import cpu_flags  # noqa: E402  (the CPU's flags, read once for every tool)

INSTALL_HINT = "apt-get install libopenblas0-pthread"  # deploy/install-deps.sh does it
DEFAULT_THRESHOLD_GFLOPS = 15.0  # single thread; reference BLAS ~6, OpenBLAS AVX2/AVX-512 50-100
SHAPE = (2048, 256, 256)  # M, K, N: the measurement, ~0.27 GFLOP

# OpenBLAS's x86-64 dynamic cores (openblas_get_corename) by the widest vector ISA they use.
_CORE_TIERS = {
    **{c: 0 for c in ("katmai", "coppermine", "northwood", "prescott", "banias", "core2",
                      "penryn", "dunnington", "nehalem", "atom", "athlon", "opteron",
                      "opteron(sse3)", "barcelona", "nano", "bobcat")},
    **{c: 1 for c in ("sandybridge", "bulldozer", "piledriver", "steamroller")},
    **{c: 2 for c in ("haswell", "excavator", "zen")},
    **{c: 3 for c in ("skylakex", "cooperlake", "sapphirerapids")},
}
_TIER_CORE = {1: "Sandybridge", 2: "Haswell", 3: "SkylakeX"}  # what OPENBLAS_CORETYPE to ask for
_TIER_NAME = {0: "SSE", 1: "AVX", 2: "AVX2", 3: "AVX-512"}


def cpu_tier(flags) -> int:
    """The widest OpenBLAS kernel family the CPU can run (3 AVX-512, 2 AVX2+FMA, 1 AVX, 0)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"} <= set(flags):
        return 3
    if {"avx2", "fma"} <= set(flags):
        return 2
    if "avx" in flags:
        return 1
    return 0


def core_tier(corename):
    return _CORE_TIERS.get((corename or "").strip().lower())


def recommended_coretype(corename, flags):
    """OPENBLAS_CORETYPE to set when OpenBLAS's core is below what the CPU runs, else None."""
    have = core_tier(corename)
    want = cpu_tier(flags)
    if have is None or have >= want or want not in _TIER_CORE:
        return None
    return _TIER_CORE[want]


def blas_libraries(maps_text: str | None = None) -> list:
    """The BLAS shared objects mapped into this process (from /proc/self/maps), in load order."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:
            return []
    seen = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5].strip()
        base = os.path.basename(path).lower()
        if any(k in base for k in ("blas", "mkl_core", "mkl_rt", "blis")) and path not in seen:
            seen.append(path)
    return seen


def classify(libraries) -> tuple:
    """(kind, path): kind is openblas, mkl, blis, atlas, reference or none (torch's own)."""
    for kind, keys in (("openblas", ("openblas",)), ("mkl", ("mkl",)), ("blis", ("blis",)),
                       ("atlas", ("atlas",))):
        for p in libraries:
            if any(k in p.lower() for k in keys):
                return kind, p
    for p in libraries:
        if "libblas.so" in os.path.basename(p):
            return "reference", p  # netlib's: /usr/lib/<multiarch>/blas/libblas.so.3.x
    return "none", None


def openblas_info(path):
    """(corename, threads) from the loaded OpenBLAS, or (None, None)."""
    if not path:
        return None, None
    try:
        lib = ctypes.CDLL(path)
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode("ascii", "replace").strip()
        threads = int(lib.openblas_get_num_threads())
        return core, threads
    except (OSError, AttributeError):
        return None, None


def _openblas_set_threads(path, n):
    try:
        ctypes.CDLL(path).openblas_set_num_threads(int(n))
        return True
    except (OSError, AttributeError):
        return False


def set_threads(n: int) -> None:
    """torch.set_num_threads(n), and OpenBLAS's own pool to n when OpenBLAS is loaded: the pthread
    build keeps one thread per core whatever torch is told, as Debian's torch cannot tell it."""
    import torch
    torch.set_num_threads(n)
    kind, path = classify(blas_libraries())
    if kind == "openblas":
        _openblas_set_threads(path, n)


def time_matmul(shape=SHAPE, min_seconds=0.15, max_reps=8) -> float:
    """GFLOP/s of one torch float32 matmul on one thread (best of a few; about 0.1-0.6 s)."""
    import torch
    m, k, n = shape
    g = torch.Generator().manual_seed(0)  # not the global RNG: the caller's seeding is untouched
    a = torch.rand(m, k, generator=g)
    b = torch.rand(k, n, generator=g)
    kind, path = classify(blas_libraries())
    torch_threads = torch.get_num_threads()
    ob_threads = openblas_info(path)[1] if kind == "openblas" else None
    torch.set_num_threads(1)
    if ob_threads:
        _openblas_set_threads(path, 1)
    try:
        torch.mm(a, b)  # warm-up (page faults, thread pools)
        best = float("inf")
        t_start = time.perf_counter()
        for _ in range(max_reps):
            t = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t)
            if time.perf_counter() - t_start >= min_seconds:
                break
    finally:
        torch.set_num_threads(torch_threads)
        if ob_threads:
            _openblas_set_threads(path, ob_threads)
    return 2.0 * m * k * n / best / 1e9


@dataclass
class BlasCheck:
    kind: str                 # openblas, mkl, blis, atlas, reference, none (torch's built-in)
    library: str | None       # the mapped file it is
    libraries: list = field(default_factory=list)
    corename: str | None = None
    gflops: float = 0.0       # single-thread torch matmul 2048x256x256
    threshold_gflops: float = DEFAULT_THRESHOLD_GFLOPS
    coretype_env: str | None = None  # OPENBLAS_CORETYPE as this process saw it
    warning: str | None = None

    @property
    def verdict(self) -> str:
        what = {"openblas": "OpenBLAS", "mkl": "MKL", "blis": "BLIS", "atlas": "ATLAS",
                "reference": "netlib reference BLAS", "none": "torch's built-in BLAS"}[self.kind]
        core = f", core {self.corename}" if self.corename else ""
        env = f", OPENBLAS_CORETYPE={self.coretype_env}" if self.coretype_env else ""
        lib = f" ({self.library})" if self.library else ""
        state = ("SLOW" if self.gflops < self.threshold_gflops or self.kind == "reference"
                 else "could be faster (see the warning)" if self.warning else "ok")
        return (f"torch BLAS: {what}{core}{env}{lib}; matmul {'x'.join(map(str, SHAPE))} on 1 thread "
                f"{self.gflops:.1f} GFLOP/s: {state}")


def check(threshold_gflops: float = DEFAULT_THRESHOLD_GFLOPS, gflops: float | None = None,
          maps_text: str | None = None, corename: str | None = "probe", flags=None,
          environ=None) -> BlasCheck:
    """Measure (unless `gflops` is given) and judge. The other arguments replace what is read
    from this process and machine (for tests); corename="probe" asks the loaded OpenBLAS."""
    environ = os.environ if environ is None else environ
    if maps_text is None or gflops is None:
        import torch  # noqa: F401  (loads libtorch_cpu.so and with it libblas.so.3)
    libs = blas_libraries(maps_text)
    kind, path = classify(libs)
    if corename == "probe":
        corename = openblas_info(path)[0] if kind == "openblas" else None
    flags = cpu_flags() if flags is None else set(flags)
    if gflops is None:
        gflops = time_matmul()
    r = BlasCheck(kind=kind, library=path, libraries=libs, corename=corename, gflops=gflops,
                  threshold_gflops=threshold_gflops, coretype_env=environ.get("OPENBLAS_CORETYPE"))
    slow = gflops < threshold_gflops
    want = recommended_coretype(corename, flags) if kind == "openblas" else None
    speed = (f"torch's matmul ran at {gflops:.1f} GFLOP/s on one thread "
             f"(expected at least {threshold_gflops:g})")
    if kind == "reference":
        r.warning = (f"PyTorch runs on netlib's reference BLAS ({path}): {speed}. Install OpenBLAS: "
                     f"`{INSTALL_HINT}` (deploy/install-deps.sh does it), then check "
                     f"`update-alternatives --display libblas.so.3-$(gcc -print-multiarch)` points "
                     f"at openblas-pthread; training the demo model is ~10x faster on it.")
    elif want:
        why = (f"OPENBLAS_CORETYPE={r.coretype_env} in the environment asks for it"
               if r.coretype_env else "this OpenBLAS does not know the CPU model")
        r.warning = (f"OpenBLAS runs its {corename} core ({_TIER_NAME[core_tier(corename)]} kernels) "
                     f"on a CPU with {_TIER_NAME[cpu_tier(flags)]} ({why}): {speed}. Set "
                     f"`OPENBLAS_CORETYPE={want}` in the environment before starting Python "
                     f"(tools/train_demo_model.py and the golden tests set it themselves when it is "
                     f"unset).")
    elif slow:
        hint = (f"install OpenBLAS (`{INSTALL_HINT}`) or check what libblas.so.3 points at"
                if kind in ("none", "atlas") else "the machine may be busy (other builds or jobs)")
        r.warning = f"PyTorch's CPU matmul is slow: {speed}; {hint}."
    return r


_PROBE = r"""
import ctypes, sys
try:
    lib = ctypes.CDLL("libblas.so.3")
    f = lib.openblas_get_corename
except (OSError, AttributeError):
    sys.exit(0)
f.restype = ctypes.c_char_p
print(f().decode("ascii", "replace"))
"""


def probe_openblas_core(python: str | None = None, env=None, timeout: float = 20.0):
    """The core a fresh process's OpenBLAS picks (libblas.so.3 as the dynamic loader finds it,
    as libtorch_cpu.so does), or None when libblas.so.3 is not OpenBLAS."""
    env = dict(os.environ if env is None else env)
    env.pop("OPENBLAS_VERBOSE", None)
    try:
        r = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except (OSError, subprocess.SubprocessError):
        return None
    core = r.stdout.strip()
    return core or None


def preset_openblas_coretype(environ=None, flags=None, probe=probe_openblas_core):
    """Set OPENBLAS_CORETYPE when OpenBLAS would run a core below the CPU's; call it before torch
    or numpy is imported. Returns a line saying what it did, or None when nothing was needed."""
    environ = os.environ if environ is None else environ
    if environ.get("OPENBLAS_CORETYPE"):
        return None  # the user's choice
    flags = cpu_flags() if flags is None else set(flags)
    if cpu_tier(flags) < 1:
        return None
    if environ is os.environ and any(m in sys.modules for m in ("torch", "numpy")):
        return ("OPENBLAS_CORETYPE not preset: torch or numpy was imported first "
                "(OpenBLAS has already chosen its core)")
    core = probe(env=environ)
    want = recommended_coretype(core, flags)
    if not want:
        return None
    environ["OPENBLAS_CORETYPE"] = want
    return (f"OpenBLAS would run its {core} core ({_TIER_NAME[core_tier(core)]} kernels) on this {_TIER_NAME[cpu_tier(flags)]} CPU; "
            f"set OPENBLAS_CORETYPE={want} for this process (set OPENBLAS_CORETYPE yourself to "
            f"choose another)")


def main() -> int:
    note = preset_openblas_coretype()
    if note:
        print(note)
    r = check()
    print(r.verdict)
    if r.warning:
        print(f"warning: {r.warning}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

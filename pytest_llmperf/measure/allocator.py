"""Steady host memory allocation for timed runs (glibc's malloc).

glibc serves a large block (over 128 KiB at start) with a fresh mmap, whose pages fault in on first
touch, and raises that threshold each time such a block is freed; it also returns the heap's free top
to the system past a trim threshold. So whether a tensor of a given size lands in page-faulting fresh
memory or in reused heap memory depends on everything the process allocated and freed before it: the
same code settles into a faster or slower mode per shape, differently in each pytest session. Measured
on the cpu target, one test's prefill ran 1.28x slower in some sessions than in others; with the
thresholds fixed, the largest shift of unchanged code over 12 sessions fell from 1.47x to 1.26x
(docs/notes/noise.md, "What moved the timings of unchanged code, and what did not"). Fixing them makes every session
allocate alike. Elsewhere (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

# mallopt parameters from glibc's <malloc.h>.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: The largest threshold glibc's dynamic scheme would reach on 64-bit: blocks up to it come from the heap.
MMAP_THRESHOLD = 32 * 2**20
#: Keep up to this much freed memory at the heap's top instead of returning (and refaulting) it.
TRIM_THRESHOLD = 2**30

MODES = ("steady", "system")


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def steady_malloc() -> str:
    """Fix glibc's mmap and trim thresholds for the rest of the process; say what was done."""
    libc = _libc()
    if libc is None:
        return "system (not glibc: left as it is)"
    if libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "system (glibc refused mallopt)"
    return f"steady (glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB)"


def steady_malloc_env() -> dict[str, str]:
    """The same thresholds as environment variables, which glibc reads when a process starts: a worker
    process allocates steadily from its first instruction, whatever its conftests import before the
    plugin's `steady_malloc()` could run (importing torch first changes the heap a model lands in)."""
    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}

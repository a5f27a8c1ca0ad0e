"""Peak memory of one run: what a change that pushes the next batch size out of memory shows first.

- `peak_rss_mib`: the measuring process's peak resident set during the run. Linux keeps the peak
  (VmHWM in /proc/<pid>/status) and lets a process reset it (writing 5 to /proc/<pid>/clear_refs), so
  each run's own peak is read exactly, with no sampling thread. Elsewhere the metric is absent.
- `server_peak_rss_mib`: the same, summed over the process tree of a server a fixture started.
- `cuda_peak_allocated_mib`: `torch.cuda.max_memory_allocated()` after `reset_peak_memory_stats()`,
  when torch has initialised CUDA in this process.
- `gpu_used_mib`: NVML's used memory of the GPUs after the run (every process on them, the server's
  included), when pynvml is importable and a GPU is present.

Sizes are MiB (2^20 bytes). On a fixed shape these are nearly deterministic, so the gate holds them
to a tolerance (judge/memory_gate.py), not to a rank test.

Steady host memory allocation for timed runs (glibc's malloc, `steady_malloc`): glibc serves a large block (over 128
KiB at start) with a fresh mmap, whose pages fault in on first touch, and raises that threshold each time such a
block is freed; it also returns the heap's free top to the system past a trim threshold. So whether a tensor of a
given size lands in page-faulting fresh memory or in reused heap memory depends on everything the process allocated
and freed before it: the same code settles into a faster or slower mode per shape, differently in each pytest
session. Measured on the cpu target, one test's prefill ran 1.28x slower in some sessions than in others; with the
thresholds fixed, the largest shift of unchanged code over 12 sessions fell from 1.47x to 1.26x (docs/notes/noise.md,
"What moved the timings of unchanged code, and what did not"). Fixing them makes every session allocate alike.
Elsewhere (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from .gpu import nvml_used_bytes

MIB = 2**20
_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.MULTILINE)


def peak_rss_bytes(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The peak resident set of `pid` since it started or since its peak was last reset; None if unknown."""
    try:
        found = _HWM.search((proc / str(pid) / "status").read_text())
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def reset_peak_rss(pid: int, proc: Path = Path("/proc")) -> bool:
    """Make the peak resident set start again from the current one (Linux >= 4.0); False where it cannot."""
    try:
        (proc / str(pid) / "clear_refs").write_text("5")
    except OSError:
        return False
    return True


def tree_pids(pid: int) -> list[int]:
    """`pid` and its descendants (a server's workers), as far as they still run."""
    try:
        top = psutil.Process(pid)
        return [top.pid, *(p.pid for p in top.children(recursive=True))]
    except psutil.Error:
        return []


def _cuda() -> Any | None:
    """torch.cuda when this process already uses CUDA (never imports torch, never initialises CUDA)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        return torch.cuda if torch.cuda.is_initialized() else None
    except Exception:  # a torch without CUDA support
        return None


class MemoryMeter:
    """Around one run: `start()` resets the peaks, `stop()` returns the run's memory metrics in MiB."""

    def __init__(
        self,
        server_pids: Callable[[], Sequence[int]] = lambda: (),
        *,
        nvml: Any = None,
        pid: int | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.server_pids = server_pids
        self.nvml = nvml
        self.pid = os.getpid() if pid is None else pid
        self.proc = proc
        self._servers: list[int] = []
        self._resettable = False

    def start(self) -> None:
        self._resettable = reset_peak_rss(self.pid, self.proc)
        self._servers = [p for top in self.server_pids() for p in tree_pids(top)]
        self._servers = [p for p in self._servers if reset_peak_rss(p, self.proc)]
        cuda = _cuda()
        if cuda is not None:
            cuda.reset_peak_memory_stats()

    def stop(self) -> dict[str, float]:
        found: dict[str, float] = {}
        own = peak_rss_bytes(self.pid, self.proc) if self._resettable else None
        if own is not None:
            found["peak_rss_mib"] = own / MIB
        server = [peak_rss_bytes(p, self.proc) for p in self._servers]
        if self._servers and all(v is not None for v in server):  # a worker that exited mid-run: not a peak
            found["server_peak_rss_mib"] = sum(v for v in server if v is not None) / MIB
        cuda = _cuda()
        if cuda is not None:
            found["cuda_peak_allocated_mib"] = cuda.max_memory_allocated() / MIB
        if self.nvml is not None:
            used = nvml_used_bytes(self.nvml)
            if used is not None:
                found["gpu_used_mib"] = used / MIB
        return found


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

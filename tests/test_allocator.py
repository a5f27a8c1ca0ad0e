"""The steady allocator: in a fresh process, a 16 MiB block comes from the heap, not from a fresh mmap."""

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt thresholds are glibc's")

# mallinfo2().hblkhd: bytes held in mmapped blocks (glibc >= 2.33).
PROBE = """
import ctypes, sys
from pytest_llmperf.measure.memory import steady_malloc

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype = ctypes.c_void_p
if sys.argv[1] == "steady":
    print(steady_malloc())
before = libc.mallinfo2().hblkhd
block = libc.malloc(16 * 2**20)
print(libc.mallinfo2().hblkhd - before)
"""


def probe(mode):
    """The probe's output lines in a fresh process: what steady_malloc said (if called), mmapped bytes."""
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


@pytest.mark.slow
def test_steady_serves_large_blocks_from_the_heap():
    said, mmapped = probe("steady")
    assert said.startswith("steady (glibc mmap threshold 32 MiB") and int(mmapped) == 0
    (mmapped,) = probe("system")
    assert int(mmapped) >= 16 * 2**20  # glibc's default: a fresh mmap, whose pages fault in on first touch


def test_malloc_option_is_checked_and_shown_in_the_header(pytester):
    result = pytester.runpytest("-o", "llmperf_malloc=jemalloc")
    assert result.ret == 4
    result.stderr.fnmatch_lines(["*bad value for -o llmperf_malloc: expected one of steady, system*"])
    pytester.runpytest("--co").stdout.fnmatch_lines(["*malloc=steady*"])

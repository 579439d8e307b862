"""What the benchmarks print about the machine they ran on, and this process's memory (Linux)."""
from __future__ import annotations

import ctypes
import os


def machine_load() -> str:
    """1-minute load average and CPU count: other processes on the machine skew timings."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def rss_bytes() -> int:
    """This process's resident set size now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak RSS since start or since :func:`reset_peak_rss` (Linux: VmHWM)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


def reset_peak_rss() -> None:
    """Start a new peak: Linux resets VmHWM to the current RSS on "5" in clear_refs."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def release_freed_memory() -> None:
    """Hand the heap pages glibc holds free back to the OS (``malloc_trim(0)``), so that RSS
    starts from what is in use: glibc keeps freed blocks below its mmap threshold (which rises
    to 32 MiB once a larger block is freed), so a phase reusing them would show no growth."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the growth is then measured from a higher RSS
        pass

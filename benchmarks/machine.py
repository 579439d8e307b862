"""What the benchmarks print about the machine they ran on."""
from __future__ import annotations

import os


def machine_load() -> str:
    """1-minute load average and CPU count: other processes on the machine skew timings."""
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"

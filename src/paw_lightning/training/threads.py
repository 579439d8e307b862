"""Torch threads from the CPU cores other processes leave free (``threads: auto``).

On a small shared CPU, a process with as many threads as cores next to another busy process
runs several times slower than one with a thread per free core (measured 6–8× on 2 cores), so
``auto`` measures the machine's load over a short interval before the model loads (this
process is idle then) and takes ``max(1, round(cores − busy))`` threads. A measurement that
leaves fewer threads than cores is repeated twice and the lowest load kept: a brief spike (a
process just exiting) would otherwise halve a whole run's threads. ``OMP_NUM_THREADS``
set by the user, an explicit number, or a CUDA run keep their own choice.
"""
from __future__ import annotations

import os

import psutil
import torch


def free_cores(cores: int, busy: float) -> int:
    """``max(1, round(cores − busy))``: the threads that fit beside ``busy`` cores of other work."""
    return max(1, int(cores - busy + 0.5))


def busy_cores(interval: float = 0.5) -> float:
    """Cores in use by all processes over ``interval`` seconds (system-wide CPU percent)."""
    return psutil.cpu_percent(interval=interval) / 100.0 * (os.cpu_count() or 1)


def choose_threads(setting: int | str | None) -> str | None:
    """Apply ``setting`` (``auto``, a number, or ``None``: torch's default); the line that says
    what was chosen and why (``None`` when nothing changed)."""
    if setting is None or torch.cuda.is_available():
        return None
    if setting != "auto":
        if not isinstance(setting, int) or setting < 1:
            raise ValueError(f"threads must be 'auto', a number >= 1 or null (got {setting!r})")
        torch.set_num_threads(setting)
        return f"torch threads: {setting} (threads: {setting})"
    if os.environ.get("OMP_NUM_THREADS"):
        return f"torch threads: {torch.get_num_threads()} (OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']})"
    cores, busy = os.cpu_count() or 1, busy_cores()
    if free_cores(cores, busy) < cores:
        busy = min(busy, busy_cores(), busy_cores())
    torch.set_num_threads(free_cores(cores, busy))
    return f"torch threads: {torch.get_num_threads()} of {cores} cores ({busy:.1f} busy with other processes; set threads: N to choose)"

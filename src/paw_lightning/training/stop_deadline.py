"""SIGTERM stops a run within a deadline, even a blocked one.

Lightning answers SIGTERM by stopping at the next training step boundary, which a run blocked
in a collective (a hung rank), a hung in-process environment or a minutes-long rollout never
reaches: the run seemed to ignore SIGTERM. Python runs signal handlers only between bytecodes of
the main thread, so no handler can help while it is blocked; but the interpreter's C-level
handler writes each signal's number to a *wakeup fd* at once. :func:`install` points that fd at a
pipe watched by a daemon thread: ``deadline_s`` seconds after a SIGTERM, if the process is still
alive, it prints one line and exits with code 143 (128 + SIGTERM) without cleanup. Lightning's own
orderly stop keeps the first ``deadline_s`` seconds. Checkpoints are written atomically, so
``last.ckpt`` is whole whatever moment the exit comes at.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

_installed = False


def _watch(read_fd: int, deadline_s: float) -> None:
    while True:
        data = os.read(read_fd, 64)
        if signal.SIGTERM in data:
            break
    time.sleep(deadline_s)
    print(f"error: SIGTERM received {deadline_s:g} s ago and the run has not stopped (blocked: a collective, an environment or a "
          "long rollout): exiting now; resume with --ckpt_path=<its last.ckpt>", file=sys.stderr, flush=True)
    os._exit(128 + signal.SIGTERM)


def install(deadline_s: float | None) -> None:
    """Exit ``deadline_s`` seconds after a SIGTERM if still running (None: never). Call it from
    the main thread before Lightning installs its handler (there must be a Python-level handler
    for SIGTERM for the wakeup fd to see it; Lightning installs one during fit)."""
    global _installed
    if deadline_s is None or _installed or threading.current_thread() is not threading.main_thread():
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd, deadline_s), name="sigterm-deadline", daemon=True).start()
    _installed = True

"""SIGTERM stops a run that is blocked (here: an in-process environment that hangs for an hour)
within ``stop_deadline_s``: exit code 143 and one line, where Lightning alone would wait for a
training step boundary that never comes."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from helpers import tiny_args

pytestmark = pytest.mark.slow  # a fit in a subprocess

FAULTY = "paw_lightning.envs.faulty.FaultyEnv"


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (``SigCgt`` of /proc/<pid>/status)."""
    caught = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigCgt:")).split()[1]
    return bool(int(caught, 16) >> (signal.SIGTERM - 1) & 1)


def test_sigterm_stops_a_blocked_run_within_the_deadline(tiny_model_dir, tmp_path):
    args = tiny_args(tiny_model_dir, tmp_path, f"--data.env={FAULTY}", "--data.env_kwargs={hang_at_step: 1}", "--stop_deadline_s=3")
    with open(tmp_path / "stderr.log", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=stderr)
    while not catches_sigterm(proc.pid):  # Lightning's handler is in place: the fit runs (then it reaches the hang)
        assert proc.poll() is None, (tmp_path / "stderr.log").read_text()[-3000:]
        time.sleep(0.2)
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGTERM did not stop the blocked run")
    errors = [line for line in (tmp_path / "stderr.log").read_text().splitlines() if line.startswith("error:")]
    assert proc.returncode == 143 and len(errors) == 1 and "SIGTERM received 3 s ago" in errors[0], errors

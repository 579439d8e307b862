"""A 2-process run (gloo on CPU) whose rank 1 dies or hangs: rank 0 stops within a bounded time
with one line naming rank 1 and the checkpoint to resume from, and the resume finishes the run
in the same MLflow run. A dead rank is noticed at the next collective; a hung one after the
strategy's collective timeout (``--trainer.strategy.init_args.timeout=h:m:s``)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import psutil
import torch

from helpers import ROOT, mlflow_runs, tiny_args

EPOCHS = 4


def start_fit(model_dir, workdir, *extra: str) -> subprocess.Popen:
    args = tiny_args(model_dir, workdir, "--trainer.accelerator=cpu", f"--trainer.max_epochs={EPOCHS}", *extra)
    with open(workdir / "stderr.log", "w") as stderr:  # a file, not a pipe: a stopped rank would hold a pipe open
        return subprocess.Popen([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=workdir, stdout=subprocess.DEVNULL,
                                stderr=stderr, env={**os.environ, "OMP_NUM_THREADS": "1"})


def rank_one_after_first_checkpoint(proc: subprocess.Popen, workdir) -> psutil.Process:
    while not list(workdir.glob("runs/**/last.ckpt")):
        assert proc.poll() is None, (workdir / "stderr.log").read_text()[-3000:]
        time.sleep(0.2)
    (rank_one,) = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.environ().get("LOCAL_RANK") == "1"]
    return rank_one


def the_error(proc: subprocess.Popen, workdir, bound_s: float) -> str:
    """Rank 0's one error line; it must exit (code 1) within ``bound_s`` seconds."""
    try:
        proc.wait(timeout=bound_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"rank 0 still runs {bound_s} s after its peer was lost")
    stderr = (workdir / "stderr.log").read_text()
    assert proc.returncode == 1, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


@pytest.mark.slow
def test_killed_rank_is_named_and_the_run_resumes(tiny_model_dir, tmp_path):
    ddp = ("--trainer.strategy=ddp", "--trainer.devices=2")
    proc = start_fit(tiny_model_dir, tmp_path, *ddp)
    rank_one = rank_one_after_first_checkpoint(proc, tmp_path)
    rank_one.send_signal(signal.SIGKILL)
    error = the_error(proc, tmp_path, bound_s=120)
    assert "rank 1 (pid" in error and "killed by SIGKILL" in error, error
    checkpoint = re.search(r"--ckpt_path=(\S+)", error).group(1)
    assert torch.load(checkpoint, weights_only=True)["epoch"] < EPOCHS - 1

    resumed = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.accelerator=cpu",
                              f"--trainer.max_epochs={EPOCHS}", *ddp), f"--ckpt_path={checkpoint}"], cwd=tmp_path, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert torch.load(checkpoint, weights_only=True)["epoch"] == EPOCHS - 1
    _, runs = mlflow_runs(tmp_path)
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"


@pytest.mark.slow
def test_hung_rank_times_out_with_its_name(tiny_model_dir, tmp_path):
    fsdp2 = ("-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--trainer.strategy.init_args.timeout=0:01:00")  # also bounds start-up: rank 1 imports everything on a loaded machine
    proc = start_fit(tiny_model_dir, tmp_path, *fsdp2)
    rank_one = rank_one_after_first_checkpoint(proc, tmp_path)
    rank_one.send_signal(signal.SIGSTOP)
    try:
        error = the_error(proc, tmp_path, bound_s=240)
    finally:
        if rank_one.is_running():
            rank_one.kill()
    assert "rank 1 (pid" in error and "stopped (SIGSTOP)" in error and "--ckpt_path=" in error, error


OBSERVED = """
import signal, subprocess, sys, time
from lightning.pytorch.strategies.launchers import subprocess_script
from paw_lightning.scale import peers

peers.name_lost_ranks_on_observer_kill(lambda: "/runs/last.ckpt")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
child.send_signal(signal.SIGKILL)
subprocess_script._launch_process_observer([child])  # what Lightning's launcher calls on rank 0
time.sleep(30)  # rank 0 busy (a rollout, a checkpoint write): the observer ends it
"""


@pytest.mark.slow
def test_lightnings_observer_ends_rank_zero_with_the_one_line():
    """When Lightning's child-process observer, not a collective, sees the dead rank first, rank 0
    still exits 1 with one line naming it (Lightning's own would SIGKILL rank 0: exit −9)."""
    result = subprocess.run([sys.executable, "-c", OBSERVED], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr[-2000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert re.fullmatch(r"error: rank 0 of 2: rank 1 \(pid \d+\) killed by SIGKILL; resume with --ckpt_path=/runs/last.ckpt", error), error


def test_a_process_reports_its_error_line_once(capsys):
    from paw_lightning.scale import peers

    if peers._REPORTED.locked():
        peers._REPORTED.release()
    assert peers.report("rank 0 of 2: first") and not peers.report("rank 0 of 2: second")
    assert capsys.readouterr().err == "error: rank 0 of 2: first\n"
    peers._REPORTED.release()  # other tests of this process may report

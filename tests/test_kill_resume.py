"""kill -9 of a whole training run, then ``fit --ckpt_path=last.ckpt``: the run loses at most the
interrupted epoch, finishes in the same MLflow run, and every metric it logs equals an
uninterrupted run's. Three of the campaign's kill points (``benchmarks/fault_campaign.py`` runs
all five phases at random moments): during a rollout, right after an optimizer step, and half-way
through writing ``last.ckpt``."""
from __future__ import annotations

import subprocess

import pytest

from paw_lightning.testing.kill import comparable_keys, differences, fit_command, kill_and_resume, run_metrics

from helpers import tiny_args

pytestmark = pytest.mark.slow  # fits killed and resumed in subprocesses

EPOCHS = 3
POINTS = [("rollout", 1, 0.2), ("optimizer_step", 2, 0.0), ("checkpoint", 1, 0.0)]  # (phase, epoch, seconds into it)


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    uri = f"sqlite:///{workdir / 'mlflow.db'}"
    subprocess.run(fit_command(tiny_args(tiny_model_dir, workdir, f"--trainer.max_epochs={EPOCHS}")), cwd=workdir, check=True, capture_output=True)
    runs, metrics = run_metrics(uri, "frozenlake")
    assert len(runs) == 1 and len(comparable_keys(metrics)) > 20
    return metrics


@pytest.mark.parametrize("phase,epoch,delay", POINTS, ids=[p[0] for p in POINTS])
def test_killed_run_resumes_as_if_never_killed(reference, tiny_model_dir, tmp_path, phase, epoch, delay):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = tiny_args(tiny_model_dir, tmp_path, f"--trainer.max_epochs={EPOCHS}")
    result = kill_and_resume(args, tmp_path, uri, "frozenlake", phase, epoch, delay)
    assert result.killed and result.resumed, result.error
    assert result.checkpoint_epoch == epoch - 1 and result.epochs_lost == 1  # the interrupted epoch, no more
    assert result.runs == 1 and result.status == "FINISHED"  # the resume continued the killed run
    assert differences(reference, result.metrics, comparable_keys(reference)) == []
    assert not list(tmp_path.glob("**/.*.tmp")), "the killed write's temporary file is cleaned up by the next save"

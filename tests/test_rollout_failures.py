"""A rollout whose environments mostly fail stops the run (paw_lightning.rollout.failures): one
line naming the environment's own error, exit code 1, the MLflow run FAILED; below the share the
failures are counted and the run goes on."""
from __future__ import annotations

import pytest

from paw_lightning.cli import main
from paw_lightning.rollout.collector import Trajectory
from paw_lightning.rollout.failures import RolloutFailureError, check_failures

from helpers import metric_history, mlflow_runs, tiny_args

FAULTY = "paw_lightning.envs.faulty.FaultyEnv"


def episodes(failed: int, total: int) -> list[Trajectory]:
    trajectories = [Trajectory(group_id=0, traj_id=i, task_seed=i) for i in range(total)]
    for t in trajectories[:failed]:
        t.error = f"RuntimeError: injected fault in reset (seed {t.task_seed})"
    return trajectories


@pytest.mark.parametrize("failed, total, max_share, stops", [
    (0, 8, 0.5, False),
    (4, 8, 0.5, False),  # exactly half: not more than the share
    (5, 8, 0.5, True),
    (8, 8, 1.0, True),  # every episode failed: stops whatever the share
    (7, 8, 1.0, False),
    (1, 8, 0.0, True),  # 0: any failure stops
    (0, 0, 0.5, False),  # nothing played
])
def test_the_share_of_failed_episodes_decides(failed, total, max_share, stops):
    if stops:
        with pytest.raises(RolloutFailureError) as err:
            check_failures(episodes(failed, total), max_share, "rollout 0")
        assert str(err.value) == (f"rollout 0: {failed} of {total} episodes failed in the environment (more than "
                                  f"data.max_failed_share = {max_share:g}); the first error: RuntimeError: injected fault in reset (seed 0)")
    else:
        check_failures(episodes(failed, total), max_share, "rollout 0")


def _error_lines(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


@pytest.mark.slow  # a tiny fit
@pytest.mark.parametrize("extra, expected", [
    (["--data.evaluation.fixed=null"], "rollout 0: 4 of 4 episodes failed in the environment"),  # the first training rollout
    ([], "the val fixed held-out set: the environment failed"),  # before it, the fixed set's in-process episodes
    (["--data.env_kwargs.fault_seeds=[]"], None),  # no faulty task: it trains
], ids=["rollout", "fixed-set", "no-fault"])
def test_a_fit_whose_environments_fail_stops_with_one_line(extra, expected, tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Every reset raises: the fit stops (exit 1, one line with the environment's error, the run
    FAILED). With no faulty seed the same environment trains as usual."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--summary.validate_at_start=false", f"--data.env={FAULTY}",
                              "--data.env_kwargs={inner: frozenlake, size: 3, raise_at_reset: true}", "--model.world_model_objective=null", *extra)]
    if expected is None:
        main(args)
        client, (run,) = mlflow_runs(tmp_path)
        assert run.info.status == "FINISHED"
        assert metric_history(client, run, "train/episode/env_error_rate") == [0.0]
        return
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    errors = _error_lines(capsys)
    assert len(errors) == 1 and expected in errors[0] and "injected fault in reset" in errors[0], errors
    client, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FAILED"


@pytest.mark.slow  # a tiny validate
def test_a_validation_whose_environments_fail_stops_with_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", *tiny_args(tiny_model_dir, tmp_path, f"--data.env={FAULTY}",
                                     "--data.env_kwargs={inner: frozenlake, size: 3}", "--data.evaluation.env_kwargs={raise_at_reset: true}",
                                     "--model.world_model_objective=null")])
    assert exit_info.value.code == 1
    errors = _error_lines(capsys)
    assert len(errors) == 1 and "injected fault in reset" in errors[0], errors

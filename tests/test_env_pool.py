"""EnvPool: in-process and worker-process pools agree, and failures end only their episodes."""
from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal

import pytest

from paw_lightning.envs import EnvError, EnvPool, make_env_factory

FAULTY = "paw_lightning.envs.faulty.FaultyEnv"
ACTIONS = ["Down", "Right", "up", "Left", "Right", "Down", "hop", "Right"]


def rollout(pool: EnvPool, seeds: list[int]) -> list:
    """Reset env i with (seeds[i], episode i), then step every running env through ACTIONS."""
    out = [pool.reset_many([(i, seed, i) for i, seed in enumerate(seeds)])]
    running = list(range(len(seeds)))
    for action in ACTIONS:
        results = pool.step_many([(i, action) for i in running][::-1])  # any order works
        out.append(results)
        running = [i for i, r in zip(running[::-1], results) if not r[2]][::-1]
    return out


@pytest.mark.slow
def test_in_process_and_workers_give_identical_results():
    factory = make_env_factory("frozenlake", slippery=True)
    seeds = [4, 4, 4, 9, 9]
    with EnvPool(factory, size=5) as local, EnvPool(factory, size=5, num_workers=2) as remote:
        assert len(remote.worker_pids) == 2
        expected = rollout(local, seeds)
        assert rollout(remote, seeds) == expected
    finished = [r for step in expected[1:] for r in step if r[2]]
    assert any(r[3]["won"] for r in finished) and any(not r[3]["won"] for r in finished)


@pytest.mark.parametrize("num_workers", [0, pytest.param(2, marks=pytest.mark.slow)])  # workers: slow (processes)
def test_a_raising_env_ends_only_its_episode(num_workers, caplog):
    factory = make_env_factory(FAULTY, raise_at_step=2, fault_seeds=[7], inner="sokoban")
    with EnvPool(factory, size=3, num_workers=num_workers) as pool, caplog.at_level(logging.WARNING):
        pool.reset_many([(0, 1, 0), (1, 7, 0), (2, 2, 0)])
        assert all("error" not in r[3] for r in pool.step_many([(0, "Up"), (1, "Up"), (2, "Up")]))
        results = pool.step_many([(0, "Left"), (1, "Left"), (2, "Left")])
        assert results[1] == (
            "",
            0.0,
            True,
            {"won": False, "error": "RuntimeError: injected fault at step 2", "task": "",
             "admissible_actions": [], "action_recognised": False},
        )
        assert all("error" not in results[i][3] for i in (0, 2))
        assert "injected fault at step 2" in caplog.text
        assert "no running episode" in pool.step(1, "Up")[3]["error"]  # stepping a failed env
        obs, info = pool.reset(1, 3)  # the env is rebuilt and works again
        assert obs and "error" not in info
        assert "error" not in pool.step(1, "Up")[3]


def test_a_raising_reset_is_reported():
    with EnvPool(make_env_factory(FAULTY, raise_at_reset=True, fault_seeds=[5]), size=2) as pool:
        (obs, info), (good, _) = pool.reset_many([(0, 5, 0), (1, 6, 0)])
        assert (obs, info["error"]) == ("", "RuntimeError: injected fault in reset (seed 5)") and good


@pytest.mark.slow
def test_a_dead_worker_is_replaced(caplog):
    factory = make_env_factory(FAULTY, die_at_step=2, fault_seeds=[5])
    with EnvPool(factory, size=4, num_workers=2) as pool, caplog.at_level(logging.WARNING):
        pool.reset_many([(0, 5, 0), (1, 1, 0), (2, 2, 0), (3, 3, 0)])
        pool.step_many([(i, "Up") for i in range(4)])
        first_pids = pool.worker_pids
        # env 0 kills worker 0 at its second step; env 2 lives on the same worker
        results = pool.step_many([(0, "Up"), (1, "Up"), (3, "Up")])
        assert results[0][3]["error"] == "worker process died (exit code 3)" and results[0][2]
        assert all("error" not in r[3] for r in results[1:])
        assert pool.step(2, "Up")[3]["error"] == "worker process died (exit code 3)"
        assert pool.worker_pids[0] != first_pids[0] and pool.worker_pids[1] == first_pids[1]
        assert "worker process died" in caplog.text

        os.kill(pool.worker_pids[1], signal.SIGKILL)  # a worker killed from outside
        results = pool.step_many([(1, "Up"), (3, "Up")])
        assert [r[3]["error"] for r in results] == [f"worker process died (exit code {-signal.SIGKILL})"] * 2
        resets = pool.reset_many([(i, 10 + i, 0) for i in range(4)])  # the pool keeps working
        assert all(obs and "error" not in info for obs, info in resets)
        assert all("error" not in r[3] for r in pool.step_many([(i, "Up") for i in range(4)]))


@pytest.mark.slow
def test_a_hanging_worker_times_out():
    factory = make_env_factory(FAULTY, hang_at_step=1, fault_seeds=[5])
    with EnvPool(factory, size=2, num_workers=2, timeout=1.0) as pool:
        pool.reset_many([(0, 5, 0), (1, 6, 0)])
        hung, healthy = pool.step_many([(0, "Up"), (1, "Up")])
        assert hung[3]["error"] == "worker process timed out after 1s"
        assert "error" not in healthy[3]
        assert "error" not in pool.reset(0, 6)[1]


@pytest.mark.slow
def test_requests_are_validated_and_close_is_final():
    pool = EnvPool(make_env_factory("sokoban"), size=2)
    with pytest.raises(ValueError, match="twice"):
        pool.step_many([(0, "Up"), (0, "Down")])
    with pytest.raises(IndexError):
        pool.reset(2, 0)
    pool.close()
    pool.close()
    with pytest.raises(EnvError, match="closed"):
        pool.reset(0, 0)
    worker_pool = EnvPool(make_env_factory("sokoban"), size=1, num_workers=1)
    [pid] = worker_pool.worker_pids
    del worker_pool  # __del__ stops the worker
    gc.collect()
    assert pid not in [p.pid for p in multiprocessing.active_children()]


class _DiesWhenUnpickled:
    """A "factory" whose unpickling kills the worker process before it starts."""

    def __reduce__(self):
        return os._exit, (5,)


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_an_error():
    with pytest.raises(EnvError, match=r"failed to start \(exit code 5\)"):
        EnvPool(_DiesWhenUnpickled(), size=2, num_workers=1)


@pytest.mark.parametrize("num_workers", [0, pytest.param(1, marks=pytest.mark.slow)])  # workers: slow (processes)
def test_bad_outputs_end_only_their_episode(num_workers):
    """A dict for an observation ends that episode with a recorded error, the other goes on; a
    5 MB observation is cut at MAX_OBS_CHARS, its length reported, the episode goes on."""
    from paw_lightning.envs.pool import MAX_OBS_CHARS

    factory = make_env_factory(FAULTY, non_text_at_step=1, fault_seeds=[5])
    with EnvPool(factory, size=2, num_workers=num_workers) as pool:
        pool.reset_many([(0, 5, 0), (1, 6, 0)])
        non_text, healthy = pool.step_many([(0, "Right"), (1, "Right")])
        assert non_text[2] and non_text[3]["error"] == "TypeError: the environment returned a dict observation, not text"
        assert "error" not in healthy[3] and isinstance(healthy[0], str)
        assert "error" not in pool.reset(0, 6)[1]  # rebuilt at the next reset
    factory = make_env_factory(FAULTY, huge_observation_at_step=1)
    with EnvPool(factory, size=1, num_workers=num_workers) as pool:
        pool.reset(0, 5)
        huge, _reward, _done, info = pool.step(0, "hop")
        assert len(huge) == MAX_OBS_CHARS and info["obs_truncated_chars"] > 5_000_000 and "error" not in info
        assert "error" not in pool.step(0, "hop")[3]


class AlwaysRight:
    """A sampler stand-in that answers every prompt with the action Right."""

    def generate(self, prompts, temperature, seed, stop="</action>"):
        from paw_lightning.rollout.engine import Generation

        return [Generation([1], [2], "<think>go</think><action>Right</action>") for _ in prompts]


def test_collector_counts_cut_observations():
    from paw_lightning.metrics import episode_metrics
    from paw_lightning.rollout.collector import Collector
    from paw_lightning.rollout.prompts import PromptBuilder

    factory = make_env_factory(FAULTY, huge_observation_at_step=1, fault_seeds=[11])
    with EnvPool(factory, size=2) as pool:
        trajs = Collector(pool, AlwaysRight(), PromptBuilder("frozenlake"), max_steps=2, invalid_penalty=0.0).collect([(0, 11), (1, 12)], 1, 1.0, seed=0, progress=False)
    assert [t.truncated_observations for t in trajs] == [1, 0]
    metrics = episode_metrics(trajs)
    observations = sum(len(t.steps) + 1 for t in trajs)  # each episode's reset observation and one per step
    assert metrics["obs_truncated_rate"] == pytest.approx(1 / observations) and metrics["env_error_rate"] == 0.0


@pytest.mark.slow
def test_env_timeout_needs_workers():
    from paw_lightning.data import RolloutDataModule

    with pytest.raises(ValueError, match="data.env_timeout=5 needs .* data.env_workers >= 1"):
        RolloutDataModule(env_timeout=5)
    assert RolloutDataModule(env_workers=1, env_timeout=5)._pool("train").timeout == 5


@pytest.mark.slow
def test_a_fit_whose_environments_all_hang_stops_with_the_timeout(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Every environment hangs at its first step: with data.env_timeout the silent worker is
    replaced and every episode ends failed, so the rollout has nothing to train on and the fit
    stops (paw_lightning.rollout.failures) with one line naming the timeout, exit 1, run FAILED."""
    from paw_lightning.cli import main

    from helpers import ROOT, mlflow_runs, tiny_args

    monkeypatch.chdir(tmp_path)
    vanilla = str(ROOT / "configs/objectives/vanilla.yaml")  # FaultyEnv declares no R_max for the adaptive λ
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", vanilla, "--trainer.max_epochs=1", f"--data.env={FAULTY}", "--data.env_kwargs={hang_at_step: 1}", "--data.evaluation.fixed=null",
                                "--data.env_workers=1", "--data.env_timeout=3")])
    assert exit_info.value.code == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "episodes failed in the environment" in errors[0] and "timed out after 3s" in errors[0], errors
    client, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FAILED"

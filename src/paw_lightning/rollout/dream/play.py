"""One dream evaluation of one rank, for the data module: fidelity, imagined episodes, replay.

The environments of ``pool`` are reset for the tasks' first observations (and for the
admissible actions the k-step fidelity shows), the k-step fidelity runs along this rank's real
held-out trajectories, one episode per task is imagined, and the imagined actions are replayed.
Every rank calls :func:`dream_evaluation` (it generates: collectives under FSDP2).
"""
from __future__ import annotations

from paw_lightning.envs.pool import EnvPool
from paw_lightning.rollout.collector import Trajectory
from paw_lightning.rollout.dream.fidelity import k_step_fidelity
from paw_lightning.rollout.dream.imagine import Act, Predict, imagine
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.dream.measures import DreamRecords
from paw_lightning.rollout.dream.replay import replay
from paw_lightning.rollout.prompts import PromptBuilder


def first_observations(pool: EnvPool, seeds: list[int]) -> dict[int, tuple[str, dict]]:
    """Task seed → the reset's (observation, info), for each distinct seed (episode 0), in
    batches of the pool's size; seeds whose reset failed are left out."""
    seeds = list(dict.fromkeys(seeds))
    found = {}
    for at in range(0, len(seeds), len(pool)):
        chunk = seeds[at : at + len(pool)]
        for seed, (obs, info) in zip(chunk, pool.reset_many([(i, seed, 0) for i, seed in enumerate(chunk)])):
            if not info.get("error"):
                found[seed] = (obs, info)
    return found


def dream_evaluation(pool: EnvPool, task_seeds: list[int], trajectories: list[Trajectory], act: Act, predict: Predict, judge: Judge,
                     prompt: PromptBuilder, horizon: int) -> DreamRecords:
    """This rank's :class:`DreamRecords`: k-step fidelity along ``trajectories``, one imagined
    episode per task of ``task_seeds`` (at most ``len(pool)``) and its replay."""
    if len(task_seeds) > len(pool):
        raise ValueError(f"{len(task_seeds)} dream tasks need a pool of at least that size (it has {len(pool)})")
    firsts = first_observations(pool, [t.task_seed for t in trajectories] + list(task_seeds))
    fidelity = k_step_fidelity(trajectories, predict, prompt, judge, horizon, {seed: info["admissible_actions"] for seed, (_, info) in firsts.items()})
    starts = [(seed, *firsts[seed]) for seed in task_seeds if seed in firsts]
    episodes = imagine(starts, act, predict, judge, prompt, horizon)
    return DreamRecords(horizon, judge.reads_states, fidelity, episodes, replay(episodes, pool, horizon))

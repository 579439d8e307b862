"""Every rank gets the global rollout counts and episode metrics, rates from counts added up
over the ranks (2 CPU processes, gloo)."""
from __future__ import annotations

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from paw_lightning.metrics import episode_metrics
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.training.rollout_watch import rollout_counts

from helpers import free_port

pytestmark = pytest.mark.slow  # 2 spawned processes

# rank 0: one "pick" episode, won, actions Up Up; rank 1: two "heat" episodes, lost, actions Up Left and one invalid step
PLAYS = {0: [("pick_and_place_simple", True, ["Up", "Up"])],
         1: [("pick_heat_then_place_in_recep", False, ["Up", "Left"]), ("pick_heat_then_place_in_recep", False, [None])]}


def trajectory(task_type: str, won: bool, actions: list[str | None]) -> Trajectory:
    traj = Trajectory(group_id=0, traj_id=0, task_seed=0, task_type=task_type, won=won)
    for t, action in enumerate(actions):
        traj.steps.append(Step(f"o{t}", [1], [2], "r", action, 0.0, f"o{t + 1}", t == len(actions) - 1))
    return traj


def _worker(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        trajectories = [trajectory(*play) for play in PLAYS[rank]]
        trajectories[-1].truncated_observations = rank  # rank 1's last episode had one observation cut
        metrics = episode_metrics(trajectories)
        counts = rollout_counts(len(trajectories), sum(len(t.steps) for t in trajectories), sum(t.invalid_steps for t in trajectories),
                                sum(t.won for t in trajectories), flat=rank == 0)
        results[rank] = (metrics["top_action_share"], {k: v for k, v in metrics.items() if k.startswith("success_rate/")}, counts,
                         metrics["invalid_rate"], metrics["obs_truncated_rate"])
    finally:
        dist.destroy_process_group()


def test_counts_and_shares_are_global_on_every_rank():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    for rank in (0, 1):
        share, by_type, counts, invalid_rate, truncated_rate = results[rank]
        assert share == pytest.approx(3 / 4)  # Up on 3 of the 4 valid steps (rank 0 alone: 1.0, rank 1 alone: 0.5)
        assert invalid_rate == pytest.approx(1 / 5)  # 1 invalid of 5 steps (the ranks' own rates 0 and 1/3 average to 1/6)
        assert truncated_rate == pytest.approx(1 / 8)  # 1 cut of 5 step observations + 3 reset ones
        assert by_type == {"success_rate/heat": 0.0, "success_rate/pick": 1.0}
        assert (counts.episodes, counts.steps, counts.invalid_steps, counts.wins) == (3, 5, 1, 1)
        assert counts.flat is False  # flat on rank 0 only

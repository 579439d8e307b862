"""The most frequent action's share of a rollout (``episode/top_action_share``) against hand
counts, and the action-collapse warning on scripted policies: one that plays Right whatever it
sees (it never wins FrozenLake's corner maps) and one that alternates Down and Right."""
from __future__ import annotations

import pytest

from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.metrics import EpisodeCounts, episode_metrics, top_action_share
from paw_lightning.rollout.collector import Collector, Step, Trajectory
from paw_lightning.rollout.engine import Generation
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.training.action_collapse import ActionCollapseWatch


def trajectory(actions: list[str | None]) -> Trajectory:
    traj = Trajectory(group_id=0, traj_id=0, task_seed=0)
    for t, action in enumerate(actions):
        traj.steps.append(Step(f"o{t}", [1], [2], "r", action, 0.0, f"o{t + 1}", t == len(actions) - 1))
    return traj


def test_top_action_share_counts_valid_steps_only():
    # valid steps: Right, Right (with spaces), Down; the invalid step (None) does not count
    assert top_action_share(EpisodeCounts.of([trajectory(["Right", None]), trajectory([" Right ", "Down"])]).actions) == pytest.approx(2 / 3)
    assert top_action_share(EpisodeCounts.of([trajectory([None, None])]).actions) == 0.0
    assert episode_metrics([trajectory(["Up", "Up", "Up", "Left"])])["top_action_share"] == 0.75


class Scripted:
    """An engine that answers every prompt with the next move of ``moves`` (cycling per call)."""

    def __init__(self, moves: list[str]):
        self.moves, self.calls = moves, 0

    def generate(self, prompts, temperature, seed, stop="</action>"):
        move = self.moves[self.calls % len(self.moves)]
        self.calls += 1
        return [Generation([1], [2], f"<think>go</think><action>{move}</action>") for _ in prompts]


def play(moves: list[str]) -> tuple[float, int, int]:
    """8 episodes (2 maps × 4) of a scripted policy on 3×3 corner maps without holes, at most 8
    moves: the most frequent action's share, the valid steps, the wins."""
    with EnvPool(make_env_factory("frozenlake", size=3, hole_prob=0.0, layout="corners"), 8) as pool:
        trajectories = Collector(pool, Scripted(moves), PromptBuilder("FrozenLake"), max_steps=8, invalid_penalty=0.0).collect(
            [(0, 1), (1, 2)], group_size=4, temperature=1.0, seed=0, progress=False)
    metrics = episode_metrics(trajectories)
    return metrics["top_action_share"], sum(len(t.steps) for t in trajectories), sum(t.won for t in trajectories)


def test_a_policy_stuck_on_one_move_trips_the_warning_once():
    share, steps, wins = play(["Right"])  # top-right corner, then bumping into the border until the 8 moves are spent
    assert (share, steps, wins) == (1.0, 64, 0)
    watch = ActionCollapseWatch()
    warning = watch.observe(share, steps, wins)
    assert "played its most frequent action on 100% of the rollout's 64 valid steps and won no episode" in warning
    assert watch.observe(share, steps, wins) is None  # once per collapse
    share_ok, steps_ok, wins_ok = play(["Down", "Right"])  # Down, Right, Down, Right: the goal in 4 moves
    assert (share_ok, steps_ok, wins_ok) == (0.5, 32, 8)
    assert watch.observe(share_ok, steps_ok, wins_ok) is None
    assert watch.observe(share, steps, wins) is not None  # re-armed by the rollout that was not collapsed


def test_the_watch_needs_a_losing_rollout_with_enough_steps():
    watch = ActionCollapseWatch(min_share=0.9, min_steps=16)
    assert watch.observe(1.0, 64, 1) is None  # one win: RL still has a signal
    assert watch.observe(1.0, 15, 0) is None  # too few valid steps to say
    assert watch.observe(0.89, 64, 0) is None
    assert watch.observe(0.9, 16, 0) is not None
    with pytest.raises(ValueError, match="min_share"):
        ActionCollapseWatch(min_share=0.0)
    with pytest.raises(ValueError, match="min_steps"):
        ActionCollapseWatch(min_steps=0)

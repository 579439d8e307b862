"""The no-learning-signal diagnostic: the share of zero advantages of an update, hand-computed,
and the warning after updates in a row in which every advantage was 0."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.objectives.advantages import grpo_advantages
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.samples import build_buffer
from paw_lightning.training.learning_signal import LearningSignalWatch, zero_advantage_fraction
from paw_lightning.update import prepare_update

from helpers import make_module


def test_a_group_whose_episodes_got_equal_returns_gives_its_samples_zero_advantage():
    # group 0: returns 1 (2 steps) and 0 (1 step), not flat; group 1: returns 0 and 0, flat
    returns = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    trajs = torch.tensor([0, 0, 1, 2, 2, 3])
    advantages = grpo_advantages(returns, groups, trajs)
    assert advantages[:3].abs().min() > 0.5  # ±(1 − 0.5) / std 0.5 (population) ≈ ±1
    assert zero_advantage_fraction(advantages) == 0.5  # group 1's 3 samples of 6
    assert zero_advantage_fraction(torch.zeros(0)) == 0.0


def test_the_watch_warns_once_per_streak_of_flat_updates():
    watch = LearningSignalWatch(patience=3)
    fired = [watch.observe(flat, success_rate=0.0) for flat in (True, True, False, True, True, True, True, True)]
    assert [i for i, message in enumerate(fired) if message] == [5]  # the 3rd flat update in a row, not again
    assert "no learning signal for 3 updates in a row" in fired[5] and "success rate of the last rollout 0%" in fired[5]
    assert watch.observe(False) is None and watch.flat_updates == 0
    with pytest.raises(ValueError, match="patience"):
        LearningSignalWatch(patience=0)


def test_prepare_update_reports_the_share_of_zero_advantages(tiny_model_dir):
    """2 groups × 2 episodes × 3 steps; group 0's episodes return 0 and 3, group 1's both 0."""
    module = make_module(tiny_model_dir)
    tok = module.tokenizer
    trajectories = []
    for group, rewards in enumerate(((0.0, 1.0), (0.0, 0.0))):
        for episode, reward in enumerate(rewards):
            traj = Trajectory(group, 2 * group + episode, group)
            for t in range(3):
                response = tok.encode("<think>x</think><action>Up</action>", add_special_tokens=False)
                traj.steps.append(Step(f"o{t}", chat_prompt_ids(tok, f"task {group} step {t}"), response, "", "Up", reward, f"obs {t}", t == 2))
            trajectories.append(traj)
    buffer = build_buffer(trajectories, tok)
    metrics = prepare_update(module.update_inputs(), buffer, max_return=3.0)
    assert metrics["policy/zero_advantage_fraction"] == 0.5
    assert (buffer.advantages[6:] == 0).all() and (buffer.advantages[:6] != 0).all()
    # samples left out of the policy loss (data.rollout.mask_truncated) are not counted: 3 of group 1's 6 out
    buffer.no_policy_loss = torch.tensor([False] * 9 + [True] * 3)
    assert prepare_update(module.update_inputs(), buffer, max_return=3.0)["policy/zero_advantage_fraction"] == pytest.approx(3 / 9)

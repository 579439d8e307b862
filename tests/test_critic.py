"""PPO's critic pieces against hand-computed numbers: turn-level GAE and the clipped value loss."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.objectives import GAE, gae_advantages
from paw_lightning.objectives.types import StepInfo


def test_gae_by_hand_with_unsorted_steps():
    # samples: B (one step), then A's steps in the order 2, 0, 1
    traj = torch.tensor([1, 0, 0, 0])
    step = torch.tensor([0, 2, 0, 1])
    rewards = torch.tensor([-0.1, 1.0, 0.0, 0.0])
    values = torch.tensor([0.3, 0.4, 0.5, 0.2])
    adv, ret = gae_advantages(rewards, values, traj, step, gamma=0.9, lam=0.5)
    # A, t=2: δ = 1 + 0.9·0 − 0.4 = 0.6                         → A = 0.6
    # A, t=1: δ = 0 + 0.9·0.4 − 0.2 = 0.16                      → A = 0.16 + 0.45·0.6 = 0.43
    # A, t=0: δ = 0 + 0.9·0.2 − 0.5 = −0.32                     → A = −0.32 + 0.45·0.43 = −0.1265
    # B, t=0: δ = −0.1 − 0.3 = −0.4                             → A = −0.4
    assert adv.tolist() == pytest.approx([-0.4, 0.6, -0.1265, 0.43])
    assert ret.tolist() == pytest.approx([-0.1, 1.0, 0.3735, 0.63])  # R = A + V


def test_gae_estimator_whitens_and_needs_values():
    info = StepInfo(torch.tensor([0, 0]), torch.tensor([0, 1]), torch.tensor([0, 0]), torch.tensor([1.0, 0.0]), values=torch.tensor([0.0, 0.0]))
    adv = GAE(whiten=True)(info)  # raw A = [1, 0] → mean 0.5, std 0.7071 → ±0.7071
    assert adv.tolist() == pytest.approx([0.70710678, -0.70710678], abs=1e-5)
    info.values = None
    with pytest.raises(ValueError, match="values"):
        GAE()(info)


def test_clipped_value_loss_by_hand():
    critic = GAE(value_clip=0.2)
    v = torch.tensor([1.0], requires_grad=True)
    out = critic.value_loss(v, torch.tensor([0.5]), torch.tensor([2.0]))
    # unclipped (1 − 2)² = 1; clipped V = 0.5 + 0.2 = 0.7 → (0.7 − 2)² = 1.69; ½·max = 0.845
    assert out.loss.item() == pytest.approx(0.845)
    out.loss.backward()
    assert v.grad.item() == 0.0  # the clipped branch wins and is flat in V
    v = torch.tensor([0.6], requires_grad=True)
    out = critic.value_loss(v, torch.tensor([0.5]), torch.tensor([2.0]))
    out.loss.backward()  # inside the clip: ½(0.6 − 2)² = 0.98, gradient 0.6 − 2 = −1.4
    assert out.loss.item() == pytest.approx(0.98) and v.grad.item() == pytest.approx(-1.4)

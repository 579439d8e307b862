"""Truncated importance sampling for rollouts from another engine (METHODS.md §2), against
hand-computed numbers: the engine/trainer gap, the weights min(π_old / π_engine, C) and the
weighted surrogate; with the trainer's own engine (hf) there is no weight at all."""
from __future__ import annotations

import math

import pytest
import torch

from paw_lightning.objectives import PolicyObjective, StepInfo
from paw_lightning.rollout.engine import HFEngine
from paw_lightning.rollout.samples import RolloutBuffer
from paw_lightning.update import off_policy_correction, prepare_update

from helpers import make_module, rollout


def buffer_with(old: list[float], sampled: list[float], actions: list[bool]) -> RolloutBuffer:
    n = len(old)
    info = StepInfo(group_ids=torch.zeros(1, dtype=torch.long), traj_ids=torch.zeros(1, dtype=torch.long), step_ids=torch.zeros(1, dtype=torch.long), rewards=torch.zeros(1))
    buffer = RolloutBuffer([torch.arange(n)], [torch.tensor(actions)], [torch.zeros(n, dtype=torch.bool)], torch.tensor([1]), info, [])
    buffer.old_logprobs, buffer.sampler_logprobs = [torch.tensor(old)], [torch.tensor(sampled)]
    return buffer


def test_weights_and_engine_gap_by_hand():
    # action tokens 1–3: log π_old − log π_engine = 0.5, −1.5, 1.0 → ratios e^0.5, e^−1.5, e^1 (> C = 2: capped)
    buffer = buffer_with([0.0, -1.0, -2.0, -0.5], [0.0, -1.5, -0.5, -1.5], [False, True, True, True])
    metrics = off_policy_correction(buffer, cap=2.0)
    assert metrics["rollout/engine_kl"] == pytest.approx((0.5 + 1.5 + 1.0) / 3)
    assert metrics["rollout/tis_capped_fraction"] == pytest.approx(1 / 3)
    torch.testing.assert_close(buffer.tis_weights[0], torch.tensor([1.0, math.exp(0.5), math.exp(-1.5), 2.0]))
    uncapped = buffer_with([0.0, -1.0], [0.0, -1.5], [False, True])
    assert "rollout/tis_capped_fraction" not in off_policy_correction(uncapped, cap=None) and uncapped.tis_weights == []


def test_the_surrogate_is_weighted_per_token():
    """ρ = 1 and A = 1 on two action tokens: each token's surrogate is 1, weighted 2 and 0.5 →
    token-mean loss −(2 + 0.5) / 2; weights of 1 change nothing, bit for bit."""
    objective = PolicyObjective(kl_coef=0.0)
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    args = (logprobs, logprobs.detach(), torch.tensor([1.0]), torch.tensor([[True, True]]))
    weighted = objective(*args, tis_weights=torch.tensor([[2.0, 0.5]]))
    assert weighted.loss.item() == pytest.approx(-1.25)
    assert torch.equal(objective(*args, tis_weights=torch.ones(1, 2)).loss, objective(*args).loss)
    weighted.loss.backward()  # d/dlogπ of −w·ρ·A / 2 at ρ = 1: −w / 2
    torch.testing.assert_close(logprobs.grad, torch.tensor([[-1.0, -0.25]]))


def test_the_trainers_own_engine_gets_no_weights(tiny_model_dir):
    module = make_module(tiny_model_dir)
    assert isinstance(module.engine, HFEngine) and not module.engine.off_policy
    buffer = rollout(module)
    metrics = prepare_update(module.update_inputs(), buffer)
    assert buffer.tis_weights == [] and "tis_weights" not in buffer.collate([0, 1])
    assert not any(key.startswith("rollout/") for key in metrics)

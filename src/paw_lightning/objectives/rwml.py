"""RWML's reward and easy-sample filter (METHODS.md §4), as pure functions on tensors.

The model predicts the next state in ``<think>…</think><next_state>ŝ</next_state>``; with E a
sentence embedder (unit vectors), the reward of a prediction is ``r = 1 if 1 − cos(E(ŝ),
E(s_{t+1})) < τ_d else 0`` (strict: a distance of exactly τ_d earns 0), and 0 when the response
has no ``<next_state>`` span. Easy-sample filter: a triplet is "too easy" when the filter
model's K predictions fail at a rate 1 − r̄ ≤ τ_easy (τ_easy = 0: all K rewarded; our reading of
the paper's τ_easy = 0, under which "mean reward ≥ 0" would call every triplet easy); an easy
triplet is kept with probability p, every other one always.

The reward is only as sharp as E: :func:`wrong_copy_reward_rate` measures how often it rewards
a prediction that is wrong (ours: "nothing changes", where something did).
"""
from __future__ import annotations

import re

import torch

_NEXT_STATE = re.compile(r"<next_state>(.*?)</next_state>", re.DOTALL)


def predicted_state(response: str) -> str | None:
    """The text of the first ``<next_state>…</next_state>`` span (stripped), or ``None``."""
    match = _NEXT_STATE.search(response)
    return match[1].strip() if match else None


def similarity_rewards(predicted: torch.Tensor, true: torch.Tensor, tau_d: float, valid: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) rewards 1[1 − cos < τ_d] of unit-vector rows ``predicted`` vs ``true``; 0 where
    ``valid`` (bool, N) is False (no ``<next_state>`` span)."""
    distance = 1.0 - (predicted * true).sum(-1)
    rewards = (distance < tau_d).to(torch.float32)
    return rewards if valid is None else rewards * valid.to(torch.float32)


def easy_mask(mean_rewards: torch.Tensor, tau_easy: float) -> torch.Tensor:
    """(N,) bool: the filter model's failure rate 1 − r̄ is at most τ_easy."""
    return 1.0 - mean_rewards <= tau_easy + 1e-9


def keep_mask(mean_rewards: torch.Tensor, tau_easy: float, p: float, generator: torch.Generator) -> torch.Tensor:
    """(N,) bool: an easy triplet (failure rate 1 − r̄ ≤ τ_easy) is kept with probability ``p``,
    every other one always."""
    easy = easy_mask(mean_rewards, tau_easy)
    lucky = torch.rand(mean_rewards.shape, generator=generator) < p
    return ~easy | lucky


def wrong_copy_reward_rate(current: torch.Tensor, true: torch.Tensor, changed: torch.Tensor, tau_d: float) -> float | None:
    """How blind the reward is (ours, a diagnostic): over the triplets whose observation changed
    (``changed``, bool N), the fraction where predicting the current observation o_t, which is
    wrong there, still earns 1 − cos(E(o_t), E(o_{t+1})) < τ_d. ``current``, ``true``: (N, d)
    unit rows E(o_t), E(o_{t+1}). ``None`` when no observation changed. Near 1, the reward
    rate measures the format rather than the world model."""
    if not changed.any():
        return None
    return similarity_rewards(current[changed], true[changed], tau_d).mean().item()

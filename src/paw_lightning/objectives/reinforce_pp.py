"""REINFORCE++ advantages (Hu 2025, arXiv 2501.03262; OpenRLHF, verl ``reinforce_plus_plus``),
METHODS.md §7. Over all N step samples of the update, on every rank together::

    baseline: false   A_i = (R(τ_i) − μ) / (σ + ε)           μ, σ of R(τ) over the N samples
    baseline: true    A_i = (c_i − μ) / (σ + ε)               c_i = R(τ_i) − mean_g R, μ, σ of c over the N samples

``mean_g`` is GRPO's group mean (``level`` as GRPO's); σ is the unbiased std over the N samples,
computed from sums reduced across ranks, so every rank normalises with the same μ and σ (a
collective: every rank calls the estimator, as ``prepare_update`` does). Deliberate
simplifications: the return is the trajectory's R(τ) as in GRPO (no per-token discounting, the KL
term stays in the loss, ``kl_coef``), and the statistics weigh each step sample once where verl
and OpenRLHF whiten over response tokens.
"""
from __future__ import annotations

import torch

from paw_lightning.objectives.advantages import AdvantageEstimator, Level, grpo_advantages
from paw_lightning.objectives.types import StepInfo
from paw_lightning.ranges import NonNegativeFloat
from paw_lightning.scale import distributed


def global_whiten(values: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(values − μ) / (σ + eps) with μ and the unbiased σ over the values of every rank (a
    collective; in one process, over ``values``). One value in all gives 0, and so do equal values."""
    values = values.double()
    n = distributed.sum_across_ranks(values.numel())
    mean = distributed.sum_across_ranks(float(values.sum())) / max(n, 1)
    squares = distributed.sum_across_ranks(float((values - mean).square().sum()))
    std = (squares / max(n - 1, 1)) ** 0.5
    return (values - mean) / (std + eps)


class ReinforcePlusPlus(AdvantageEstimator):
    """REINFORCE++: the return whitened over the whole update (all ranks); with ``baseline`` the
    group mean is subtracted first (REINFORCE++-baseline)."""

    def __init__(self, baseline: bool = False, level: Level = "trajectory", eps: NonNegativeFloat = 1e-6) -> None:
        """
        Args:
            baseline: subtract the task group's mean return first (REINFORCE++-baseline).
            level: with ``baseline``, the group mean over the group's ``trajectory``s (each once)
                or its ``step`` samples, as GRPO's ``level``.
            eps: added to the batch std in the denominator.
        """
        if level not in ("trajectory", "step"):
            raise ValueError(f"level must be 'trajectory' or 'step', got {level!r}")
        self.baseline = baseline
        self.level = level
        self.eps = eps
        self.compares_episodes = baseline  # without the group baseline, G = 1 still learns

    def __call__(self, info: StepInfo) -> torch.Tensor:
        returns = info.trajectory_returns()
        returns = returns if returns.is_floating_point() else returns.to(torch.get_default_dtype())
        if self.baseline and returns.numel():
            returns = grpo_advantages(returns, info.group_ids, info.traj_ids, norm_by_std=False, level=self.level)
        return global_whiten(returns, self.eps).to(returns.dtype)

"""Advantage estimators: pure functions over per-step-sample tensors, plus thin callables.
Each maps one update's ``StepInfo`` (N step samples) to one advantage per step sample, shape
(N,), that ``PolicyObjective`` broadcasts to the sample's action tokens (METHODS.md §2)::

    GRPO:  A_i = (R(τ_i) − mean_g R) / (std_g R + ε)     (norm_by_std=False: R(τ_i) − mean_g R)
    RLOO:  A_i = R(τ_i) − mean_{j≠i} R(τ_j) = n/(n−1) · (R(τ_i) − mean_g R)

``std`` is the unbiased sample std. Deliberate choices: a single-member group and a group of
equal returns get exactly 0. GiGPO (``gigpo.py``) follows the same pattern.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal

import torch

from paw_lightning.objectives.types import StepInfo
from paw_lightning.ranges import NonNegativeFloat

Level = Literal["trajectory", "step"]


def _group_stats(values: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per group (``groups`` = dense ids 0..G−1, same length as ``values``): the mean, the
    unbiased std (0 for a group of one) and whether all members are equal, each shape (G,)."""
    num_groups = int(groups.max()) + 1
    counts = torch.bincount(groups, minlength=num_groups).to(values.dtype)
    mean = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, groups, values) / counts
    sq = torch.zeros(num_groups, dtype=values.dtype).index_add_(0, groups, (values - mean[groups]).square())
    std = (sq / (counts - 1).clamp(min=1)).sqrt()
    hi = torch.full((num_groups,), -torch.inf, dtype=values.dtype).scatter_reduce(0, groups, values, "amax")
    lo = torch.full((num_groups,), torch.inf, dtype=values.dtype).scatter_reduce(0, groups, values, "amin")
    return mean, std, hi == lo  # all members equal, which includes every singleton group


def _normalise(
    values: torch.Tensor,
    groups: torch.Tensor,
    stats: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    *,
    norm_by_std: bool,
    eps: float,
) -> torch.Tensor:
    """(values − mean_g) [/ (std_g + eps)] per element with the given ``_group_stats``; elements
    of a group whose stats came from equal values give exactly 0."""
    mean, std, constant = stats
    centred = values - mean[groups]
    if norm_by_std:
        centred = centred / (std[groups] + eps)
    return torch.where(constant[groups], torch.zeros_like(centred), centred)


def _group_normalise(values: torch.Tensor, groups: torch.Tensor, *, norm_by_std: bool, eps: float) -> torch.Tensor:
    """(values − mean_g) [/ (std_g + eps)] per element, ``groups`` = dense ids 0..G−1 (same length).

    Singleton groups and groups of equal values give exactly 0.
    """
    return _normalise(values, groups, _group_stats(values, groups), norm_by_std=norm_by_std, eps=eps)


def _per_trajectory(values: torch.Tensor, groups: torch.Tensor, traj_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One entry per trajectory: (its value, its dense group id, each sample's dense trajectory id).

    Every sample of a trajectory carries the same value and group.
    """
    _, trajs = torch.unique(traj_ids, return_inverse=True)
    num_trajs = int(trajs.max()) + 1
    traj_values = torch.zeros(num_trajs, dtype=values.dtype).scatter_(0, trajs, values)
    traj_groups = torch.zeros(num_trajs, dtype=groups.dtype).scatter_(0, trajs, groups)
    return traj_values, traj_groups, trajs


def grpo_advantages(
    returns: torch.Tensor,
    group_ids: torch.Tensor,
    traj_ids: torch.Tensor,
    *,
    norm_by_std: bool = True,
    level: Level = "trajectory",
    eps: float = 1e-6,
) -> torch.Tensor:
    """GRPO advantage of every step sample, shape (N,).

    Args:
        returns: R(τ) of each sample's trajectory (N,), equal for all samples of one trajectory.
        group_ids: task group of each sample (N,).
        traj_ids: trajectory of each sample (N,), unique across the update.
        norm_by_std: divide by (std_g + eps); otherwise only subtract the group mean.
        level: ``"trajectory"``: mean/std over the group's distinct trajectories, each
            counted once; ``"step"``: over the group's step samples (verl-agent's default,
            longer episodes weigh more).
        eps: added to the std in the denominator.
    """
    returns = returns if returns.is_floating_point() else returns.to(torch.get_default_dtype())
    _, groups = torch.unique(group_ids, return_inverse=True)
    if level == "step":
        return _group_normalise(returns, groups, norm_by_std=norm_by_std, eps=eps)
    if level != "trajectory":
        raise ValueError(f"level must be 'trajectory' or 'step', got {level!r}")
    traj_returns, traj_groups, trajs = _per_trajectory(returns, groups, traj_ids)
    per_traj = _group_normalise(traj_returns, traj_groups, norm_by_std=norm_by_std, eps=eps)
    return per_traj[trajs]


def rloo_advantages(returns: torch.Tensor, group_ids: torch.Tensor, traj_ids: torch.Tensor) -> torch.Tensor:
    """RLOO advantage of every step sample, shape (N,): R(τ_i) minus the mean return of the
    *other* trajectories of its group (each trajectory counted once); a singleton group gets 0.

    Args:
        returns: R(τ) of each sample's trajectory (N,), equal for all samples of one trajectory.
        group_ids: task group of each sample (N,).
        traj_ids: trajectory of each sample (N,), unique across the update.
    """
    returns = returns if returns.is_floating_point() else returns.to(torch.get_default_dtype())
    _, groups = torch.unique(group_ids, return_inverse=True)
    traj_returns, traj_groups, trajs = _per_trajectory(returns, groups, traj_ids)
    centred = _group_normalise(traj_returns, traj_groups, norm_by_std=False, eps=0.0)
    n = torch.bincount(traj_groups).to(returns.dtype)[traj_groups]
    # n/(n−1)·(R − mean) = R − leave-one-out mean; n = 1 gives 1·0 (centred is exactly 0 there).
    return (n / (n - 1).clamp(min=1) * centred)[trajs]


class AdvantageEstimator(ABC):
    """Maps the step samples of one update to one advantage per sample, shape (N,).

    ``last_diagnostics``: float diagnostics of the last call, keyed ``component/name``, for
    the caller to log. Empty (and read-only) unless an estimator assigns a fresh dict.
    """

    last_diagnostics: Mapping[str, float] = MappingProxyType({})
    compares_episodes = True  # the advantage compares the G episodes of a task: G = 1 gives 0 everywhere

    @abstractmethod
    def __call__(self, info: StepInfo) -> torch.Tensor: ...


class GRPO(AdvantageEstimator):
    """Group-relative episode advantage: every step of trajectory τ gets the normalised R(τ)."""

    def __init__(self, norm_by_std: bool = True, level: Level = "trajectory", eps: NonNegativeFloat = 1e-6) -> None:
        """
        Args:
            norm_by_std: divide the centred return by the group's std (+ eps); False only
                subtracts the group mean.
            level: ``trajectory`` computes mean/std over the group's trajectories (each once);
                ``step`` over its step samples (verl-agent's default; longer episodes weigh more).
            eps: added to the std in the denominator.
        """
        if level not in ("trajectory", "step"):
            raise ValueError(f"level must be 'trajectory' or 'step', got {level!r}")
        self.norm_by_std = norm_by_std
        self.level = level
        self.eps = eps

    def __call__(self, info: StepInfo) -> torch.Tensor:
        return grpo_advantages(
            info.trajectory_returns(),
            info.group_ids,
            info.traj_ids,
            norm_by_std=self.norm_by_std,
            level=self.level,
            eps=self.eps,
        )


class RLOO(AdvantageEstimator):
    """REINFORCE leave-one-out: every step of τ_i gets R(τ_i) − mean_{j≠i} R(τ_j) over its group."""

    def __call__(self, info: StepInfo) -> torch.Tensor:
        return rloo_advantages(info.trajectory_returns(), info.group_ids, info.traj_ids)

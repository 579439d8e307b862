"""Loss balancing: the per-group world-model weight λ_g of PaW (METHODS.md §3c).

A balancer maps the update's trajectories to ``{group id: λ_g}``; it is part of the
world-model objective (``model.world_model_objective.init_args.balancer``) and runs once
per update, when the update is prepared (:mod:`paw_lightning.update`), so that λ_g
travels to the loss per sample, like the advantages.
"""
from __future__ import annotations

from collections import defaultdict

from paw_lightning.ranges import NonNegativeFloat, PositiveFloat


def group_mean_returns(trajectories) -> dict[int, float]:
    """R̄_g: mean return of each group's trajectories."""
    returns: dict[int, list[float]] = defaultdict(list)
    for traj in trajectories:
        returns[traj.group_id].append(traj.total_return)
    return {g: sum(r) / len(r) for g, r in returns.items()}


class LossBalancer:
    """Base class: subclasses map the update's trajectories to ``{group id: λ_g}``;
    ``max_return`` is the environment's declared return of a won episode (or ``None``)."""

    def lambdas(self, trajectories, max_return: float | None = None) -> dict[int, float]:
        raise NotImplementedError


class FixedLambda(LossBalancer):
    """λ_g = ``value`` for every group (the "λ = 1" ablation, ECHO / WM-SFT baselines)."""

    def __init__(self, value: NonNegativeFloat = 1.0):
        self.value = value

    def lambdas(self, trajectories, max_return: float | None = None) -> dict[int, float]:
        return {g: self.value for g in group_mean_returns(trajectories)}


class RewardAdaptiveLambda(LossBalancer):
    """λ_g = clamp(1 − R̄_g / R_max, low, high): groups that already succeed get less
    world-model weight. The clamp (ours, default [0, 1]) handles negative mean returns
    (invalid-action penalties) and returns above ``r_max``.

    Args:
        r_max: the return of a won episode (ALFWorld 10; FrozenLake and Sokoban 1);
            default: the environment's ``max_return``.
        clamp_low / clamp_high: the clamp bounds.
    """

    def __init__(self, r_max: PositiveFloat | None = None, clamp_low: float = 0.0, clamp_high: float = 1.0):
        if r_max is not None and r_max <= 0:
            raise ValueError(f"r_max must be positive (got {r_max})")
        self.r_max, self.clamp_low, self.clamp_high = r_max, clamp_low, clamp_high

    def lambdas(self, trajectories, max_return: float | None = None) -> dict[int, float]:
        r_max = self.r_max if self.r_max is not None else max_return
        if r_max is None:
            raise ValueError("RewardAdaptiveLambda needs r_max: set model.world_model_objective.init_args.balancer.init_args.r_max (the environment does not declare max_return)")
        return {g: min(max(1.0 - r / r_max, self.clamp_low), self.clamp_high) for g, r in group_mean_returns(trajectories).items()}

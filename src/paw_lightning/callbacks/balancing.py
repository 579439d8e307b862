"""Loss balancing: the per-group world-model weight λ_g of PaW (METHODS.md §3c).

The callback runs at the start of every epoch, after the rollout of that epoch was
collected, and sets ``pl_module.wm_lambda = {group id: λ_g}``. The module multiplies each
group's world-model loss by its λ_g.
"""
from __future__ import annotations

from collections import defaultdict

from lightning.pytorch import Callback, LightningModule, Trainer


def group_mean_returns(trajectories) -> dict[int, float]:
    """R̄_g: mean return of each group's trajectories."""
    returns: dict[int, list[float]] = defaultdict(list)
    for traj in trajectories:
        returns[traj.group_id].append(traj.total_return)
    return {g: sum(r) / len(r) for g, r in returns.items()}


class _Balancing(Callback):
    def lambdas(self, trajectories) -> dict[int, float]:
        raise NotImplementedError

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.world_model_objective is None:
            return  # vanilla RL: nothing to balance
        lambdas = self.lambdas(trainer.datamodule.rollout.trajectories)
        pl_module.wm_lambda = lambdas
        if lambdas:
            pl_module.log("train/wm/lambda_mean", sum(lambdas.values()) / len(lambdas), sync_dist=True)


class FixedLambda(_Balancing):
    """λ_g = ``value`` for every group (the "λ = 1" ablation, ECHO / WM-SFT baselines)."""

    def __init__(self, value: float = 1.0):
        self.value = value

    def lambdas(self, trajectories) -> dict[int, float]:
        return {g: self.value for g in group_mean_returns(trajectories)}


class RewardAdaptiveLambda(_Balancing):
    """λ_g = clamp(1 − R̄_g / R_max, low, high): groups that already succeed get less
    world-model weight. The clamp (ours, default [0, 1]) handles negative mean returns
    (invalid-action penalties) and returns above ``r_max``.

    Args:
        r_max: the largest achievable return (ALFWorld 10; FrozenLake and Sokoban 1).
        clamp_low / clamp_high: the clamp bounds.
    """

    def __init__(self, r_max: float = 10.0, clamp_low: float = 0.0, clamp_high: float = 1.0):
        if r_max <= 0:
            raise ValueError(f"r_max must be positive (got {r_max})")
        self.r_max, self.clamp_low, self.clamp_high = r_max, clamp_low, clamp_high

    def lambdas(self, trajectories) -> dict[int, float]:
        return {g: min(max(1.0 - r / self.r_max, self.clamp_low), self.clamp_high) for g, r in group_mean_returns(trajectories).items()}

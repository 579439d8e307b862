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


class LossBalancer(Callback):
    """Base class: subclasses map the update's trajectories to ``{group id: λ_g}``."""

    def lambdas(self, trajectories) -> dict[int, float]:
        raise NotImplementedError

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Hook for settings read from the environment (R_max)."""

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if pl_module.world_model_objective is None:
            return  # vanilla RL: nothing to balance
        lambdas = self.lambdas(trainer.datamodule.rollout.trajectories)
        pl_module.wm_lambda = lambdas
        if lambdas:
            pl_module.log("train/wm/lambda_mean", sum(lambdas.values()) / len(lambdas), sync_dist=True)


class FixedLambda(LossBalancer):
    """λ_g = ``value`` for every group (the "λ = 1" ablation, ECHO / WM-SFT baselines)."""

    def __init__(self, value: float = 1.0):
        self.value = value

    def lambdas(self, trajectories) -> dict[int, float]:
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

    def __init__(self, r_max: float | None = None, clamp_low: float = 0.0, clamp_high: float = 1.0):
        if r_max is not None and r_max <= 0:
            raise ValueError(f"r_max must be positive (got {r_max})")
        self.r_max, self.clamp_low, self.clamp_high = r_max, clamp_low, clamp_high

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.r_max is None:
            self.r_max = getattr(trainer.datamodule, "max_return", None)
        if self.r_max is None:
            raise ValueError("RewardAdaptiveLambda needs r_max: set balancer.init_args.r_max (the environment does not declare max_return)")

    def lambdas(self, trajectories) -> dict[int, float]:
        return {g: min(max(1.0 - r / self.r_max, self.clamp_low), self.clamp_high) for g, r in group_mean_returns(trajectories).items()}

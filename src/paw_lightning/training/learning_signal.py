"""Say so when RL has nothing to learn from.

Group baselines (GRPO, GiGPO, RLOO, METHODS.md §2) give a sample the advantage 0 when every
episode of its group got the same return: with all groups flat, every advantage is 0, the
policy loss has no gradient and the policy does not move (a world-model term still trains).
A policy that never wins, or that plays the same losing moves in every episode of a group,
can stay there for the whole run. The data module logs ``train/policy/zero_advantage_fraction``
every update and prints one warning after ``patience`` flat updates in a row.
"""
from __future__ import annotations

import torch

NO_SIGNAL_UPDATES = 3  # flat updates in a row before the warning


def zero_advantage_fraction(advantages: torch.Tensor) -> float:
    """The share of samples whose advantage is exactly 0 (group normalisation of equal returns
    gives (r − mean) / (std + ε) = 0 exactly); 0.0 for no samples."""
    return float((advantages == 0).float().mean()) if advantages.numel() else 0.0


class LearningSignalWatch:
    """Counts RL updates in a row in which every advantage was 0 and returns the warning once
    per such streak, when it reaches ``patience`` updates."""

    def __init__(self, patience: int = NO_SIGNAL_UPDATES):
        if patience < 1:
            raise ValueError(f"patience must be at least 1 (got {patience})")
        self.patience = patience
        self.flat_updates = 0

    def observe(self, all_zero: bool, success_rate: float | None = None) -> str | None:
        self.flat_updates = self.flat_updates + 1 if all_zero else 0
        if self.flat_updates != self.patience:
            return None
        success = "" if success_rate is None else f"; success rate of the last rollout {success_rate:.0%}"
        return (
            f"warning: no learning signal for {self.patience} updates in a row: every advantage was 0 (in each group all "
            f"episodes got the same return{success}), so the policy loss had no gradient and the policy did not change. "
            "RL needs groups in which some episodes do better than others: start from a warm-up "
            "(stages.warmup: paw_lightning.callbacks.BehaviourCloningWarmup, e.g. -c configs/warmup.yaml), raise data.rollout.temperature or data.rollout.group_size, "
            "or use an easier task (train/policy/zero_advantage_fraction shows it per update)."
        )

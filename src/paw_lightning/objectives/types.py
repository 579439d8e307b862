"""Shared value types of the objectives: what goes in, what comes out."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    """A scalar loss plus detached diagnostics, keyed ``component/name`` (e.g. ``policy/clip_frac``)."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepInfo:
    """Per-step-sample facts an advantage estimator needs, all aligned on dimension 0 (N samples).

    ``group_ids``: task group of the sample (G trajectories of one task share it).
    ``traj_ids``: trajectory of the sample, unique across the whole update.
    ``step_ids``: index t of the step inside its trajectory.
    ``rewards``: r_t of that step (invalid-action penalty already included).
    ``anchor_obs``: the current observation o_t as text (GiGPO's anchor state).
    ``values``: the critic's V(h_t) from the scoring pass (only with a critic, PPO).
    """

    group_ids: torch.Tensor
    traj_ids: torch.Tensor
    step_ids: torch.Tensor
    rewards: torch.Tensor
    anchor_obs: list[str] = field(default_factory=list)
    values: torch.Tensor | None = None

    def trajectory_returns(self) -> torch.Tensor:
        """R(τ) = Σ_t r_t of each sample's trajectory, broadcast to every step sample (shape N)."""
        _, inverse = torch.unique(self.traj_ids, return_inverse=True)
        totals = torch.zeros(int(inverse.max()) + 1, dtype=self.rewards.dtype).index_add_(0, inverse, self.rewards)
        return totals[inverse]

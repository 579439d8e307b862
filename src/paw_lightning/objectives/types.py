"""Shared value types of the objectives: what goes in, what comes out."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class LossOutput:
    """A scalar loss plus detached diagnostics, keyed ``component/name`` (e.g. ``policy/clip_frac``);
    ``terms``: the loss's terms by name, with their graphs (``PaWModule.compute_loss``: ``policy``,
    ``world_model``), for :mod:`paw_lightning.training.term_gradients`."""

    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)
    terms: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class StepInfo:
    """Per-step-sample facts an advantage estimator needs, all aligned on dimension 0 (N samples).

    ``group_ids``: task group of the sample (G trajectories of one task share it).
    ``traj_ids``: trajectory of the sample, unique across the whole update.
    ``step_ids``: index t of the step inside its trajectory.
    ``rewards``: r_t of that step (invalid-action penalty already included).
    ``penalties``: the penalties included in ``rewards`` (the invalid-action penalty, e.g. −0.1 on
    an invalid step, and DAPO's overlong penalty), so ``rewards − penalties`` is the environment's own reward; ``None``
    when unknown, read as no penalty anywhere. Only GiGPO's ``penalty_mode: after_discount`` reads it.
    ``anchor_obs``: the current observation o_t as text (GiGPO's anchor state).
    ``values``: the critic's V(h_t) from the scoring pass (only with a critic, PPO).
    ``invalid``: whether the step's response had no well-formed action (bool); ``None`` when
    unknown, read as every response valid. Only ``PolicyObjective(invalid_advantage=…)`` reads it.
    """

    group_ids: torch.Tensor
    traj_ids: torch.Tensor
    step_ids: torch.Tensor
    rewards: torch.Tensor
    anchor_obs: list[str] = field(default_factory=list)
    values: torch.Tensor | None = None
    penalties: torch.Tensor | None = None
    invalid: torch.Tensor | None = None

    def trajectory_returns(self, rewards: torch.Tensor | None = None) -> torch.Tensor:
        """R(τ) = Σ_t r_t of each sample's trajectory, broadcast to every step sample (shape N).

        ``rewards``: per-step values to sum instead of ``self.rewards`` (e.g. ``env_rewards()``).
        """
        rewards = self.rewards if rewards is None else rewards
        _, inverse = torch.unique(self.traj_ids, return_inverse=True)
        totals = torch.zeros(int(inverse.max()) + 1, dtype=rewards.dtype).index_add_(0, inverse, rewards)
        return totals[inverse]

    def step_penalties(self) -> torch.Tensor:
        """``penalties`` shaped like ``rewards``, floating point (zeros when ``None``)."""
        dtype = self.rewards.dtype if self.rewards.is_floating_point() else torch.get_default_dtype()
        if self.penalties is None:
            return torch.zeros(self.rewards.shape, dtype=dtype)
        if self.penalties.shape != self.rewards.shape:
            raise ValueError(f"need one penalty per step sample, got shape {tuple(self.penalties.shape)} for {tuple(self.rewards.shape)}")
        return self.penalties.to(dtype)

    def env_rewards(self) -> torch.Tensor:
        """The environment's own reward of each step, ``rewards − penalties`` (shape N, floating point)."""
        penalties = self.step_penalties()
        return self.rewards.to(penalties.dtype) - penalties

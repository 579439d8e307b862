"""PPO with a critic: turn-level GAE advantages and a clipped value loss (METHODS.md §2).
:class:`GAE` is the estimator; :class:`Critic` is everything else PPO adds (a value head
``V_t = V(h_t)`` at the prompt's final token, the value loss, its weight, the head's lr)::

    δ_t = r_t + γ·V_{t+1} − V_t      A_t = δ_t + γλ·A_{t+1}      R_t = A_t + V_t   (V_{T} = 0)
    L_V = ½ · mean( max((V − R)², (V_old + clip(V − V_old, −ε_v, ε_v) − R)²) )

Simplifications: an episode cut at ``max_steps`` is terminal (no bootstrap); ``whiten`` uses
this rank's update; ``value/explained_variance`` is exact only with one micro-batch.
"""
from __future__ import annotations

import torch

from paw_lightning.objectives.advantages import AdvantageEstimator
from paw_lightning.objectives.types import LossOutput, StepInfo
from paw_lightning.ranges import ClosedUnitInterval, NonNegativeFloat, PositiveFloat


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, traj_ids: torch.Tensor, step_ids: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, value targets) per step sample, by the recursion of the module docstring."""
    advantages = torch.zeros_like(rewards)
    for traj in torch.unique(traj_ids):
        idx = (traj_ids == traj).nonzero().squeeze(1)
        idx = idx[torch.argsort(step_ids[idx])]
        next_value, next_adv = 0.0, 0.0
        for i in reversed(idx.tolist()):
            delta = rewards[i] + gamma * next_value - values[i]
            next_adv = delta + gamma * lam * next_adv
            advantages[i] = next_adv
            next_value = values[i]
    return advantages, advantages + values


class GAE(AdvantageEstimator):
    """PPO's critic-based estimator; it reads the scoring pass's V(h_t), so it needs a
    :class:`Critic` (``model.critic``).

    Args:
        gamma: discount across steps.
        lam: GAE λ.
        whiten: normalise the advantages over the update (mean 0, std 1).
    """

    needs_values = True
    compares_episodes = False  # the baseline is the critic's V(h_t), not the other episodes

    def __init__(self, gamma: ClosedUnitInterval = 1.0, lam: ClosedUnitInterval = 0.95, whiten: bool = True):
        self.gamma, self.lam, self.whiten = gamma, lam, whiten

    def advantages_and_returns(self, info: StepInfo) -> tuple[torch.Tensor, torch.Tensor]:
        if info.values is None:
            raise ValueError("GAE needs the scoring pass's values (StepInfo.values)")
        advantages, returns = gae_advantages(info.rewards, info.values, info.traj_ids, info.step_ids, self.gamma, self.lam)
        if self.whiten and advantages.numel() > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return advantages, returns

    def __call__(self, info: StepInfo) -> torch.Tensor:
        return self.advantages_and_returns(info)[0]


class Critic(torch.nn.Module):
    """The value head, its clipped value loss, the loss's weight and the head's learning rate.

    Args:
        value_coef: weight of the value loss in the total loss.
        value_clip: ε_v of the clipped value loss.
        lr: learning rate of the value head (the actor's comes from ``model.optimizer``).
    """

    def __init__(self, value_coef: NonNegativeFloat = 0.5, value_clip: PositiveFloat = 0.2, lr: PositiveFloat = 1e-4):
        super().__init__()
        if value_coef < 0 or value_clip <= 0 or lr <= 0:
            raise ValueError(f"model.critic needs value_coef >= 0, value_clip > 0 and lr > 0 (got {value_coef}, {value_clip}, {lr})")
        self.value_coef, self.value_clip, self.lr = value_coef, value_clip, lr
        self.head: torch.nn.Linear | None = None  # built for the model's hidden size (build)

    def build(self, hidden_size: int) -> None:
        """Create the head: weights ~ N(0, 1e-3²), bias 0, so V starts near 0."""
        if self.head is None:
            self.head = torch.nn.Linear(hidden_size, 1)
            torch.nn.init.normal_(self.head.weight, std=1e-3)
            torch.nn.init.zeros_(self.head.bias)

    def forward(self, hidden_states: torch.Tensor, prompt_lengths: torch.Tensor) -> torch.Tensor:
        """V(h_t): the head on each sample's last prompt token, shape (B,)."""
        last_prompt = hidden_states[torch.arange(len(hidden_states)), prompt_lengths - 1]
        return self.head(last_prompt.float()).squeeze(-1)

    def parameter_group(self) -> dict:
        """The head's optimizer parameter group, with its own learning rate."""
        return {"params": list(self.head.parameters()), "lr": self.lr}

    def loss(self, values: torch.Tensor, batch: dict[str, torch.Tensor], samples: int | None = None) -> LossOutput:
        """The critic's term of the total loss, ``value_coef · L_V`` (metrics: unweighted)."""
        value = self.value_loss(values, batch["old_values"], batch["returns"], samples)
        return LossOutput(self.value_coef * value.loss, value.metrics)

    def value_loss(self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, samples: int | None = None) -> LossOutput:
        """The clipped value loss of a batch; ``samples``: the whole mini-batch's sample count
        when this batch is one micro-batch of it (default: this batch's)."""
        n = max(samples if samples is not None else len(values), 1)
        clipped = old_values + (values - old_values).clamp(-self.value_clip, self.value_clip)
        loss = 0.5 * torch.maximum((values - returns).square(), (clipped - returns).square()).sum() / n
        residual_var = (returns - values.detach()).var(unbiased=False)
        explained = 1 - residual_var / returns.var(unbiased=False).clamp(min=1e-8)
        return LossOutput(
            loss=loss,
            metrics={
                "value/loss": loss.detach(),
                "value/explained_variance": explained * (len(values) / n),
                "value/mean": values.detach().sum() / n,
                "value/clip_frac": ((values - old_values).abs() > self.value_clip).float().sum() / n,
            },
        )

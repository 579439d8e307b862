"""World-model loss: predict the next observation o_{t+1} from (h_t, a_t) (METHODS.md §3).

Per transition i (one step sample), over its observation tokens (``obs_mask``)::

    ℓ_i = −Σ_t m_t log p_t / |o_{t+1}|          (cross-entropy, a per-transition token mean)

and over the batch, with G the number of task groups present in it and λ_g the
reward-adaptive weight of group g (computed by the balancing callback)::

    L_WM = (1/G) Σ_g λ_g · mean_{i ∈ g, selected} ℓ_i

This is the world-model half of METHODS' ``mean_g[L_RL(g) + λ_g L_WM(S_α ∩ P_g)]``:
a group with no selected transition has no WM term but still counts in G, exactly as
it counts in the mean over groups of the total. ``selected`` is the entropy selection
S_α, decided outside (over the whole update); a transition without observation tokens
is never selected. Subclasses (clipped MAE, …) override ``transition_losses`` only.
"""
from __future__ import annotations

import torch

from paw_lightning.objectives.types import LossOutput


class WorldModelObjective:
    """Next-observation cross-entropy, group-weighted by λ_g (plain CE; also the ECHO / WM-SFT baseline).

    Metrics (detached): ``wm/loss`` (unweighted mean ℓ over the selected transitions),
    ``wm/weighted_loss`` (the returned loss), ``wm/selected_fraction`` (selected / all
    transitions of the batch), ``wm/lambda_mean`` (mean λ over the batch's groups).
    """

    def transition_losses(self, obs_logprobs: torch.Tensor, obs_mask: torch.Tensor) -> torch.Tensor:
        """ℓ_i = −Σ_t m_t log p_t / |o_{t+1}| per transition, shape (B,); 0 for a row without obs tokens."""
        mask = obs_mask.bool()
        picked = torch.where(mask, obs_logprobs, torch.zeros_like(obs_logprobs))
        return -picked.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)

    def __call__(
        self,
        obs_logprobs: torch.Tensor,
        obs_mask: torch.Tensor,
        group_ids: torch.Tensor,
        group_weights: torch.Tensor,
        selected: torch.Tensor | None = None,
    ) -> LossOutput:
        """The world-model loss of one batch.

        Args:
            obs_logprobs: (B, T) log-probability of the token at each position (carries the gradient).
            obs_mask: (B, T) bool, True on the tokens of o_{t+1}.
            group_ids: (B,) task group of each transition.
            group_weights: (B,) λ of each transition's group (one value per group).
            selected: (B,) bool, the transitions in S_α; default all.
        """
        mask = obs_mask.bool()
        has_obs = mask.any(dim=-1)
        selected = has_obs if selected is None else selected.bool() & has_obs
        losses = self.transition_losses(obs_logprobs, mask)
        losses = torch.where(selected, losses, torch.zeros_like(losses))

        _, groups = torch.unique(group_ids, return_inverse=True)
        num_groups = int(groups.max()) + 1 if groups.numel() else 0
        sums = losses.new_zeros(num_groups).index_add(0, groups, losses)
        counts = torch.bincount(groups[selected], minlength=num_groups).to(losses.dtype)
        lambdas = losses.new_zeros(num_groups).scatter(0, groups, group_weights.to(losses.dtype))
        group_means = sums / counts.clamp(min=1)  # 0 for a group with no selected transition
        loss = (lambdas * group_means).sum() / max(num_groups, 1)

        num_selected = selected.sum()
        metrics = {
            "wm/loss": (losses.sum() / num_selected.clamp(min=1)).detach(),
            "wm/weighted_loss": loss.detach(),
            "wm/selected_fraction": num_selected.to(losses.dtype) / max(selected.numel(), 1),
            "wm/lambda_mean": lambdas.mean().detach() if num_groups else losses.new_zeros(()),
        }
        return LossOutput(loss=loss, metrics=metrics)

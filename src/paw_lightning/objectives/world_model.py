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
is never selected. Subclasses (clipped MAE, …) override ``transition_losses`` (and
``token_metrics``) only.
"""
from __future__ import annotations

import torch

from paw_lightning.objectives.selection import EntropyEstimator, select_global_top_alpha
from paw_lightning.objectives.types import LossOutput


class WorldModelObjective:
    """Next-observation cross-entropy, group-weighted by λ_g (plain CE; also the ECHO / WM-SFT baseline).

    Args:
        alpha: fraction of the update's transitions (highest action entropy, over all
            ranks) that get the world-model loss; 1 disables the selection.
        entropy: action-entropy estimator of the selection: ``full`` (full-vocabulary
            Shannon entropy) or ``sampled`` (the paper's −q log q of the sampled token).

    Metrics (detached): ``wm/loss`` (unweighted mean ℓ over the selected transitions),
    ``wm/weighted_loss`` (the returned loss), ``wm/selected_fraction`` (selected / all
    transitions of the batch), ``wm/lambda_mean`` (mean λ over the batch's groups).
    """

    def __init__(self, alpha: float = 0.75, entropy: EntropyEstimator = "full"):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"world-model alpha must be in (0, 1] (got {alpha})")
        if entropy not in ("full", "sampled"):
            raise ValueError(f"unknown entropy estimator {entropy!r}: use 'full' or 'sampled'")
        self.alpha, self.entropy = alpha, entropy

    def select(self, entropies: torch.Tensor) -> torch.Tensor:
        """S_α: this rank's transitions among the top α of the whole update (a collective)."""
        return select_global_top_alpha(entropies, self.alpha)

    def token_metrics(self, obs_logprobs: torch.Tensor, obs_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra detached diagnostics over the observation tokens of the selected transitions."""
        return {}

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
            **self.token_metrics(obs_logprobs.detach(), mask & selected[:, None]),
            "wm/loss": (losses.sum() / num_selected.clamp(min=1)).detach(),
            "wm/weighted_loss": loss.detach(),
            "wm/selected_fraction": num_selected.to(losses.dtype) / max(selected.numel(), 1),
            "wm/lambda_mean": lambdas.mean().detach() if num_groups else losses.new_zeros(()),
        }
        return LossOutput(loss=loss, metrics=metrics)


class ClippedMAE(WorldModelObjective):
    """PaW's noise-tolerant clipped MAE (METHODS.md §3b).

    For observation token i with p_i = π_θ(o^(i) | h_t, a_t, o^(<i)): ``m_i = 1[p_i ≤ ρ]``
    on a detached p (tokens already predicted above ρ count as learned), and per transition
    ``ℓ = Σ_i m_i (1 − p_i) / |o_{t+1}|`` — the denominator is the full observation length,
    not the number of kept tokens. Its gradient is ``−∇p`` instead of CE's ``−∇p / p``, so
    unpredictable tokens cannot dominate. ``wm/clipped_ratio``: share of the selected
    transitions' observation tokens dropped by the mask (p > ρ).

    Args:
        rho: the probability above which a token counts as learned (paper: 0.2).
        alpha, entropy: the selection, as in :class:`WorldModelObjective`.
    """

    def __init__(self, rho: float = 0.2, alpha: float = 0.75, entropy: EntropyEstimator = "full"):
        super().__init__(alpha=alpha, entropy=entropy)
        if not 0.0 < rho <= 1.0:
            raise ValueError(f"clipped-MAE rho must be in (0, 1] (got {rho})")
        self.rho = rho

    def transition_losses(self, obs_logprobs: torch.Tensor, obs_mask: torch.Tensor) -> torch.Tensor:
        mask = obs_mask.bool()
        p = torch.where(mask, obs_logprobs, torch.zeros_like(obs_logprobs)).exp()
        kept = mask & (p.detach() <= self.rho)
        return torch.where(kept, 1.0 - p, torch.zeros_like(p)).sum(-1) / mask.sum(-1).clamp(min=1)

    def token_metrics(self, obs_logprobs: torch.Tensor, obs_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        clipped = (obs_logprobs.exp() > self.rho) & obs_mask
        return {"wm/clipped_ratio": clipped.sum() / obs_mask.sum().clamp(min=1)}

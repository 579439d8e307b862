"""World-model loss: predict the next observation o_{t+1} from (h_t, a_t) (METHODS.md §3).
Per transition i, over its observation tokens (``obs_mask``), and over the batch's G task groups::

    ℓ_i = −Σ_t m_t log p_t / |o_{t+1}|          (cross-entropy, a per-transition token mean)
    L_WM = (1/G) Σ_g λ_g · mean_{i ∈ g, selected} ℓ_i

λ_g arrives per sample (``wm_lambda``) from the ``balancer``; ``selected`` is S_α, decided
outside; a group without selected transitions adds nothing but counts in G. Subclasses (clipped
MAE, …) override ``transition_losses`` (and ``token_metrics``); micro-batches: see ``totals``.
"""
from __future__ import annotations

import torch

from paw_lightning.objectives.balancing import LossBalancer, RewardAdaptiveLambda
from paw_lightning.objectives.selection import EntropyEstimator, select_global_top_alpha
from paw_lightning.objectives.types import LossOutput
from paw_lightning.ranges import UnitIntervalOpenClosed


class WorldModelObjective:
    """Next-observation cross-entropy, group-weighted by λ_g (plain CE; also the ECHO / WM-SFT baseline).

    Args:
        alpha: fraction of the update's transitions (highest action entropy, over all
            ranks) that get the world-model loss; 1 disables the selection.
        entropy: action-entropy estimator of the selection: ``full`` (full-vocabulary
            Shannon entropy) or ``sampled`` (the paper's −q log q of the sampled token).
        balancer: λ_g per task group (:mod:`paw_lightning.objectives.balancing`); default
            PaW's ``RewardAdaptiveLambda()`` (R_max from the environment).

    Metrics (detached): ``wm/loss`` (unweighted mean ℓ over the selected transitions),
    ``wm/weighted_loss`` (the returned loss), ``wm/selected_fraction`` (selected / all
    transitions of the batch), ``wm/lambda_mean`` (mean λ over the batch's groups).
    """

    def __init__(self, alpha: UnitIntervalOpenClosed = 0.75, entropy: EntropyEstimator = "full", balancer: LossBalancer | None = None):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"world-model alpha must be in (0, 1] (got {alpha})")
        if entropy not in ("full", "sampled"):
            raise ValueError(f"unknown entropy estimator {entropy!r}: use 'full' or 'sampled'")
        self.alpha, self.entropy = alpha, entropy
        self.balancer = balancer if balancer is not None else RewardAdaptiveLambda()

    def select(self, entropies: torch.Tensor) -> torch.Tensor:
        """S_α: this rank's transitions among the top α of the whole update (a collective)."""
        return select_global_top_alpha(entropies, self.alpha)

    def token_metrics(self, obs_logprobs: torch.Tensor, obs_mask: torch.Tensor) -> dict[str, torch.Tensor]:
        """Extra detached diagnostics, each a mean over the True tokens of ``obs_mask`` (the
        observation tokens of the selected transitions)."""
        return {}

    def totals(self, obs_mask: torch.Tensor, group_ids: torch.Tensor, wm_lambda: torch.Tensor, selected: torch.Tensor | None = None) -> dict:
        """The mini-batch's normalisers, for calls on micro-batches of it: its sorted group ids
        and selected transitions per group (tensors), number of groups, selected transitions,
        samples, selected observation tokens, and the mean λ over its groups."""
        mask = obs_mask.bool()
        selected = self._selected(mask, selected)
        ids, groups = torch.unique(group_ids, return_inverse=True)
        lambdas = torch.zeros(len(ids), dtype=torch.float64, device=group_ids.device).scatter(0, groups, wm_lambda.double())
        return {
            "group_ids": ids,
            "group_selected": torch.bincount(groups[selected], minlength=len(ids)),
            "groups": len(ids),
            "selected": int(selected.sum()),
            "samples": len(group_ids),
            "selected_obs_tokens": int((mask & selected[:, None]).sum()),
            "lambda_mean": float(lambdas.mean()) if len(ids) else 0.0,
        }

    @staticmethod
    def _selected(obs_mask: torch.Tensor, selected: torch.Tensor | None) -> torch.Tensor:
        has_obs = obs_mask.any(dim=-1)
        return has_obs if selected is None else selected.bool() & has_obs

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
        wm_lambda: torch.Tensor,
        selected: torch.Tensor | None = None,
        totals: dict | None = None,
    ) -> LossOutput:
        """The world-model loss of one batch (or, with ``totals``, its additive share of the mini-batch's).

        Args:
            obs_logprobs: (B, T) log-probability of the token at each position (carries the gradient).
            obs_mask: (B, T) bool, True on the tokens of o_{t+1}.
            group_ids: (B,) task group of each transition.
            wm_lambda: (B,) λ_g of each transition's group (one value per group).
            selected: (B,) bool, the transitions in S_α; default all.
            totals: ``self.totals(…)`` of the whole mini-batch this batch is part of;
                default: of this batch.
        """
        mask = obs_mask.bool()
        selected = self._selected(mask, selected)
        totals = totals if totals is not None else self.totals(mask, group_ids, wm_lambda, selected)
        losses = self.transition_losses(obs_logprobs, mask)
        losses = torch.where(selected, losses, torch.zeros_like(losses))

        # λ_g / (G · |S_α ∩ g|) per transition: a group with no selected transition has no term
        per_group = totals["group_selected"][torch.searchsorted(totals["group_ids"], group_ids)]
        weights = wm_lambda.to(losses.dtype) / per_group.clamp(min=1).to(losses.dtype) / max(totals["groups"], 1)
        loss = (weights * losses).sum()

        selected_tokens = mask & selected[:, None]
        token_share = selected_tokens.sum().to(losses.dtype) / max(totals["selected_obs_tokens"], 1)
        sample_share = len(group_ids) / max(totals["samples"], 1)
        metrics = {
            **{k: v * token_share for k, v in self.token_metrics(obs_logprobs.detach(), selected_tokens).items()},
            "wm/loss": (losses.sum() / max(totals["selected"], 1)).detach(),
            "wm/weighted_loss": loss.detach(),
            "wm/selected_fraction": selected.sum().to(losses.dtype) / max(totals["samples"], 1),
            "wm/lambda_mean": losses.new_tensor(sample_share * totals["lambda_mean"]),
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
        alpha, entropy, balancer: the selection and λ_g, as in :class:`WorldModelObjective`.
    """

    def __init__(self, rho: UnitIntervalOpenClosed = 0.2, alpha: UnitIntervalOpenClosed = 0.75, entropy: EntropyEstimator = "full", balancer: LossBalancer | None = None):
        super().__init__(alpha=alpha, entropy=entropy, balancer=balancer)
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

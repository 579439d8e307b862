"""Clipped policy-gradient surrogate with a KL penalty to the reference policy (METHODS.md §2).

For every action token (``action_mask``), with ρ = exp(logπ_θ − logπ_old) and the
sample's advantage A broadcast to its action tokens::

    L = −agg( min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A) )
        + kl_coef · agg(KL(π_θ ‖ π_ref)) − entropy_coef · agg(H)

KL estimators (Schulman, "Approximating KL divergence"), with log r = logπ_ref − logπ_θ:
``k1 = −log r``, ``k2 = ½ (log r)²``, ``k3 = r − 1 − log r`` (verl's ``low_var_kl``).
As in verl, k3 clamps log r to [−20, 20] before the exp and the result to [−10, 10];
outside those bounds the token gives no KL gradient.

Aggregation: ``token-mean`` = sum over every action token of the batch / their number;
``sequence-mean`` = each sample's token mean, then the mean over samples that have at
least one action token. The batch passed in is the normaliser: callers that accumulate
gradients over micro-batches get a per-micro-batch mean (deliberate simplification).
Positions outside ``action_mask`` never reach the loss or its gradient (they may even
hold ±inf); an empty mask gives loss 0 with a zero gradient. No dual clip (verl's
``clip_ratio_c``) is applied.
"""
from __future__ import annotations

from typing import Literal

import torch

from paw_lightning.objectives.advantages import GRPO, AdvantageEstimator
from paw_lightning.objectives.types import LossOutput, StepInfo

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token-mean", "sequence-mean"]


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3") -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from log-probs of the sampled tokens (same shape)."""
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    if estimator == "k3":
        log_r = log_r.clamp(-20.0, 20.0)
        return (log_r.exp() - 1.0 - log_r).clamp(-10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token-mean") -> torch.Tensor:
    """Masked mean of (B, T) ``values`` over the True positions of ``mask``; 0 when the mask is empty."""
    values = torch.where(mask, values, torch.zeros_like(values))
    if mode == "token-mean":
        return values.sum() / mask.sum().clamp(min=1)
    if mode == "sequence-mean":
        counts = mask.sum(dim=-1)
        per_sample = values.sum(dim=-1) / counts.clamp(min=1)
        return per_sample.sum() / (counts > 0).sum().clamp(min=1)
    raise ValueError(f"unknown aggregation {mode!r}")


class PolicyObjective:
    """The RL loss: PPO-style clipped surrogate + KL to the reference + optional entropy bonus.

    Metrics (detached): ``policy/loss`` (the surrogate term alone), ``policy/kl`` (the
    aggregated KL, when ``ref_logprobs`` is given), ``policy/entropy`` (when ``entropy`` is
    given), and as token means over the action tokens: ``policy/clip_frac`` (tokens whose
    clipped term is the active one, i.e. carries no gradient), ``policy/approx_kl``
    (½ (logπ_θ − logπ_old)²), ``policy/ratio_mean``, ``policy/advantage_mean`` and
    ``policy/advantage_std`` (population std, so one token gives 0, not NaN).
    """

    def __init__(
        self,
        advantage: AdvantageEstimator | None = None,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        kl_coef: float = 0.01,
        kl_estimator: KLEstimator = "k3",
        entropy_coef: float = 0.0,
        aggregation: Aggregation = "token-mean",
    ) -> None:
        """
        Args:
            advantage: estimator that turns the update's step samples into one advantage
                per sample (default: ``GRPO()``).
            clip_low: ε_low, the ratio is clipped below at 1 − clip_low.
            clip_high: ε_high, the ratio is clipped above at 1 + clip_high.
            kl_coef: weight of the KL(π_θ ‖ π_ref) loss term; 0 disables it and the
                reference forward pass.
            kl_estimator: per-token KL estimator: ``k1`` (−log r), ``k2`` (½ log² r) or
                ``k3`` (r − 1 − log r, verl's ``low_var_kl``), r = π_ref / π_θ.
            entropy_coef: weight of the entropy bonus (subtracted from the loss).
            aggregation: ``token-mean`` over all action tokens of the batch, or
                ``sequence-mean`` (per-sample token mean, then mean over samples).
        """
        if kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"unknown KL estimator {kl_estimator!r}")
        if aggregation not in ("token-mean", "sequence-mean"):
            raise ValueError(f"unknown aggregation {aggregation!r}")
        self.advantage = advantage if advantage is not None else GRPO()
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator
        self.entropy_coef = entropy_coef
        self.aggregation = aggregation

    @property
    def needs_reference(self) -> bool:
        """Whether reference log-probs must be computed (only when the KL term is on)."""
        return self.kl_coef > 0

    def advantages(self, info: StepInfo) -> torch.Tensor:
        """One advantage per step sample (N,), from the configured estimator."""
        return self.advantage(info)

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
    ) -> LossOutput:
        """The loss of one batch.

        Args:
            logprobs: (B, T) log π_θ of the token at each position (carries the gradient).
            old_logprobs: (B, T) log π_old recorded when the update's batch was formed.
            advantages: (B,) one advantage per sample, broadcast to its action tokens.
            action_mask: (B, T) bool, True on response tokens.
            ref_logprobs: (B, T) log π_ref; required when ``kl_coef > 0``.
            entropy: (B, T) per-token entropy of π_θ; required when ``entropy_coef > 0``.
        """
        if self.kl_coef > 0 and ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        if self.entropy_coef > 0 and entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        mask = action_mask.bool()
        zeros = torch.zeros_like(logprobs)

        def agg(values: torch.Tensor) -> torch.Tensor:
            return aggregate(values, mask, self.aggregation)

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            return aggregate(values.detach(), mask, "token-mean")

        # Zero the log-ratio off the mask first so that ±inf there cannot make NaN gradients.
        log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)
        ratio = log_ratio.exp()
        adv = advantages.detach().to(logprobs.dtype)[:, None]
        unclipped = ratio * adv
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high) * adv
        surrogate = -agg(torch.minimum(unclipped, clipped))
        loss = surrogate

        metrics = {
            "policy/loss": surrogate.detach(),
            "policy/clip_frac": token_mean((clipped < unclipped).to(logprobs.dtype)),
            "policy/approx_kl": token_mean(0.5 * log_ratio.square()),
            "policy/ratio_mean": token_mean(ratio),
        }
        if ref_logprobs is not None:
            kl = kl_penalty(torch.where(mask, logprobs, zeros), torch.where(mask, ref_logprobs, zeros), self.kl_estimator)
            kl_term = agg(kl)
            loss = loss + self.kl_coef * kl_term
            metrics["policy/kl"] = kl_term.detach()
        if entropy is not None:
            entropy_term = agg(entropy)
            loss = loss - self.entropy_coef * entropy_term
            metrics["policy/entropy"] = entropy_term.detach()

        adv_tokens = adv.expand_as(logprobs)
        adv_mean = token_mean(adv_tokens)
        metrics["policy/advantage_mean"] = adv_mean
        metrics["policy/advantage_std"] = token_mean((adv_tokens - adv_mean).square()).sqrt()
        return LossOutput(loss=loss, metrics=metrics)

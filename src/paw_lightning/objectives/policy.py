"""Clipped policy-gradient surrogate with a KL penalty to the reference policy (METHODS.md §2, §7).
For every action token, with the ratio ρ and the sample's advantage A::

    L = −agg( min(ρ·A, clip(ρ, 1 − clip_low, 1 + clip_high)·A) )
        + kl_coef · agg(KL(π_θ ‖ π_ref)) − entropy_coef · agg(H)

``importance_sampling: token``: ρ_{i,t} = exp(logπ_θ − logπ_old) (PPO/GRPO). ``sequence`` (GSPO,
Zheng et al. 2025, in its GSPO-token form): every token of sample i carries the sequence ratio
s_i = exp((1/|y_i|) Σ_t log ρ_{i,t}) as ``sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]``, equal to s_i in value
and giving ∇s_i = s_i · (1/|y_i|) Σ_t ∇logπ_θ(y_t); with one A per sample and
``seq-mean-token-mean`` the loss is GSPO's −mean_i min(s_i·A_i, clip(s_i)·A_i) in value and gradient.

Dual clip (Ye et al. 2020, verl's ``clip_ratio_c``; off unless ``clip_ratio_c`` is set): for A < 0
the term becomes max(min(ρ·A, clip(ρ)·A), c·A), so a token with ρ > c contributes the constant c·A.

An optional format guard bounds the advantage of an invalid response (no well-formed action):
A ← min(A, invalid_advantage), so an invalid response is never reinforced and is always pushed
down, also in an update without a win, while valid responses keep the estimator's A.

KL estimators k1, k2, k3 (k3 = verl's ``low_var_kl``, clamped as verl does); ``agg`` is one of
:mod:`~paw_lightning.objectives.aggregation`'s modes; given ``totals(…)`` each micro-batch returns
its additive share of the mini-batch's loss. Tokens outside ``action_mask`` never reach the loss.
"""
from __future__ import annotations

from typing import Literal

import torch

from paw_lightning.objectives.advantages import GRPO, AdvantageEstimator
from paw_lightning.objectives.aggregation import Aggregation, aggregate, aggregation_units, canonical
from paw_lightning.objectives.types import LossOutput, StepInfo
from paw_lightning.ranges import AboveOne, ClosedUnitInterval, NonNegativeFloat, NonPositiveFloat, PositiveInt

KLEstimator = Literal["k1", "k2", "k3"]
ImportanceSampling = Literal["token", "sequence"]


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


def guard_invalid(advantages: torch.Tensor, invalid: torch.Tensor | None, ceiling: float | None) -> torch.Tensor:
    """A ← min(A, ``ceiling``) on the samples whose response was ``invalid``; every other
    sample, and every sample when ``ceiling`` or ``invalid`` is ``None``, keeps its A."""
    if ceiling is None or invalid is None:
        return advantages
    return torch.where(invalid, advantages.clamp(max=ceiling), advantages)


def sequence_log_ratio(logprobs: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO-token's log s_{i,t} = sg[(1/|y_i|) Σ_t log ρ_{i,t}] + logπ_θ(y_t) − sg[logπ_θ(y_t)] on the
    True positions of ``mask`` (0 elsewhere): the sequence's mean log-ratio in value, each token's
    own log-prob in gradient. ``log_ratio``: (B, T) log ρ, already 0 off the mask."""
    logprobs = torch.where(mask, logprobs, torch.zeros_like(logprobs))
    mean = log_ratio.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    return torch.where(mask, mean.detach()[:, None] + logprobs - logprobs.detach(), torch.zeros_like(logprobs))


class PolicyObjective:
    """The RL loss: PPO-style clipped surrogate + KL to the reference + optional entropy bonus.

    Metrics (detached): ``policy/loss`` (the surrogate term alone), ``policy/kl`` (the
    aggregated KL, when ``ref_logprobs`` is given), ``policy/entropy`` (when ``entropy`` is
    given), and as token means over the action tokens: ``policy/clip_frac`` (tokens whose
    clipped term is the active one, i.e. carries no gradient), ``policy/approx_kl``
    (½ (logπ_θ − logπ_old)²), ``policy/ratio_mean``, ``policy/advantage_mean`` and
    ``policy/advantage_std`` (population std, so one token gives 0, not NaN); ``ratio_mean`` and
    ``clip_frac`` are of the ratio in use (with ``importance_sampling: sequence`` each token carries
    its s_i), ``approx_kl`` always of the token ratio. With ``importance_sampling: sequence``:
    ``policy/seq_clip_frac``, the share of samples whose sequence ratio is clipped; with
    ``clip_ratio_c``: ``policy/dual_clip_frac``, the token mean of "A < 0 and ρ > c" (the dual
    clip's constant is the active term; no gradient).
    """

    def __init__(
        self,
        advantage: AdvantageEstimator | None = None,
        clip_low: ClosedUnitInterval = 0.2,
        clip_high: NonNegativeFloat = 0.2,
        kl_coef: NonNegativeFloat = 0.01,
        kl_estimator: KLEstimator = "k3",
        entropy_coef: NonNegativeFloat = 0.0,
        aggregation: Aggregation = "token-mean",
        invalid_advantage: NonPositiveFloat | None = None,
        loss_norm_tokens: PositiveInt | None = None,
        importance_sampling: ImportanceSampling = "token",
        clip_ratio_c: AboveOne | None = None,
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
            aggregation: ``token-mean`` (over all action tokens of the mini-batch),
                ``seq-mean-token-mean`` (alias ``sequence-mean``), ``seq-mean-token-sum`` or
                ``seq-mean-token-sum-norm`` (Dr. GRPO), as :mod:`~paw_lightning.objectives.aggregation`.
            invalid_advantage: the format guard's ceiling c ≤ 0: an invalid response's
                advantage becomes min(A, c) (module docstring); ``None`` leaves every A as the
                estimator computed it. A drifting format otherwise feeds itself: once invalid
                responses lose as often as valid ones, they get A = 0 and nothing pulls the
                format back (docs/results/learning.md#format-guard).
            loss_norm_tokens: L of ``seq-mean-token-sum-norm`` (required there, read nowhere
                else): a constant, the generation budget; ``fit`` fills in
                ``data.rollout.max_new_tokens`` where it is null.
            importance_sampling: ``token`` (ρ per token) or ``sequence`` (GSPO's s_i; the clip
                range then applies to s_i, GSPO uses clip_low 3e-4, clip_high 4e-4).
            clip_ratio_c: c > 1 of the dual clip for A < 0 (verl's default 3.0); ``None``: off.
        """
        if kl_estimator not in ("k1", "k2", "k3"):
            raise ValueError(f"unknown KL estimator {kl_estimator!r}")
        aggregation = canonical(aggregation, loss_norm_tokens)
        if importance_sampling not in ("token", "sequence"):
            raise ValueError(f"importance_sampling must be 'token' or 'sequence', got {importance_sampling!r}")
        if clip_ratio_c is not None and not clip_ratio_c > 1:
            raise ValueError(f"clip_ratio_c must be above 1 (the dual clip's bound on ρ for A < 0; verl's default 3.0), got {clip_ratio_c}")
        if invalid_advantage is not None and not invalid_advantage <= 0:
            raise ValueError(f"invalid_advantage must be at most 0 (an invalid response is never reinforced), got {invalid_advantage}")
        self.advantage = advantage if advantage is not None else GRPO()
        self.clip_low = clip_low
        self.clip_high = clip_high
        self.kl_coef = kl_coef
        self.kl_estimator = kl_estimator
        self.entropy_coef = entropy_coef
        self.aggregation = aggregation
        self.invalid_advantage = invalid_advantage
        self.loss_norm_tokens = loss_norm_tokens
        self.importance_sampling = importance_sampling
        self.clip_ratio_c = clip_ratio_c

    @property
    def needs_reference(self) -> bool:
        """Whether reference log-probs must be computed (only when the KL term is on)."""
        return self.kl_coef > 0

    def advantages(self, info: StepInfo) -> torch.Tensor:
        """One advantage per step sample (N,): the configured estimator's, format-guarded."""
        return guard_invalid(self.advantage(info), info.invalid, self.invalid_advantage)

    def advantages_and_returns(self, info: StepInfo) -> tuple[torch.Tensor, torch.Tensor]:
        """A critic's estimator (PPO's GAE): the format-guarded advantages and its value targets."""
        advantages, returns = self.advantage.advantages_and_returns(info)
        return guard_invalid(advantages, info.invalid, self.invalid_advantage), returns

    def totals(self, advantages: torch.Tensor, action_mask: torch.Tensor) -> dict[str, float]:
        """The mini-batch's normalisers, for calls on micro-batches of it: aggregation units
        (``units``), action tokens (``tokens``), samples with an action token (``rows``), and the
        token mean and population std of the advantages (data, known before any forward)."""
        mask = action_mask.bool()
        counts = mask.sum(dim=-1).double()
        tokens = int(counts.sum())
        adv = advantages.detach().double()
        mean = float((counts * adv).sum()) / max(tokens, 1)
        var = float((counts * (adv - mean).square()).sum()) / max(tokens, 1)
        return {"units": aggregation_units(mask, self.aggregation, self.loss_norm_tokens), "tokens": tokens, "rows": int(mask.any(dim=-1).sum()),
                "advantage_mean": mean, "advantage_std": var**0.5}

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        entropy: torch.Tensor | None = None,
        totals: dict[str, float] | None = None,
        tis_weights: torch.Tensor | None = None,
    ) -> LossOutput:
        """The loss of one batch (or, with ``totals``, its additive share of the mini-batch's).

        Args:
            logprobs: (B, T) log π_θ of the token at each position (carries the gradient).
            old_logprobs: (B, T) log π_old recorded when the update's batch was formed.
            advantages: (B,) one advantage per sample, broadcast to its action tokens.
            action_mask: (B, T) bool, True on response tokens.
            ref_logprobs: (B, T) log π_ref; required when ``kl_coef > 0``.
            entropy: (B, T) per-token entropy of π_θ; required when ``entropy_coef > 0``.
            totals: ``self.totals(…)`` of the whole mini-batch this batch is part of;
                default: of this batch.
            tis_weights: (B, T) truncated importance weights min(π_old / π_engine, C) of
                rollouts from another engine; each token's surrogate is multiplied by its
                (detached) weight. ``None``: weight 1.
        """
        if self.kl_coef > 0 and ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        if self.entropy_coef > 0 and entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        mask = action_mask.bool()
        zeros = torch.zeros_like(logprobs)
        totals = totals if totals is not None else self.totals(advantages, mask)

        def agg(values: torch.Tensor) -> torch.Tensor:
            return aggregate(values, mask, self.aggregation, totals["units"], self.loss_norm_tokens)

        def token_mean(values: torch.Tensor) -> torch.Tensor:
            return aggregate(values.detach(), mask, "token-mean", totals["tokens"])

        # Zero the log-ratio off the mask first so that ±inf there cannot make NaN gradients.
        log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)
        used = sequence_log_ratio(logprobs, log_ratio, mask) if self.importance_sampling == "sequence" else log_ratio
        ratio = used.exp()
        adv = advantages.detach().to(logprobs.dtype)[:, None]
        unclipped = ratio * adv
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high) * adv
        per_token = torch.minimum(unclipped, clipped)
        if self.clip_ratio_c is not None:
            floor = self.clip_ratio_c * adv  # c·A, a lower bound on the objective where A < 0
            dual = (adv < 0) & (per_token < floor)
            per_token = torch.where(adv < 0, torch.maximum(per_token, floor), per_token)
        if tis_weights is not None:
            per_token = per_token * tis_weights.detach().to(per_token.dtype)
        surrogate = -agg(per_token)
        loss = surrogate

        metrics = {
            "policy/loss": surrogate.detach(),
            "policy/clip_frac": token_mean((clipped < unclipped).to(logprobs.dtype)),
            "policy/approx_kl": token_mean(0.5 * log_ratio.square()),
            "policy/ratio_mean": token_mean(ratio),
        }
        if self.importance_sampling == "sequence":  # a sample's tokens share s_i, so they clip together
            clipped_rows = ((clipped < unclipped) & mask).any(dim=-1)
            metrics["policy/seq_clip_frac"] = clipped_rows.to(logprobs.dtype).sum() / max(totals["rows"], 1)
        if self.clip_ratio_c is not None:
            metrics["policy/dual_clip_frac"] = token_mean(dual.to(logprobs.dtype))
        if ref_logprobs is not None:
            kl = kl_penalty(torch.where(mask, logprobs, zeros), torch.where(mask, ref_logprobs, zeros), self.kl_estimator)
            kl_term = agg(kl)
            loss = loss + self.kl_coef * kl_term
            metrics["policy/kl"] = kl_term.detach()
        if entropy is not None:
            entropy_term = agg(entropy)
            loss = loss - self.entropy_coef * entropy_term
            metrics["policy/entropy"] = entropy_term.detach()

        share = mask.sum().to(logprobs.dtype) / max(totals["tokens"], 1)  # of the mini-batch's action tokens
        metrics["policy/advantage_mean"] = share * totals["advantage_mean"]
        metrics["policy/advantage_std"] = share * totals["advantage_std"]
        return LossOutput(loss=loss, metrics=metrics)

"""How a per-token loss ℓ_{i,t} of a mini-batch becomes one number (verl's ``loss_agg_mode``,
METHODS.md §7). Over the N samples i with at least one action token, |y_i| their action tokens::

    token-mean               Σ_{i,t} ℓ / Σ_i |y_i|
    seq-mean-token-mean      (1/N) Σ_i (Σ_t ℓ / |y_i|)        alias: sequence-mean
    seq-mean-token-sum       (1/N) Σ_i Σ_t ℓ
    seq-mean-token-sum-norm  (1/N) Σ_i Σ_t ℓ / L              Dr. GRPO; L a constant (the generation budget)

Each is a sum of per-row terms over a mini-batch count (``aggregation_units``), so a micro-batch
divided by the whole mini-batch's count is its additive share of the mini-batch's value.
"""
from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "sequence-mean"]
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
ALIASES = {"sequence-mean": "seq-mean-token-mean"}


def canonical(mode: str, norm_tokens: int | None = None) -> str:
    """The mode's name in ``MODES`` (an alias resolved). ValueError for an unknown mode, and for
    ``seq-mean-token-sum-norm`` without a constant ``norm_tokens`` = L ≥ 1."""
    mode = ALIASES.get(mode, mode)
    if mode not in MODES:
        raise ValueError(f"unknown aggregation {mode!r}: choose one of {', '.join(MODES)} (or sequence-mean, an alias of seq-mean-token-mean)")
    if mode == "seq-mean-token-sum-norm" and (norm_tokens is None or norm_tokens < 1):
        raise ValueError(f"aggregation seq-mean-token-sum-norm divides by a constant L: set loss_norm_tokens (≥ 1; fit fills in the generation budget data.rollout.max_new_tokens for null), got {norm_tokens}")
    return mode


def aggregation_units(mask: torch.Tensor, mode: Aggregation = "token-mean", norm_tokens: int | None = None) -> int:
    """What ``aggregate`` divides by: the True positions (token-mean), the rows with one
    (seq-mean-*), times ``norm_tokens`` = L (seq-mean-token-sum-norm, where it is required)."""
    mode = canonical(mode, norm_tokens)
    if mode == "token-mean":
        return int(mask.sum())
    rows = int(mask.any(dim=-1).sum())
    return rows * norm_tokens if mode == "seq-mean-token-sum-norm" else rows


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "token-mean",
    denominator: float | None = None,
    norm_tokens: int | None = None,
) -> torch.Tensor:
    """(B, T) ``values`` over the True positions of ``mask`` as ``mode`` says; 0 when the mask is empty.

    ``denominator`` replaces :func:`aggregation_units` (e.g. the whole mini-batch's when
    ``values`` is one micro-batch of it); ``norm_tokens``: L of ``seq-mean-token-sum-norm``."""
    mode = canonical(mode, norm_tokens)
    values = torch.where(mask, values, torch.zeros_like(values))
    if mode == "seq-mean-token-mean":
        total = (values.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).sum()
    else:
        total = values.sum()
    count = aggregation_units(mask, mode, norm_tokens) if denominator is None else denominator
    return total / max(count, 1)

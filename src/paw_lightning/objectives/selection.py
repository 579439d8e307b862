"""Action-entropy data selection of PaW (METHODS.md §3a).

For each transition the mean action-token entropy ``H(a_t | h_t) = (1/|a_t|) Σ_i H_i``,
with ``H_i`` either the Shannon entropy of the full next-token distribution (``full``,
ours, default) or the paper's literal ``−q log q`` of the sampled token (``sampled``).
``S_α`` keeps the top α fraction of **all** transitions of the update, one global ranking
over every rank. Rounding and ties (ours): ``k = ceil(α·N)`` are kept; ties go to the
earlier position in the gathered order, so every rank computes the same set.

"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.distributed as dist

from paw_lightning.scale import distributed

EntropyEstimator = Literal["full", "sampled"]


def transition_entropy(token_entropy: torch.Tensor, logprobs: torch.Tensor, action_mask: torch.Tensor, estimator: EntropyEstimator) -> torch.Tensor:
    """Mean action-token entropy per transition (B,) from (B, T) per-token values.

    ``token_entropy``: full-vocabulary entropy at each position; ``logprobs``: log q of the
    token actually at each position (used by ``sampled``: −q log q).
    """
    if estimator == "full":
        per_token = token_entropy
    elif estimator == "sampled":
        per_token = -logprobs.exp() * logprobs
    else:
        raise ValueError(f"unknown entropy estimator {estimator!r}: use 'full' or 'sampled'")
    mask = action_mask.bool()
    per_token = torch.where(mask, per_token, torch.zeros_like(per_token))
    return per_token.sum(-1) / mask.sum(-1).clamp(min=1)


def top_alpha_mask(entropies: torch.Tensor, alpha: float) -> torch.Tensor:
    """Boolean mask of the ``ceil(α·N)`` highest entropies (ties: earlier index first)."""
    n = entropies.numel()
    if alpha >= 1.0:
        return torch.ones(n, dtype=torch.bool)
    k = math.ceil(alpha * n)
    order = sorted(range(n), key=lambda i: (-float(entropies[i]), i))
    mask = torch.zeros(n, dtype=torch.bool)
    mask[order[:k]] = True
    return mask


def select_global_top_alpha(local_entropies: torch.Tensor, alpha: float) -> torch.Tensor:
    """``top_alpha_mask`` over the transitions of every rank; returns this rank's part.

    A collective: every rank must call it. Also returns the same answer in one process."""
    local = local_entropies.detach().double().cpu()
    if not distributed.is_distributed():
        return top_alpha_mask(local, alpha)
    gathered = [None] * distributed.world_size()
    dist.all_gather_object(gathered, local.tolist())  # one collective: the parts carry their sizes
    everything = torch.tensor([h for part in gathered for h in part], dtype=torch.float64)
    start = sum(len(part) for part in gathered[: distributed.rank()])
    return top_alpha_mask(everything, alpha)[start : start + local.numel()]

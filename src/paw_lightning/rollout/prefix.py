"""Shared prompt prefixes: each is prefilled once, and its rows sample from copies of its cache.

A task group's G episodes see the same prompt at their first step and, later, prompts that agree
up to where their histories part. :func:`plan_shared_prefixes` splits a batch into clusters of
rows with a common prefix (contiguous runs of the sorted rows, the most tokens saved, by dynamic
programming) and is declined unless it saves ``min_saving`` of the padded prefill.
:func:`prefill` runs one forward over the clusters' prefixes and gives each row a copy of its
cluster's keys and values; ``generate`` then processes only the rest of each prompt.

Row r of cluster c is laid out as ``[pad][prefix_c][pad][rest of row r]``: the pads are masked
and positions count unmasked tokens (as ``generate`` derives them), so each token sees the keys,
values and positions of the plain left-padded layout, and the logits (and a seeded
``generate``'s samples) agree with it up to float rounding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache


@dataclass
class PrefixPlan:
    """Clusters of a batch's rows: ``prefixes[c]`` (token ids) is shared by the rows ``r`` with
    ``cluster_of[r] == c``; every row keeps at least one token after its prefix."""

    prefixes: list[list[int]]
    cluster_of: list[int]


def left_pad(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows left-padded to the longest: ``(input_ids, attention_mask)``."""
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows], dtype=torch.long)
    return input_ids, attention_mask


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def shared_prefix_length(rows: list[list[int]]) -> int:
    """The length of the prefix all ``rows`` share, capped so that each row keeps one token
    after it; 0 for fewer than two rows (nothing to share)."""
    if len(rows) < 2:
        return 0
    return max(0, min(min(common_prefix_length(rows[0], row) for row in rows[1:]), min(map(len, rows)) - 1))


def plan_shared_prefixes(rows: list[list[int]], min_saving: float = 0.2) -> PrefixPlan | None:
    """The clusters that save the most prompt tokens, or ``None`` if sharing would not save
    ``min_saving`` of the plain prefill's padded tokens (B·W for B rows of width W).

    Sorted rows put every cluster's rows next to each other. A run ``i..j`` of the sorted rows
    shares ``P(i..j)`` = the smallest common-prefix length of neighbours in the run, capped so
    that each row keeps one token for ``generate``, and saves ``(j − i)·P(i..j)`` tokens; the
    best split into runs is found by dynamic programming (O(B²), B ≤ a few hundred rows). The
    shared layout costs ``U·W_p + B·W_s`` padded tokens (U clusters, W_p the longest prefix,
    W_s the longest rest)."""
    if len(rows) < 2 or min(len(row) for row in rows) < 2:
        return None
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    ordered = [rows[i] for i in order]
    neighbours = [common_prefix_length(a, b) for a, b in zip(ordered, ordered[1:])]
    n = len(ordered)
    best = [0] * (n + 1)  # best[j]: the most tokens saved by runs covering ordered[:j]
    last_run = [(0, 0)] * (n + 1)  # (start, shared prefix length) of best[j]'s last run
    for j in range(1, n + 1):
        shared = len(ordered[j - 1]) - 1
        best[j], last_run[j] = best[j - 1], (j - 1, shared)  # ordered[j - 1] alone
        for i in range(j - 2, -1, -1):  # the run ordered[i:j]
            shared = min(shared, neighbours[i], len(ordered[i]) - 1)
            if shared == 0:
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], last_run[j] = best[i] + (j - 1 - i) * shared, (i, shared)
    prefixes, cluster_of, j = [], [0] * n, n
    while j > 0:
        i, shared = last_run[j]
        for position in range(i, j):
            cluster_of[order[position]] = len(prefixes)
        prefixes.append(ordered[i][:shared])
        j = i
    plan = PrefixPlan(prefixes, cluster_of)
    prefix_width = max(len(prefix) for prefix in prefixes)
    rest_width = max(len(row) - len(prefixes[c]) for row, c in zip(rows, cluster_of))
    shared_cost = len(prefixes) * prefix_width + len(rows) * rest_width
    plain_cost = len(rows) * max(len(row) for row in rows)
    return plan if shared_cost <= (1 - min_saving) * plain_cost else None


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions as ``generate`` derives them: unmasked tokens counted from 0, pads at 0."""
    return (attention_mask.cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


@torch.no_grad()
def prefill(model, rows: list[list[int]], plan: PrefixPlan, pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, DynamicCache]:
    """One forward over the plan's prefixes; returns the whole batch's ``input_ids`` and
    ``attention_mask`` in the shared layout and the cache of its prefix columns (one copy per
    row), ready for ``model.generate(input_ids, attention_mask, past_key_values=cache)``."""
    prefix_ids, prefix_mask = left_pad(plan.prefixes, pad)
    rest_ids, rest_mask = left_pad([row[len(plan.prefixes[c]) :] for row, c in zip(rows, plan.cluster_of)], pad)
    cache = DynamicCache(config=model.config)
    model(input_ids=prefix_ids.to(device), attention_mask=prefix_mask.to(device), position_ids=position_ids(prefix_mask).to(device),
          past_key_values=cache, use_cache=True, logits_to_keep=1)
    index = torch.tensor(plan.cluster_of)
    cache.batch_select_indices(index.to(device))
    input_ids = torch.cat([prefix_ids[index], rest_ids], dim=1)
    attention_mask = torch.cat([prefix_mask[index], rest_mask], dim=1)
    return input_ids, attention_mask, cache

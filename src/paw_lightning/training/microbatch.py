"""Token-budget micro-batches of one mini-batch, for gradient accumulation.

A mini-batch is cut into micro-batches whose padded size (rows × the longest row) stays
within ``max_tokens`` and whose rows number at most ``max_rows``: the samples, sorted by
length (longest first), are packed greedily and each micro-batch is trimmed to its longest
sample; a sample over the budget gets its own. ``max_rows=1`` runs one unpadded sample per
forward/backward: no padding, and the LM head only from the sample's own prompt on (a
batch's starts at its shortest prompt); the faster update on a CPU for samples of varied
lengths, though batching is faster at equal lengths (docs/results/speed-and-memory.md).
The split changes nothing in the maths (the objectives normalise by the whole mini-batch's
totals). Under FSDP2/DDP a rank with fewer micro-batches repeats its last one with weight 0
(``matched_across_ranks``). The update's training step and the behaviour-cloning warm-up
both split their batches this way.

"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from paw_lightning.scale import distributed


def split_by_tokens(lengths: list[int], max_tokens: int | None, max_rows: int | None = None) -> list[list[int]]:
    """Row indices of each micro-batch: rows sorted by length (longest first, ties by index)
    and packed greedily while ``rows × longest ≤ max_tokens`` and ``rows ≤ max_rows``; both
    ``None``: one micro-batch of every row in its original order."""
    if max_tokens is None and max_rows is None:
        return [list(range(len(lengths)))] if lengths else []
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"micro_batch_tokens must be at least 1 (got {max_tokens})")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"micro_batch_rows must be at least 1 (got {max_rows})")
    tokens, rows = max_tokens or float("inf"), max_rows or len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    chunks: list[list[int]] = []
    for i in order:
        if chunks and len(chunks[-1]) < rows and (len(chunks[-1]) + 1) * lengths[chunks[-1][0]] <= tokens:
            chunks[-1].append(i)  # the chunk's first row is its longest
        else:
            chunks.append([i])
    return chunks


def take_rows(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The sub-batch of ``rows`` of a right-padded collated batch (``RolloutBuffer.collate``),
    trimmed to its longest row, with ``keep_from`` (the shortest prompt) recomputed where the
    batch has one (a demonstration batch has none: its reader finds its first loss position)."""
    size, width = batch["input_ids"].shape
    index = torch.tensor(rows, dtype=torch.long, device=batch["input_ids"].device)
    keep = int(batch["attention_mask"][index].sum(dim=-1).max())
    out = {}
    for key, value in batch.items():
        if key == "keep_from":
            continue
        if value.dim() >= 1 and value.shape[0] == size:
            value = value[index]
            if value.dim() >= 2 and value.shape[1] == width:
                value = value[:, :keep]
        out[key] = value
    if "prompt_lengths" in batch:
        out["keep_from"] = batch["prompt_lengths"][index].min().reshape(1)
    elif "keep_from" in batch:
        out["keep_from"] = batch["keep_from"]
    return out


def micro_batches(batch: dict[str, torch.Tensor], max_tokens: int | None, max_rows: int | None = None) -> list[dict[str, torch.Tensor]]:
    """The micro-batches of a collated mini-batch under a token budget and a row cap (both
    ``None``: the batch itself)."""
    if max_tokens is None and max_rows is None:
        return [batch]
    lengths = batch["attention_mask"].sum(dim=-1).tolist()
    return [take_rows(batch, rows) for rows in split_by_tokens(lengths, max_tokens, max_rows)]


def matched_across_ranks(parts: list[dict[str, torch.Tensor]]) -> Iterator[tuple[dict[str, torch.Tensor], float]]:
    """``(micro-batch, 1.0)`` for each of ``parts``; under FSDP2/DDP then ``(its last one, 0.0)``
    until this rank has run as many forward/backward passes as the busiest rank (their
    collectives must pair up): a loss scaled by the weight adds nothing."""
    for k in range(distributed.max_across_ranks(len(parts))):
        yield (parts[k], 1.0) if k < len(parts) else (parts[-1], 0.0)

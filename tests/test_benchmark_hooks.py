"""The benchmarks that time the trainer by wrapping its methods still find them (a renamed or
moved method would otherwise break the benchmark only when someone runs it), and the update's
model-FLOP count by hand."""
from __future__ import annotations

import sys

import torch
from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import epoch_time_split  # noqa: E402


def test_epoch_time_split_wraps_methods_that_exist():
    for owner, name, _, _ in epoch_time_split.HOOKS:
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone: update benchmarks/epoch_time_split.py"


def test_update_flops_by_hand():
    """Rows of 3 and 2 real tokens (prompts 2 and 1), N = 10 linear weights of which N_head = 4,
    2 layers, d_attn = 3. Per row: 4(N − N_head)·ℓ + 4·N_head·(ℓ − keep_from + 1) + 3·2·layers·ℓ²·d_attn."""
    sizes = {"n": 10, "head": 4, "layers": 2, "d_attn": 3}
    batch = {"input_ids": torch.ones(2, 3, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool),
             "keep_from": torch.tensor([1]), "prompt_lengths": torch.tensor([2, 1])}
    # one micro-batch, keep_from 1 (the shortest prompt): heads read 3 and 2 positions
    row3, row2 = 4 * (6 * 3 + 4 * 3) + 3 * 2 * 2 * 9 * 3, 4 * (6 * 2 + 4 * 2) + 3 * 2 * 2 * 4 * 3
    assert epoch_time_split.update_flops(batch, None, sizes) == {"4N": row3 + row2, "6N": row3 + row2 + 2 * (6 * 3 + 4 * 3) + 2 * (6 * 2 + 4 * 2)}
    # a 3-token budget: one row per micro-batch; the longer row's keep_from is its own prompt (2): its head reads 2 positions
    row3 = 4 * (6 * 3 + 4 * 2) + 3 * 2 * 2 * 9 * 3
    assert epoch_time_split.update_flops(batch, 3, sizes)["4N"] == row3 + row2

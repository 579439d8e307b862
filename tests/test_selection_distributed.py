"""The top-α selection is one ranking over all ranks (2 CPU processes, gloo)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paw_lightning.objectives.selection import select_global_top_alpha

from helpers import free_port

pytestmark = pytest.mark.slow  # 2 spawned processes

LOCAL = {0: [0.1, 0.9, 0.3], 1: [0.8, 0.2, 0.7, 0.05]}


def _worker(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        results[rank] = select_global_top_alpha(torch.tensor(LOCAL[rank]), alpha=0.5).tolist()
    finally:
        dist.destroy_process_group()


def test_selection_is_global_across_ranks():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    # all 7 entropies: 0.9, 0.8, 0.7, 0.3 are the top ceil(0.5·7) = 4 — rank 0 alone would keep 2 of its 3
    assert results[0] == [False, True, True]
    assert results[1] == [True, False, True, False]

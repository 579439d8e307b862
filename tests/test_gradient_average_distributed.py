"""Replicated gradients averaged over 2 CPU processes (gloo), in one all-reduce per dtype:
hand-computed means, a missing gradient counting as zero, shapes and dtypes kept."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from paw_lightning.scale import distributed

from helpers import free_port

pytestmark = pytest.mark.slow  # 2 spawned processes

GRADS = {  # rank -> the gradients of (a 2×2 float32, a 3-vector float64, a 1-vector float32); None: no gradient
    0: [[[1.0, 2.0], [3.0, 4.0]], [10.0, 20.0, 30.0], None],
    1: [[[3.0, 6.0], [-3.0, 0.0]], [0.0, -20.0, 90.0], [8.0]],
}
DTYPES = [torch.float32, torch.float64, torch.float32]


def _worker(rank: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        params = [torch.nn.Parameter(torch.zeros(s, dtype=d)) for s, d in zip([(2, 2), (3,), (1,)], DTYPES)]
        for p, g in zip(params, GRADS[rank]):
            p.grad = None if g is None else torch.tensor(g, dtype=p.dtype)
        calls = []
        all_reduce = dist.all_reduce
        dist.all_reduce = lambda t, *a, **k: (calls.append(t.dtype), all_reduce(t, *a, **k))[1]
        try:
            distributed.average_gradients(params)
        finally:
            dist.all_reduce = all_reduce
        results[rank] = ([p.grad.tolist() for p in params], [p.grad.dtype for p in params], sorted(map(str, calls)))
    finally:
        dist.destroy_process_group()


def test_gradients_are_averaged_in_one_reduce_per_dtype():
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), results), nprocs=2, join=True)
    for rank in (0, 1):
        grads, dtypes, calls = results[rank]
        assert grads == [[[2.0, 4.0], [0.0, 2.0]], [5.0, 0.0, 60.0], [4.0]]  # (a + b) / 2; rank 0's missing gradient is 0
        assert dtypes == DTYPES
        assert calls == ["torch.float32", "torch.float64"]

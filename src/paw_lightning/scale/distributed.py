"""Tiny collective helpers that degrade to no-ops in a single process.

Every helper here is a collective: when a process group is initialised, *every*
rank must call it, in the same order (ARCHITECTURE.md conventions).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def _device() -> torch.device:
    """Where a collective's tensor must live: a CUDA device when the default group runs NCCL
    alone (it takes no CPU tensors), else the CPU (gloo, or a ``cpu:gloo,cuda:nccl`` group)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _reduce(value: float, op) -> float:
    if not is_distributed():
        return value
    t = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=op)
    return t.item()


def sum_each_across_ranks(values: list[float]) -> list[float]:
    """Each value summed over the ranks, in one all-reduce (float64: exact for counts below 2⁵³)."""
    if not is_distributed():
        return [float(v) for v in values]
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def max_across_ranks(value: int) -> int:
    return int(_reduce(value, dist.ReduceOp.MAX) if is_distributed() else value)


def min_across_ranks(value: int) -> int:
    return int(_reduce(value, dist.ReduceOp.MIN) if is_distributed() else value)


def sum_across_ranks(value: float) -> float:
    return _reduce(value, dist.ReduceOp.SUM)


def average_gradients(params: list[torch.nn.Parameter]) -> None:
    """Average the gradients of replicated parameters over the ranks (a parameter without a
    gradient counts as zero). No-op in one process and for FSDP2's DTensor parameters, whose
    gradients the backward pass already reduced."""
    if not is_distributed() or any(type(p).__name__ == "DTensor" for p in params):
        return
    groups: dict[tuple, list[torch.Tensor]] = {}  # one all-reduce per dtype and device, not one per parameter
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        groups.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
    for grads in groups.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world_size()
        for g, averaged in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(averaged.view_as(g))


def any_across_ranks(flag: bool) -> bool:
    return max_across_ranks(int(flag)) > 0


def gather_floats(value: float) -> list[float]:
    """Every rank's `value`, in rank order (``[value]`` in a single process)."""
    if not is_distributed():
        return [float(value)]
    mine = torch.tensor([float(value)], dtype=torch.float64, device=_device())
    every = [torch.zeros_like(mine) for _ in range(world_size())]
    dist.all_gather(every, mine)
    return [t.item() for t in every]


def gather_objects(value) -> list:
    """Every rank's picklable ``value``, in rank order (``[value]`` in a single process); a collective."""
    if not is_distributed():
        return [value]
    every = [None] * world_size()
    dist.all_gather_object(every, value)
    return every


def idle_batch(token_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """A two-token batch with nothing to learn (every mask empty), for a rank that has no
    samples left while its peers still run forwards and backwards (collectives under
    FSDP2/DDP): it takes part in them and adds zero to every loss."""
    ids = torch.tensor([[token_id, token_id]], device=device)
    empty = torch.zeros_like(ids, dtype=torch.bool)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "keep_from": torch.tensor([1]),
            "loss_mask": empty, "action_mask": empty, "obs_mask": empty}

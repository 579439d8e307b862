"""Optimizer steps with a NaN or infinite loss or gradient are skipped, counted and, when
they keep coming, stop the run.

A skipped step drops the gradients and leaves the weights and the optimizer state as they
were; a warning names the mini-batch's task groups and ``train/nonfinite_steps`` counts the
skips. After ``max_consecutive`` skips in a row the run stops with
:class:`NonFiniteTrainingError`. All ranks decide together (one any-reduce), so the FSDP2
shards never desynchronise.

"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from lightning.pytorch.utilities import rank_zero_warn

from paw_lightning.scale import distributed


class NonFiniteTrainingError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite loss or gradient."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly FSDP2-sharded DTensor) tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def all_finite(loss: torch.Tensor, parameters: Iterable[torch.Tensor]) -> bool:
    """Whether the loss and every gradient are finite on every rank (one device sync on this
    rank, one any-reduce across ranks)."""
    flags = [torch.isfinite(loss).all(), *(torch.isfinite(_local(p.grad)).all() for p in parameters if p.grad is not None)]
    return not distributed.any_across_ranks(not bool(torch.stack(flags).all()))


class NonFiniteGuard:
    """Counts skipped steps and stops the run after ``max_consecutive`` in a row."""

    def __init__(self, max_consecutive: int = 3) -> None:
        if max_consecutive < 1:
            raise ValueError(f"model.max_nonfinite_steps must be at least 1 (got {max_consecutive})")
        self.max_consecutive = max_consecutive
        self.skipped = 0  # over the run (this process)
        self.consecutive = 0

    def state_dict(self) -> dict[str, int]:
        """The counts a checkpoint keeps, so that a resumed run counts on from them."""
        return {"skipped": self.skipped, "consecutive": self.consecutive}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped, self.consecutive = int(state.get("skipped", 0)), int(state.get("consecutive", 0))

    def step_ok(self, finite: bool, describe: Callable[[], str]) -> bool:
        """Record one optimizer step's verdict; ``describe()`` names the step in the warning and
        the error. Returns ``finite``: take the step or not."""
        if finite:
            self.consecutive = 0
            return True
        where = describe()
        self.skipped += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive:
            raise NonFiniteTrainingError(
                f"non-finite loss or gradient in {self.consecutive} optimizer step{'s' if self.consecutive > 1 else ''} "
                f"in a row (the last: {where}); "
                "the run stops. last.ckpt holds the weights of the last complete epoch: resume from it with a lower "
                "learning rate (model.optimizer.init_args.lr) or a gradient clip (model.max_grad_norm), or raise "
                "model.max_nonfinite_steps"
            )
        rank_zero_warn(f"skipped an optimizer step with a non-finite loss or gradient ({where}); {self.skipped} skipped so far")
        return False

"""``data.evaluation.dream``: whether and how far validation and test dream (:mod:`paw_lightning.rollout.dream`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DreamSettings:
    """The dream evaluation of validation and test (``data.evaluation.dream``); off by default.

    Args:
        horizon: H, the most imagined steps of an episode, and the largest k of the k-step
            fidelity (``<split>/dream/exact_at_1`` … ``exact_at_H``).
        tasks: held-out tasks dreamed per evaluation, all ranks together (a multiple of the
            world size): task g is the evaluation's task g (same reset seed). ``0`` or ``null``:
            no dream evaluation.
    """

    horizon: int = 4
    tasks: int | None = 0

    def __post_init__(self):
        if self.horizon < 1:
            raise ValueError(f"data.evaluation.dream.horizon must be at least 1 (got {self.horizon})")
        if self.tasks is not None and self.tasks < 0:
            raise ValueError(f"data.evaluation.dream.tasks must be at least 0 or null (got {self.tasks})")

    @property
    def enabled(self) -> bool:
        return bool(self.tasks)

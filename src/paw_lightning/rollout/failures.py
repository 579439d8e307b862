"""A rollout whose environments failed stops the run instead of training on nothing.

An episode whose environment raised, died or timed out ends failed (``Trajectory.error``, the
env pool's crash isolation) and the rollout goes on: one flaky episode should not cost a run.
But when most episodes fail (a bad data file, an argument only ``reset`` rejects, a server that
is down) the epoch holds almost nothing: a fit would "succeed" after zero updates, a validation
would report 0 % success. :func:`check_failures` stops it: when every episode of a rollout
failed, or more than ``max_share`` of them, it raises :class:`RolloutFailureError` naming the
count and the environment's own first error. The counts are summed over the ranks (one
all-reduce), so every rank stops together; the error text is this rank's first one, or, if this
rank had none, says that the failures were on other ranks.
"""
from __future__ import annotations

from collections.abc import Sequence

from paw_lightning.scale import distributed


class RolloutFailureError(RuntimeError):
    """Too many episodes of one rollout ended with an environment error."""


def check_failures(trajectories: Sequence, max_share: float, description: str) -> None:
    """Raise :class:`RolloutFailureError` if every episode of ``trajectories`` (all ranks together)
    failed, or more than ``max_share`` of them; ``description`` names the rollout
    (``rollout 3``, ``val``)."""
    errors = [t.error for t in trajectories if t.error is not None]
    failed, total = distributed.sum_each_across_ranks([len(errors), len(trajectories)])
    if total == 0 or failed == 0 or (failed < total and failed <= max_share * total):
        return
    first = errors[0] if errors else "(on other ranks)"
    raise RolloutFailureError(
        f"{description}: {failed:.0f} of {total:.0f} episodes failed in the environment "
        f"(more than data.max_failed_share = {max_share:g}); the first error: {first}")

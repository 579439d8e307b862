"""Watch each RL update's rollout for the three ways RL stops learning while the run goes on.

- no learning signal: every advantage 0 (:mod:`~paw_lightning.training.learning_signal`);
- a format that drifts: the invalid-action rate keeps rising (:mod:`~paw_lightning.training.format_drift`);
- a policy collapsed onto one action (:mod:`~paw_lightning.training.action_collapse`).

:func:`rollout_counts` sums one rollout's counts over the ranks in a single all-reduce, so every
rank's watches see the same numbers; :class:`RolloutWatch` feeds them to the three watches and
returns their warnings, which rank 0 prints.
"""
from __future__ import annotations

from dataclasses import dataclass

from paw_lightning.scale import distributed
from paw_lightning.training.action_collapse import ActionCollapseWatch
from paw_lightning.training.format_drift import FormatDriftWatch
from paw_lightning.training.learning_signal import LearningSignalWatch


@dataclass(frozen=True)
class RolloutCounts:
    """One rollout's counts over every rank."""

    episodes: int
    steps: int
    invalid_steps: int
    wins: int
    flat: bool  # every advantage of the update was 0, on every rank


def rollout_counts(episodes: int, steps: int, invalid_steps: int, wins: int, flat: bool) -> RolloutCounts:
    """This rank's counts summed over the ranks (a collective: every rank calls it); ``flat``
    holds on every rank only when it holds on each."""
    total = distributed.sum_each_across_ranks([episodes, steps, invalid_steps, wins, int(flat)])
    episodes, steps, invalid_steps, wins, flat_ranks = (int(v) for v in total)
    return RolloutCounts(episodes, steps, invalid_steps, wins, flat_ranks == distributed.world_size())


class RolloutWatch:
    """The no-signal, format-drift and action-collapse watches, observed together once per update."""

    def __init__(self):
        self.signal = LearningSignalWatch()
        self.format = FormatDriftWatch()
        self.collapse = ActionCollapseWatch()

    def observe(self, counts: RolloutCounts, top_action_share: float) -> list[str]:
        """The warnings this rollout raises (usually none); ``top_action_share`` is the rollout's
        most frequent action's share of its valid steps, over every rank."""
        success_rate = counts.wins / counts.episodes if counts.episodes else None
        warnings = [
            self.signal.observe(counts.flat, success_rate),
            self.format.observe(counts.invalid_steps / max(counts.steps, 1)),
            self.collapse.observe(top_action_share, counts.steps - counts.invalid_steps, counts.wins),
        ]
        return [w for w in warnings if w is not None]

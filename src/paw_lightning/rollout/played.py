"""What the data module hands on: the episodes one rank played for one split, as samples.

:class:`PlayedEpisodes` is the data module's whole output for an RL iteration (``train``) or a
held-out evaluation (``val`` / ``test``). The module reads it to prepare and log the update
or the evaluation; nothing is ever written back into it by the data module's consumers except
the per-sample fields of ``samples`` that preparing the update fills in (π_old, advantages,
S_α, λ_g), which the training mini-batches then carry.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from paw_lightning.rollout.collector import Trajectory
from paw_lightning.rollout.dream.measures import DreamRecords
from paw_lightning.rollout.samples import RolloutBuffer


@dataclass
class FixedSamples:
    """This rank's share of a split's fixed held-out transitions (:mod:`paw_lightning.fixed_set`),
    as world-model samples per source, and how the module scores them.

    Args:
    sources: source name → samples.
    batch_size: samples per forward (``data.evaluation.batch_size``).
    predict: transitions per source, all ranks together, whose next observation is also
        predicted free-running (``data.evaluation.fixed.predict``).
    """

    sources: dict[str, RolloutBuffer]
    batch_size: int
    predict: int


@dataclass
class PlayedEpisodes:
    """Args:
    split: ``train``, ``val`` or ``test``.
    epoch: the trainer's epoch when they were played.
    trajectories: this rank's episodes.
    samples: one sample per step (:func:`~paw_lightning.rollout.samples.build_buffer`).
    started: ``time.perf_counter()`` when playing began.
    seconds: wall time of playing (generation and environment steps).
    response_tokens: tokens this rank generated.
    max_return: the environment's return of a won episode (R_max of the reward-adaptive λ),
        ``None`` if the environment does not declare one.
    plan: for ``val`` / ``test``, what was played (:func:`paw_lightning.evaluation.eval_plan`).
    metrics: how the training episodes were played, the same value on every rank (dynamic
        sampling's ``rollout/kept_group_fraction``, …), logged as ``train/<key>``; empty by default.
    dream: for ``val`` / ``test`` with ``data.evaluation.dream`` on, this rank's dream evaluation
        (:mod:`paw_lightning.rollout.dream`) beside the episodes; ``None`` otherwise.
    first_round: for ``train`` with dynamic sampling, the episodes of its first round (the
        configured groups, the tasks any estimator plays at this iteration, and more groups
        with ``oversample`` > 1), played before any group is kept by its returns; what
        ``train/episode/*`` describes. ``None``: ``trajectories``.
    fixed: for ``val`` / ``test``, the split's fixed held-out transitions (not played now:
        the same in every evaluation); ``None`` with ``data.evaluation.fixed: null``.
    """

    split: str
    epoch: int
    trajectories: list[Trajectory]
    samples: RolloutBuffer
    started: float
    seconds: float
    response_tokens: int
    max_return: float | None = None
    plan: dict = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    dream: DreamRecords | None = None
    first_round: list[Trajectory] | None = None
    fixed: FixedSamples | None = None

    @property
    def policy_episodes(self) -> list[Trajectory]:
        """The episodes that measure the policy: a fair sample of its play on this iteration's
        tasks. Dynamic sampling's kept groups are not one (a kept group has differing returns
        by construction, so their success rate is biased towards one half)."""
        return self.trajectories if self.first_round is None else self.first_round

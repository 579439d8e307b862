"""The dream's records of one rank, and the metrics of all ranks together.

Every metric is a ratio of sums, so the sums are reduced across ranks (one ``all_reduce`` per
sum, in the same order on every rank) and the numbers equal one process's over the same
records. With N_k the k-step predictions (:mod:`~paw_lightning.rollout.dream.fidelity`) and E the
imagined episodes (:mod:`~paw_lightning.rollout.dream.imagine`, :mod:`~paw_lightning.rollout.dream.replay`):

- ``exact_at_k`` = Σ [ô = o] / N_k, ``cer_at_k`` = Σ edit(ô, o) / Σ |o| (character edit distance
  over the real observation's characters: torchmetrics' CER of all pairs at once), and, when the
  environment reads states, ``state_match_at_k`` = Σ [s(ô) = s(o)] / N_k (an unreadable ô: no
  match; MLflow allows no ``@`` in a name, so exact@k is logged as ``exact_at_k``);
- ``success`` = Σ won inside the model / Σ judged (only when some episode is judged),
  ``judged`` = Σ judged / E, ``length`` = mean imagined steps;
- ``replay_success`` = Σ real won / E, ``first_divergence`` = Σ d_i / E (d_i = H + 1 for an
  episode that never diverges), ``never_diverged`` = Σ [d_i = H + 1] / E;
- ``episodes`` = E.

A metric whose denominator is 0 on every rank is left out (e.g. ``exact_at_4`` when no real
trajectory has 4 steps).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from paw_lightning.rollout.dream.fidelity import FidelityRecord
from paw_lightning.rollout.dream.imagine import ImaginedEpisode
from paw_lightning.rollout.dream.replay import ReplayResult
from paw_lightning.scale import distributed


@dataclass
class DreamRecords:
    """What one rank's dream evaluation produced (the data module's output, per split)."""

    horizon: int
    reads_states: bool
    fidelity: list[FidelityRecord] = field(default_factory=list)
    episodes: list[ImaginedEpisode] = field(default_factory=list)
    replays: list[ReplayResult] = field(default_factory=list)


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two strings (insertions, deletions, substitutions of characters)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def dream_sums(records: DreamRecords) -> dict[str, float]:
    """This rank's sums, with the same keys on every rank (k = 1 … H)."""
    sums: dict[str, float] = {}
    for k in range(1, records.horizon + 1):
        scored = [r for r in records.fidelity if r.k == k]
        sums[f"n@{k}"] = len(scored)
        sums[f"exact@{k}"] = sum(r.predicted.strip() == r.real.strip() for r in scored)
        sums[f"edits@{k}"] = sum(edit_distance(r.predicted.strip(), r.real.strip()) for r in scored)
        sums[f"chars@{k}"] = sum(len(r.real.strip()) for r in scored)
        if records.reads_states:
            sums[f"state_match@{k}"] = sum(bool(r.state_match) for r in scored)
    episodes = records.episodes
    sums["episodes"] = len(episodes)
    sums["judged"] = sum(e.judged for e in episodes)
    sums["won"] = sum(e.judged and e.won for e in episodes)
    sums["length"] = sum(len(e.steps) for e in episodes)
    sums["replay_won"] = sum(r.won for r in records.replays)
    sums["divergence"] = sum(r.first_divergence for r in records.replays)
    sums["never_diverged"] = sum(r.first_divergence > records.horizon for r in records.replays)
    return sums


def dream_metrics(records: DreamRecords) -> dict[str, float]:
    """The dream metrics of every rank's records together (a collective: every rank calls it)."""
    local = dream_sums(records)
    keys = sorted(local)
    total = dict(zip(keys, distributed.sum_each_across_ranks([local[key] for key in keys])))
    metrics: dict[str, float] = {}
    for k in range(1, records.horizon + 1):
        n = total[f"n@{k}"]
        if n:
            metrics[f"exact_at_{k}"] = total[f"exact@{k}"] / n
            metrics[f"cer_at_{k}"] = total[f"edits@{k}"] / max(total[f"chars@{k}"], 1.0)
            if records.reads_states:
                metrics[f"state_match_at_{k}"] = total[f"state_match@{k}"] / n
    e = total["episodes"]
    if e:
        metrics["episodes"] = e
        metrics["judged"] = total["judged"] / e
        metrics["length"] = total["length"] / e
        metrics["replay_success"] = total["replay_won"] / e
        metrics["first_divergence"] = total["divergence"] / e
        metrics["never_diverged"] = total["never_diverged"] / e
        if total["judged"]:
            metrics["success"] = total["won"] / total["judged"]
    return metrics

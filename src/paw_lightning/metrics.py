"""Episode-level metrics of a collection (success, return, length, invalid actions), the
success rate per task type (ALFWorld) under ALFWorld's short column names, and pass@k."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch.distributed as dist

from paw_lightning.rollout.collector import Trajectory
from paw_lightning.scale import distributed

TASK_TYPE_NAMES = {  # ALFWorld's result-table columns
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
}


def episode_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means over episodes (every rank plays as many, so the module's ``sync_dist`` mean of
    them is the global mean); ``invalid_rate`` (invalid steps / all steps) and
    ``obs_truncated_rate`` (observations the pool cut / all observations, the reset's
    included) from every rank's counts added up, since ranks play different numbers of steps;
    ``top_action_share`` (:func:`top_action_share`) and ``success_rate/<type>`` for each task
    type played (:func:`task_type_success`), both over every rank's episodes; ``score``
    (WebShop's Score, mean r × 100) when the environment reports ``info["score"]``. A
    collective: every rank calls this."""
    n = max(len(trajectories), 1)
    steps = sum(len(t.steps) for t in trajectories)
    scored = [t.score for t in trajectories if t.score is not None]
    invalid, truncated, all_steps, observations = distributed.sum_each_across_ranks(
        [sum(t.invalid_steps for t in trajectories), sum(t.truncated_observations for t in trajectories), steps, steps + len(trajectories)])
    counts = EpisodeCounts.of(trajectories).gathered()
    return {
        "success_rate": sum(t.won for t in trajectories) / n,
        "return_mean": sum(t.total_return for t in trajectories) / n,
        "episode_length": steps / n,
        "invalid_rate": invalid / max(all_steps, 1),
        "env_error_rate": sum(t.error is not None for t in trajectories) / n,
        "obs_truncated_rate": truncated / max(observations, 1),  # every rank logs every key (sync_dist collectives)
        "top_action_share": top_action_share(counts.actions),
        **task_type_success(counts.played, counts.won),
        **({"score": 100 * sum(scored) / n} if scored else {}),  # WebShop's Score: mean r × 100 (unscored episodes: 0)
    }


@dataclass
class EpisodeCounts:
    """What the episode metrics count by name: each action played (the text inside
    ``<action>``, stripped; valid steps only), and the episodes played and won per task type
    (episodes without a ``task_type`` are left out)."""

    actions: Counter = field(default_factory=Counter)
    played: Counter = field(default_factory=Counter)
    won: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, trajectories: list[Trajectory]) -> EpisodeCounts:
        counts = cls(Counter(s.action.strip() for t in trajectories for s in t.steps if s.action is not None))
        for t in trajectories:
            if t.task_type is not None:
                counts.played[t.task_type] += 1
                counts.won[t.task_type] += bool(t.won)
        return counts

    def gathered(self) -> EpisodeCounts:
        """Every rank's counts added up, in one ``all_gather_object`` under ``torch.distributed``
        (a collective: every rank calls it), so every rank gets the same keys and the global
        rates: the module's ``sync_dist`` mean then logs the true rate and no rank waits on a
        key it lacks."""
        if not distributed.is_distributed():
            return self
        gathered = [None] * distributed.world_size()
        dist.all_gather_object(gathered, self)
        return EpisodeCounts(*(sum((getattr(c, f) for c in gathered), Counter()) for f in ("actions", "played", "won")))


def top_action_share(actions: Counter) -> float:
    """The share of valid steps that played the most frequent action: 1.0 when the policy plays
    one action whatever it sees; 0.0 without a valid step."""
    return max(actions.values()) / sum(actions.values()) if actions else 0.0


def task_type_success(played: Counter, won: Counter) -> dict[str, float]:
    """``success_rate/<short name>`` for every task type played (a type outside ALFWorld's six
    keeps its name)."""
    return {f"success_rate/{TASK_TYPE_NAMES.get(k, k)}": won[k] / played[k] for k in sorted(played)}


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of one task (Chen et al., 2021): with ``n`` samples of which
    ``c`` succeeded, the probability that ``k`` of them drawn without replacement hold at least
    one success, ``1 − C(n−c, k) / C(n, k)``, computed as ``1 − Π_{i=n−c+1}^{n} (1 − k/i)``
    (no huge binomials)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def pass_at_k_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """``pass_at_<k>`` for every k from 1 to n, n = episodes per task (a group's episodes are n
    samples of one task): :func:`pass_at_k` per task, averaged over tasks. Groups of unequal
    size share the k's up to the smallest group. (MLflow metric names cannot hold ``@``.)

    Under ``torch.distributed`` each rank averages over its own tasks; every rank plays the
    same number of tasks, so the module's ``sync_dist`` mean is the mean over all tasks."""
    groups: dict[int, list[bool]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(bool(t.won))
    if not groups:
        return {}
    n_min = min(len(wins) for wins in groups.values())
    return {
        f"pass_at_{k}": sum(pass_at_k(len(wins), sum(wins), k) for wins in groups.values()) / len(groups)
        for k in range(1, n_min + 1)
    }

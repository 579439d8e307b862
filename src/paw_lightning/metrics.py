"""Episode-level metrics of a collection (success, return, length, invalid actions), the
success rate per task type (ALFWorld) under ALFWorld's short column names, and pass@k."""
from __future__ import annotations

from collections import Counter, defaultdict

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
    """Means over episodes; ``invalid_rate`` is invalid steps / all steps;
    ``top_action_share`` (:func:`top_action_share`); ``success_rate/<type>`` for each task type
    played (see :func:`task_type_success`); ``obs_truncated_rate``: steps whose observation the
    pool cut; ``score`` (WebShop's Score, mean r × 100) when the environment reports
    ``info["score"]``."""
    n = max(len(trajectories), 1)
    steps = sum(len(t.steps) for t in trajectories)
    scored = [t.score for t in trajectories if t.score is not None]
    truncated = sum(t.truncated_observations for t in trajectories)  # steps
    return {
        "success_rate": sum(t.won for t in trajectories) / n,
        "return_mean": sum(t.total_return for t in trajectories) / n,
        "episode_length": steps / n,
        "invalid_rate": sum(t.invalid_steps for t in trajectories) / max(steps, 1),
        "env_error_rate": sum(t.error is not None for t in trajectories) / n,
        "obs_truncated_rate": truncated / max(steps, 1),  # every rank logs every key (sync_dist collectives)
        "top_action_share": top_action_share(trajectories),
        **task_type_success(trajectories),
        **({"score": 100 * sum(scored) / n} if scored else {}),  # WebShop's Score: mean r × 100 (unscored episodes: 0)
    }


def action_counts(trajectories: list[Trajectory]) -> Counter:
    """How often each action (the text inside ``<action>``, stripped) was played, over every
    rank's valid steps (a collective under ``torch.distributed``: every rank calls it)."""
    counts = Counter(s.action.strip() for t in trajectories for s in t.steps if s.action is not None)
    if distributed.is_distributed():
        gathered = [None] * distributed.world_size()
        dist.all_gather_object(gathered, counts)
        counts = sum(gathered, Counter())
    return counts


def top_action_share(trajectories: list[Trajectory]) -> float:
    """The share of valid steps that played the collection's most frequent action (over every
    rank's episodes): 1.0 when the policy plays one action whatever it sees; 0.0 without a
    valid step."""
    counts = action_counts(trajectories)
    return max(counts.values()) / sum(counts.values()) if counts else 0.0


def task_type_success(trajectories: list[Trajectory]) -> dict[str, float]:
    """``success_rate/<short name>`` for every task type that any rank played (episodes
    without a ``task_type`` are left out; a type outside ALFWorld's six keeps its name).

    Under ``torch.distributed`` the counts of all ranks are gathered (a collective: every
    rank calls this), so every rank returns the same keys and the global rate: the
    module's ``sync_dist`` mean then logs the true rate and no rank waits on a key it lacks.
    """
    played, won = Counter(), Counter()
    for t in trajectories:
        if t.task_type is not None:
            played[t.task_type] += 1
            won[t.task_type] += bool(t.won)
    if distributed.is_distributed():
        gathered = [None] * distributed.world_size()
        dist.all_gather_object(gathered, (played, won))
        played, won = sum((p for p, _ in gathered), Counter()), sum((w for _, w in gathered), Counter())
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

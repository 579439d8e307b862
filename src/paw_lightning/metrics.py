"""Episode-level metrics of a collection (success, return, length, invalid actions)."""
from __future__ import annotations

from paw_lightning.rollout.collector import Trajectory


def episode_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """Means over episodes; ``invalid_rate`` is invalid steps / all steps."""
    n = max(len(trajectories), 1)
    steps = sum(len(t.steps) for t in trajectories)
    return {
        "success_rate": sum(t.won for t in trajectories) / n,
        "return_mean": sum(t.total_return for t in trajectories) / n,
        "episode_length": steps / n,
        "invalid_rate": sum(t.invalid_steps for t in trajectories) / max(steps, 1),
        "env_error_rate": sum(t.error is not None for t in trajectories) / n,
    }

"""Replay: the imagined actions executed in the real environment, from the same reset.

Imagined episode i (length L_i ≤ H, actions â_0 … â_{L_i−1}, predicted observations
ô_1 … ô_{L_i}) is replayed in a real environment reset with the same task seed (episode 0,
so a slippery FrozenLake slips as in the evaluation's first episode): its actions are executed
one by one until they run out or the real episode ends. Two results per episode:

- ``won``: the real episode is won when the replay stops;
- ``first_divergence`` d_i: the first step k ≤ L_i at which the real o_k differs from ô_k
  (both stripped; compared as text) or the real episode had already ended before step k;
  H + 1 when there is none, i.e. the whole imagined episode came true.

An environment error ends the replay at that step as a divergence, not won.
"""
from __future__ import annotations

from dataclasses import dataclass

from paw_lightning.envs.pool import EnvPool
from paw_lightning.rollout.dream.imagine import ImaginedEpisode


@dataclass
class ReplayResult:
    won: bool
    first_divergence: int


def replay(episodes: list[ImaginedEpisode], pool: EnvPool, horizon: int) -> list[ReplayResult]:
    """Replay every episode in ``pool`` (episode i in environment i; the pool holds at least as
    many), all of a step in one batched ``step_many``. No generation, no collective."""
    won = [False] * len(episodes)
    divergence = [horizon + 1] * len(episodes)
    active = []
    for i, (obs, info) in enumerate(pool.reset_many([(i, ep.task_seed, 0) for i, ep in enumerate(episodes)])):
        if info.get("error"):
            divergence[i] = 1
        elif episodes[i].steps:
            active.append(i)
        won[i] = bool(info.get("won", False))
    t = 0
    while active:
        results = pool.step_many([(i, episodes[i].steps[t].action) for i in active])
        still = []
        for i, (obs, _, done, info) in zip(active, results):
            won[i] = bool(info.get("won", False)) and not info.get("error")
            if info.get("error") or obs.strip() != episodes[i].steps[t].observation.strip():
                divergence[i] = min(divergence[i], t + 1)
            if t + 1 < len(episodes[i].steps):
                if done:  # the dream goes on where reality has ended
                    divergence[i] = min(divergence[i], t + 2)
                else:
                    still.append(i)
        active, t = still, t + 1
    return [ReplayResult(w, d) for w, d in zip(won, divergence)]

"""The ``TextEnv`` protocol every environment implements, and the environment error type.

An environment is a plain object with two methods; nothing else is required:

- ``reset(seed, episode=0) -> (observation, info)``. ``seed`` selects the *task* (map,
  level, goal): the G episodes of a group share one seed and therefore one task.
  ``episode`` (0..G-1) seeds only the environment's own stochasticity (e.g. slippery ice),
  so episodes of one group may differ while every run stays reproducible.
- ``step(action) -> (observation, reward, done, info)``.

``info`` always holds ``"task"`` (str: the instruction / rules shown in the prompt),
``"admissible_actions"`` (list[str]) and ``"won"`` (bool); after ``step`` also
``"action_recognised"`` (bool: the environment understood the action string; an
unrecognised action leaves the state unchanged). Environments may add more keys. In a
worker-process pool (``EnvPool(num_workers>0)``) observations and infos must be picklable.
An optional ``close()`` method, if present, is called when a pool discards the env.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


class EnvError(RuntimeError):
    """An environment was used wrongly (step before reset, step after done) or cannot build a task."""


@runtime_checkable
class TextEnv(Protocol):
    """A text environment: observations and actions are strings (see the module docstring).

    An environment class may also set ``max_return`` (R_max of METHODS.md §3c, the return
    of a won episode); the reward-adaptive λ reads it unless the config gives ``r_max``.
    """

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        """Start the task chosen by ``seed``; ``episode`` seeds the env's own randomness."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply ``action``; return (next observation, reward, done, info)."""
        ...

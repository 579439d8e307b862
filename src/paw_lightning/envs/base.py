"""The ``TextEnv`` protocol every environment implements, and the environment error type.

An environment is a plain object with ``reset(seed, episode=0) -> (observation, info)`` and
``step(action) -> (observation, reward, done, info)``. ``seed`` selects the task (shared by
the G episodes of a group); ``episode`` seeds only the environment's own stochasticity.
``info`` always holds ``"task"``, ``"admissible_actions"`` and ``"won"``, after ``step`` also
``"action_recognised"`` (an unrecognised action leaves the state unchanged). A ``step`` may add
``"world_model_target": False`` when its observation is not a state for the world model to
predict (search QA's verdict after an answer): that transition gets no world-model term and no
``val/wm_onpolicy/*`` (default True). An optional
``close()`` is called when a pool discards the env.

Optional, for the world model as a simulator (:mod:`paw_lightning.rollout.dream`): an
environment that can read a *predicted* observation back into a state implements
``parse_state(observation) -> state | None`` (any hashable value, ``None`` when the text is no
state: k-step fidelity then also scores states, ``state_match_at_k``) and
``judge(observation) -> Outcome | None`` (whether that state ends the episode and is won, and
optionally its admissible actions; ``None``: unreadable). Both read the text alone (no reset
needed, no state kept). FrozenLake, Sokoban and Sudoku implement them. An environment without
``judge`` may declare a class attribute ``won_text``, a text that only a won episode's last
observation holds; with neither, an imagined episode runs to the horizon and is not judged.

"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class EnvError(RuntimeError):
    """An environment was used wrongly (step before reset, step after done) or cannot build a task."""


@dataclass(frozen=True)
class Outcome:
    """What an environment's optional ``judge`` reads from an observation: whether the episode
    is over, whether it is won, and the admissible actions there (``None``: unchanged)."""

    done: bool
    won: bool
    admissible_actions: list[str] | None = None


@runtime_checkable
class TextEnv(Protocol):
    """A text environment: observations and actions are strings (see the module docstring).

    An environment class may also set ``max_return`` (R_max of METHODS.md §3c, the return
    of a won episode); the reward-adaptive λ reads it unless the config gives ``r_max``. It may
    set ``tagged_kwargs``, the constructor arguments that change what its numbers mean
    (WebShop's ``reward``): each becomes a run tag ``env.<name>`` and an entry of the evaluation
    report's ``env_kwargs``, with its default when the config leaves it out
    (:func:`~paw_lightning.envs.registry.tagged_env_kwargs`). Optional too, for the dream evaluation:
    ``parse_state(observation)``, ``judge(observation) -> Outcome | None`` or a ``won_text`` (see the
    module docstring); an environment without them is still dreamed, its episodes not judged.
    """

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        """Start the task chosen by ``seed``; ``episode`` seeds the env's own randomness."""
        ...

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply ``action``; return (next observation, reward, done, info)."""
        ...

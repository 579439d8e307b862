"""Who decides, inside a dream, that an imagined episode is over and won.

The environment is never stepped inside a dream, but an environment that can read a predicted
observation (the optional ``judge`` / ``parse_state`` of :mod:`paw_lightning.envs.base`) is
asked what that observation means: FrozenLake, Sokoban and Sudoku parse it back into a state
and apply their rules. An environment without ``judge`` that declares ``won_text`` ends a dream
as won at the first predicted observation containing that text (and never ends it otherwise).
Any other environment is not judged: its imagined episodes run to the horizon and count in no
success rate (``<split>/dream/judged`` is then 0).
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from paw_lightning.envs.base import Outcome


@dataclass
class Judge:
    """Args:
    outcome: the environment's ``judge(observation) -> Outcome | None``, if it has one.
    state: its ``parse_state(observation) -> state | None``, if it has one.
    won_text: its ``won_text`` (used when it has no ``judge``).
    """

    outcome: Callable[[str], Outcome | None] | None = None
    state: Callable[[str], Hashable | None] | None = None
    won_text: str | None = None

    @property
    def judges(self) -> bool:
        """Whether imagined episodes of this environment can end won (else none is judged)."""
        return self.outcome is not None or self.won_text is not None

    @property
    def reads_states(self) -> bool:
        """Whether fidelity is also scored on states (``state_match_at_k``)."""
        return self.state is not None

    def __call__(self, observation: str) -> Outcome | None:
        """What the predicted ``observation`` means; ``None``: unreadable or not judged (the dream goes on)."""
        if self.outcome is not None:
            return self.outcome(observation)
        if self.won_text is not None:
            won = self.won_text in observation
            return Outcome(done=won, won=won)
        return None

    @classmethod
    def for_env(cls, factory: Callable[[], object]) -> Judge:
        """The judge of the environment ``factory`` builds (a ``functools.partial`` of its class, as
        the registry makes; one instance is built, never reset, only if the class reads states)."""
        env_class = getattr(factory, "func", factory)
        won_text = getattr(env_class, "won_text", None)
        if not (callable(getattr(env_class, "judge", None)) or callable(getattr(env_class, "parse_state", None))):
            return cls(won_text=won_text)
        env = factory()
        return cls(getattr(env, "judge", None), getattr(env, "parse_state", None), won_text)

"""The fixed held-out transition set: world-model metrics that do not move with the policy.

The on-policy world-model metrics (``<split>/wm_onpolicy/*``) score the transitions of the
episodes the *current* policy plays on the held-out tasks: when the policy changes, the
scored data changes with it, and two runs are scored on different data. The fixed set holds
transitions of the same held-out tasks played by policies that never change during training,
one list per *source*:

- ``expert``: the environment's expert (``walkthrough()``, else ``solve()``), where it has one;
- ``random``: uniformly random admissible actions (``help`` excluded), where the environment
  lists admissible actions;
- ``start_policy``: the policy as RL starts (after the warm-up and any other stage), frozen:
  played once, at the first training rollout, at the evaluation temperature.

Source s of split ``val`` / ``test`` plays the split's first ``tasks`` held-out tasks (task g
resets with ``derive_seed(split, g)``, as the evaluation does), one episode each, at most
``data.rollout.max_steps`` steps; the scripted sources in the policy's exact format
(``<think>{REASON}</think><action>a</action>``, :mod:`paw_lightning.demonstrations`), the
start policy with its own responses. Of the steps played, ``transitions`` spread evenly over
them are kept. The random draws and the start policy's sampling are seeded by ``seed`` (not by
the run's seed): runs of different seeds that share a warm-up score the very same transitions.

Each source's transitions are cached (``cache_dir``, like the warm-up) under a hash of
everything that determines them: environment and its arguments, split, source, tasks,
transitions, seed, step cap, prompt, tokenizer, and for ``start_policy`` the sampling settings
and a digest of the starting weights. They also travel in every checkpoint (the data module's
state), so a resumed fit, ``validate`` and ``test`` score the fit's own set. Simplification: a
``validate`` / ``test`` without a stored or cached set plays ``start_policy`` with the weights
it evaluates (a line on stderr says so).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from paw_lightning.ranges import NonNegativeInt, PositiveInt
from paw_lightning.demonstrations import expert_actions, play_episode, random_valid_actions
from paw_lightning.rollout.collector import Step, Trajectory, derive_seed
from paw_lightning.rollout.failures import RolloutFailureError
from paw_lightning.rollout.samples import spread_indices
from paw_lightning.scale import distributed

SOURCES = ("expert", "random", "start_policy")
FORMAT_VERSION = 1  # bump when the stored transitions change meaning


@dataclass
class FixedSetSettings:
    """The fixed held-out transitions of validation and test (``data.evaluation.fixed``;
    ``null``: none).

    Args:
        sources: which of ``expert``, ``random``, ``start_policy`` (see the module docstring);
            ``null``: every one the environment supports.
        tasks: held-out tasks each source plays (one episode each).
        transitions: most transitions kept per source (spread evenly over the steps played).
        predict: transitions per source whose next observation is also predicted free-running
            (greedy), for exact match and character error rate; 0: none.
        seed: seeds the random actions and the start policy's sampling.
        cache_dir: keep each source's transitions here and reuse them in later fits with the
            same settings; ``null``: play them in every fit.
    """

    sources: list[str] | None = None
    tasks: PositiveInt = 4
    transitions: PositiveInt = 16
    predict: NonNegativeInt = 4
    seed: int = 0
    cache_dir: str | None = None

    def __post_init__(self):
        if self.sources is not None:
            unknown = [s for s in self.sources if s not in SOURCES]
            if unknown:
                raise ValueError(f"data.evaluation.fixed.sources: unknown source {unknown[0]!r} (choose from {', '.join(SOURCES)})")
            if not self.sources or len(set(self.sources)) != len(self.sources):
                raise ValueError(f"data.evaluation.fixed.sources must name each source at most once and at least one (got {self.sources}); "
                                 "data.evaluation.fixed=null turns the fixed set off")
        for name in ("tasks", "transitions"):
            if getattr(self, name) < 1:
                raise ValueError(f"data.evaluation.fixed.{name} must be at least 1 (got {getattr(self, name)}); "
                                 "data.evaluation.fixed=null turns the fixed set off")
        if self.predict < 0:
            raise ValueError(f"data.evaluation.fixed.predict must be at least 0 (got {self.predict})")


@contextlib.contextmanager
def opened(env_factory, purpose: str):
    """A new environment from ``env_factory`` in this process, closed after the block. An
    exception inside the block (the environment stepping in this process, with no pool to isolate
    it) stops the run as a :class:`~paw_lightning.rollout.failures.RolloutFailureError` that says
    what it was for (``purpose``) and gives the environment's error."""
    env = env_factory()
    try:
        yield env
    except Exception as err:
        raise RolloutFailureError(f"{purpose}: the environment failed: {type(err).__name__}: {err}") from err
    finally:
        if callable(getattr(env, "close", None)):
            env.close()


def has_expert(env_factory) -> bool:
    """Whether the factory's environment class has an expert (``walkthrough()`` or ``solve()``)."""
    cls = getattr(env_factory, "func", env_factory)
    return any(callable(getattr(cls, name, None)) for name in ("walkthrough", "solve"))


# ------------------------------------------------------------------ storage
def trajectory_state(traj: Trajectory) -> dict:
    """A trajectory as plain Python values (JSON and ``torch.load(weights_only=True)`` both read them)."""
    return json.loads(json.dumps(dataclasses.asdict(traj), default=float))  # an environment's numpy reward becomes a float


def trajectory_from_state(state: dict) -> Trajectory:
    fields = {k: v for k, v in state.items() if k != "steps"}
    return Trajectory(**fields, steps=[Step(**step) for step in state["steps"]])


@dataclass
class FixedSet:
    """One split's fixed transitions: source → trajectories (each step one transition), and
    the cache key each source was built under (its provenance)."""

    split: str
    sources: dict[str, list[Trajectory]]
    keys: dict[str, str]

    def transitions(self, source: str) -> int:
        return sum(len(t.steps) for t in self.sources[source])

    def state(self) -> dict:
        return {"split": self.split, "keys": dict(self.keys), "sources": {s: [trajectory_state(t) for t in ts] for s, ts in self.sources.items()}}

    @classmethod
    def from_state(cls, state: dict) -> FixedSet:
        return cls(state["split"], {s: [trajectory_from_state(t) for t in ts] for s, ts in state["sources"].items()}, dict(state["keys"]))


def cache_key(identity: dict) -> str:
    """SHA-256 of everything that determines a source's transitions (``identity``: JSON values)."""
    return hashlib.sha256(json.dumps({"format": FORMAT_VERSION, **identity}, sort_keys=True, default=str).encode()).hexdigest()


def _cache_path(cache_dir: str, split: str, source: str, key: str) -> Path:
    return Path(cache_dir).expanduser() / f"fixed-{split}-{source}-{key[:16]}.json"


def load_cached(cache_dir: str | None, split: str, source: str, key: str) -> list[Trajectory] | None:
    path = _cache_path(cache_dir, split, source, key) if cache_dir else None
    if path is None or not path.is_file():
        return None
    stored = json.loads(path.read_text())
    if stored.get("key") != key:  # a 16-character prefix collision, or a hand-edited file
        return None
    return [trajectory_from_state(t) for t in stored["trajectories"]]


def save_cached(cache_dir: str | None, split: str, source: str, key: str, trajectories: list[Trajectory]) -> None:
    """Write atomically (a temporary file renamed), so a reader never sees half a file."""
    if not cache_dir:
        return
    path = _cache_path(cache_dir, split, source, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"key": key, "split": split, "source": source, "trajectories": [trajectory_state(t) for t in trajectories]}))
    tmp.replace(path)


# ------------------------------------------------------------------ playing
def keep_spread(trajectories: list[Trajectory], n: int) -> list[Trajectory]:
    """At most ``n`` of the trajectories' steps, spread evenly over all of them (in order);
    trajectories left without a step are dropped."""
    steps = [step for traj in trajectories for step in traj.steps]
    kept = {id(steps[j]) for j in spread_indices(len(steps), n)}
    out = [dataclasses.replace(traj, steps=[s for s in traj.steps if id(s) in kept]) for traj in trajectories]
    return [traj for traj in out if traj.steps]


def scripted_trajectories(env, tokenizer, prompt, task_seeds: list[int], source: str, seed: int, max_steps: int) -> list[Trajectory]:
    """Episodes of the ``expert`` or of ``random`` admissible actions on ``task_seeds``, every
    step a transition in the policy's format (:func:`paw_lightning.demonstrations.play_episode`)."""
    trajectories = []
    for g, task_seed in enumerate(task_seeds):
        choose = expert_actions() if source == "expert" else random_valid_actions(derive_seed(seed, "fixed", "random", task_seed))
        demos = play_episode(env, tokenizer, prompt, task_seed, choose, max_steps)
        steps = []
        for k, demo in enumerate(demos):
            n = demo.prompt_length
            steps.append(Step(demo.observation, demo.input_ids[:n].tolist(), demo.input_ids[n:].tolist(), demo.response,
                              demo.action, 0.0, demo.next_observation, k == len(demos) - 1, predictable=demo.predictable))
        trajectories.append(Trajectory(g, g, task_seed, steps, won=bool(demos and demos[0].won)))
    return trajectories


def build_source(split: str, source: str, settings: FixedSetSettings, identity: dict, play: Callable[[str, list[int]], list[Trajectory]]) -> tuple[list[Trajectory], str]:
    """One source's transitions of ``split``, from the cache or played by ``play(source, task
    seeds)``, and their cache key; none if the source played no step (e.g. ``random`` where the
    environment lists no admissible actions)."""
    key = cache_key({**identity, "split": split, "source": source, "tasks": settings.tasks, "transitions": settings.transitions, "seed": settings.seed})
    cached = load_cached(settings.cache_dir, split, source, key)
    if distributed.min_across_ranks(int(cached is not None)):  # every rank found it (playing the start policy is a collective)
        return cached, key
    trajectories = keep_spread(play(source, [derive_seed(split, g) for g in range(settings.tasks)]), settings.transitions)
    if trajectories and distributed.rank() == 0:
        save_cached(settings.cache_dir, split, source, key, trajectories)
    return trajectories, key


def note(message: str) -> None:
    print(f"fixed held-out set: {message}", file=sys.stderr, flush=True)

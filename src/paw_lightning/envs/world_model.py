"""RWML's world-model task as a one-step environment (METHODS.md §4).

A task is one triplet (h_t, a_t, o_{t+1}) of ``<directory>/<split>.jsonl`` (written by
:class:`paw_lightning.callbacks.RWMLData`): the observation shows the agent's task, its last
steps, o_t and a_t; the response predicts o_{t+1} in ``<next_state>`` (prompt style ``rwml``,
which hands the environment the whole response). Reward: ``1[1 − cos(E(ŝ), E(o_{t+1})) < τ_d]``
with E the sentence embedder, 0 without a ``<next_state>`` span; the episode ends after the
step and returns the true o_{t+1}. ``won`` is reward 1, so a success rate is the reward rate;
``info["score"]`` is 1 when ŝ equals o_{t+1} up to whitespace, so ``episode/score`` is the
exact-match rate in % (ours: what the embedding reward cannot see on near-identical states).
The task seed picks triplet ``seed mod n``; ``walkthrough()`` (the expert) is the true o_{t+1}.
"""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import torch

from paw_lightning.embedding import SentenceEmbedder
from paw_lightning.envs.base import EnvError
from paw_lightning.ranges import CosineDistance, NonNegativeInt
from paw_lightning.objectives.rwml import predicted_state, similarity_rewards, wrong_copy_reward_rate

SPLITS = ("train", "candidates", "filter", "eval")
Split = Literal[SPLITS]


@dataclass
class Triplet:
    """(h_t, a_t, o_{t+1}): the agent's task, its last (observation, action) pairs before o_t,
    o_t, the action a_t and the observation the environment returned."""

    task: str
    observation: str
    action: str
    next_observation: str
    history: list[tuple[str, str]] = field(default_factory=list)

    def describe(self) -> str:
        """The world-model task's observation: everything the prediction may condition on."""
        lines = [f"The agent's task: {self.task}"]
        lines += [f"[Earlier observation:\n{obs}\nAction: '{act}']" for obs, act in self.history]
        lines += [f"Current observation:\n{self.observation}", f"The agent now takes the action: '{self.action}'"]
        return "\n".join(lines)


def write_triplets(path: Path, triplets: list[Triplet]) -> None:
    """One JSON object per line, written to a temporary file and renamed (atomic)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(t)) + "\n" for t in triplets))
    tmp.replace(path)


def read_triplets(path: Path) -> list[Triplet]:
    """The triplets of a file written by :func:`write_triplets`; ``EnvError`` if it is missing or malformed."""
    if not path.is_file():
        raise EnvError(
            f"no world-model triplets at {path}: the RWMLData callback collects them at the start of a fit "
            "(stages.rwml: configs/methods/rwml.yaml sets it), or point data.env_kwargs.directory at an earlier run's triplets"
        )
    triplets = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        try:
            item = json.loads(line)
            triplets.append(Triplet(item["task"], item["observation"], item["action"], item["next_observation"], [tuple(h) for h in item["history"]]))
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise EnvError(f"{path}:{n} is not a triplet ({err!r}); delete the directory to collect again") from None
    if not triplets:
        raise EnvError(f"{path} holds no triplets")
    return triplets


@functools.lru_cache(maxsize=2)
def shared_embedder(name_or_path: str) -> SentenceEmbedder:
    """One embedder per process and name (every environment of a pool worker shares it)."""
    return SentenceEmbedder(name_or_path)


class WorldModelEnv:
    """Predict the next observation of a recorded transition (see the module docstring).

    Args:
        directory: the folder with the split files.
        split: ``train`` (kept triplets), ``candidates`` (before subsampling), ``filter`` or ``eval``.
        tau_d: the reward's distance threshold (paper: 0.2 in training, 0.1 when filtering).
        embedder: ``embedded`` (all-MiniLM-L6-v2) or any Hugging Face encoder name/path.
        source: the environment the triplets come from (registry name or dotted path).
        source_kwargs: its constructor's keyword arguments.
        history_length: H, the (observation, action) pairs before o_t kept in a triplet.
    """

    max_return = 1.0

    def __init__(
        self, directory: str, split: Split = "train", tau_d: CosineDistance = 0.2, embedder: str = "embedded",
        source: str = "frozenlake", source_kwargs: dict | None = None, history_length: NonNegativeInt = 2,
    ):
        if split not in SPLITS:
            raise ValueError(f"unknown world-model split {split!r}: choose one of {', '.join(SPLITS)}")
        if not 0 < tau_d <= 2:
            raise ValueError(f"tau_d is a cosine distance threshold in (0, 2], got {tau_d}")
        self.directory, self.split, self.tau_d, self.embedder = Path(directory), split, tau_d, embedder
        self.source, self.source_kwargs, self.history_length = source, dict(source_kwargs or {}), history_length
        self._triplets: list[Triplet] | None = None
        self._current: Triplet | None = None

    @property
    def triplets(self) -> list[Triplet]:
        if self._triplets is None:
            self._triplets = read_triplets(self.directory / f"{self.split}.jsonl")
        return self._triplets

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        self._current = self.triplets[seed % len(self.triplets)]
        return self._current.describe(), {"task": self.task, "admissible_actions": [], "won": False}

    @property
    def task(self) -> str:
        return f"predict what the {self.source} environment shows after the agent's action"

    def step(self, response: str) -> tuple[str, float, bool, dict]:
        if self._current is None:
            raise EnvError("step() before reset() (or after the one step of a world-model task)")
        triplet, self._current = self._current, None
        prediction = predicted_state(response)
        reward = 0.0
        if prediction is not None:
            vectors = shared_embedder(self.embedder)([prediction, triplet.next_observation])
            reward = float(similarity_rewards(vectors[:1], vectors[1:], self.tau_d)[0])
        exact = prediction is not None and prediction.split() == triplet.next_observation.split()
        info = {"task": self.task, "admissible_actions": [], "won": reward == 1.0, "action_recognised": prediction is not None, "score": float(exact)}
        return triplet.next_observation, reward, True, info

    def wrong_copy_reward_rate(self, triplets: list[Triplet]) -> float | None:
        """:func:`~paw_lightning.objectives.rwml.wrong_copy_reward_rate` of ``triplets`` under this
        environment's reward (its τ_d and embedder)."""
        embed = shared_embedder(self.embedder)
        changed = torch.tensor([t.observation.split() != t.next_observation.split() for t in triplets], dtype=torch.bool)
        return wrong_copy_reward_rate(embed([t.observation for t in triplets]), embed([t.next_observation for t in triplets]), changed, self.tau_d)

    def walkthrough(self) -> list[str]:
        """The expert's one "action": the true next observation (demonstrations are WM-SFT)."""
        if self._current is None:
            raise EnvError("walkthrough() needs a reset() first")
        return [self._current.next_observation]

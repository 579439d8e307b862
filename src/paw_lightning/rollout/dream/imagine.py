"""Imagined rollouts: the policy acts, the world model (the same weights) answers.

From a real task's first observation o_0 (the environment's reset), each imagined step t renders
the prompt h_t exactly as a real rollout does (:class:`~paw_lightning.rollout.prompts.PromptBuilder`,
the history holding the *imagined* observations), samples the response a_t and predicts
ô_{t+1} = WM(h_t, a_t) in the format the world-model loss trains (METHODS.md §1). The
environment decides nothing: the :class:`~paw_lightning.rollout.dream.judge.Judge` reads each
predicted observation and says whether it ends the episode, and whether it is won. An imagined
episode stops at such an observation or after ``horizon`` steps. All active episodes of a step
act in one batch and are predicted in one batch (as the collector does); every rank runs the
same number of steps (collectives under FSDP2).

Deliberate simplifications: the admissible actions shown inside a dream are the judge's for
the predicted state when it gives them (Sudoku), else those of the last real observation (the
reset's: constant for the grid games); an invalid response is kept as the collector keeps it
(the history holds the raw response, the replay sends it); a prediction the judge cannot read
does not end the episode.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from paw_lightning.envs.actions import parse_action
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.prompts import EpisodeState, PromptBuilder
from paw_lightning.scale import distributed


class Response(Protocol):
    """What ``act`` returns per prompt (an engine's :class:`~paw_lightning.rollout.engine.Generation`):
    the text and, when a language model wrote it, the token ids of the templated prompt and of the
    response (empty lists otherwise)."""

    text: str
    prompt_ids: list[int]
    response_ids: list[int]


@dataclass
class Transition:
    """What the world model predicts o_{t+1} from: the prompt h_t, the response a_t and what the
    environment receives (``action``), the observation o_t shown in h_t (real or imagined), the
    token ids when known (``None``: the predictor templates and encodes the texts) and
    ``length_of``, the text whose token count bounds the prediction: the true o_{t+1} when it is
    known (k-step fidelity, as ``val/wm_onpolicy/*``), else o_t (a dream: observations of a task are about
    as long as each other). A scripted predictor may ignore all but what it needs."""

    prompt: str
    response: str
    observation: str
    action: str
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    length_of: str = ""


Act = Callable[[list[str]], Sequence[Response]]
Predict = Callable[[list[Transition]], list[str]]


@dataclass
class ImaginedStep:
    """One imagined step: what the environment would receive, the response, the predicted o_{t+1}."""

    action: str
    response: str
    observation: str


@dataclass
class ImaginedEpisode:
    """An imagined episode from the real reset of ``task_seed`` (observation ``start``).

    ``done``: a predicted observation ended it (else it ran to the horizon); ``won``: that
    observation is a won one; ``judged``: the environment can judge its observations."""

    task_seed: int
    start: str
    steps: list[ImaginedStep] = field(default_factory=list)
    done: bool = False
    won: bool = False
    judged: bool = False


def imagine(starts: list[tuple[int, str, dict]], act: Act, predict: Predict, judge: Judge, prompt: PromptBuilder, horizon: int) -> list[ImaginedEpisode]:
    """Dream one episode per ``(task seed, o_0, reset info)`` of ``starts`` for up to ``horizon``
    steps (see the module docstring). ``act`` and ``predict`` are called once per step on every
    rank, with an empty list where this rank has no episode left."""
    episodes = [ImaginedEpisode(seed, obs, judged=judge.judges) for seed, obs, _ in starts]
    state = {i: EpisodeState.start(obs, info) for i, (_, obs, info) in enumerate(starts)}
    tag, stops = prompt.action_tag, prompt.stop_strings
    for _ in range(horizon):
        if not distributed.any_across_ranks(bool(state)):
            break
        active = sorted(state)
        prompts = [prompt.render(state[i]) for i in active]
        responses = list(act(prompts))
        actions = [parse_action(r.text, tag) for r in responses]
        sends = [r.text if a is None or prompt.sends_response else a for a, r in zip(actions, responses)]
        transitions = [Transition(p, r.text, state[i].observation, send, r.prompt_ids or None, r.response_ids or None, state[i].observation)
                       for i, p, r, send in zip(active, prompts, responses, sends)]
        predicted = predict(transitions)
        for i, response, action, send, obs in zip(active, responses, actions, sends, predicted):
            episodes[i].steps.append(ImaginedStep(send, response.text, obs))
            outcome = judge(obs)
            if outcome is not None and outcome.done:
                episodes[i].done, episodes[i].won = True, outcome.won
                del state[i]
                continue
            admissible = outcome.admissible_actions if outcome is not None and outcome.admissible_actions is not None else state[i].admissible_actions
            state[i].advance(action if action is not None else response.text, obs, {"admissible_actions": admissible})
    return episodes

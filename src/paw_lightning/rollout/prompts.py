"""The agent prompt (METHODS.md §1); the action's tag and parser are :mod:`paw_lightning.envs.actions`.

The prompt follows verl-agent / PaW: a one-line role, the task, how many steps were
taken, the last K (observation, action) pairs, the current observation, the admissible
actions, and the instruction to reason in ``<think></think>`` and then answer with one
admissible action in ``<action></action>``, as one user message through the chat template
(:mod:`paw_lightning.rollout.samples`). ``style="compact"`` (ours, for small models and
CPU budgets) keeps the same content and format in fewer tokens.

"""
from __future__ import annotations

from dataclasses import dataclass, field

from paw_lightning.envs.actions import ACTION_TAGS


INSTRUCTION = (
    "Now it's your turn to take an action.\n"
    "You should first reason step-by-step about the current situation. This reasoning "
    "process MUST be enclosed within <think> </think> tags.\n"
    "Once you've finished your reasoning, you should choose an admissible action for the "
    "current step and present it within <action> </action> tags."
)
COMPACT_INSTRUCTION = "Reason briefly in <think> </think>, then give one admissible action in <action> </action>."
SPA_INSTRUCTION = (  # SPA's self-play format (METHODS.md §5): state estimate and prediction before the action
    "Now it's your turn to take an action.\n"
    "Inside <think> </think>, first describe the current state within <observation> </observation>, then "
    "predict the state after your action within <prediction> </prediction>, then reason step-by-step.\n"
    "After </think>, give one admissible action for the current step within <answer> </answer> tags."
)
RWML_INSTRUCTION = (  # RWML's world-model task (METHODS.md §4): the response is a predicted observation
    "Predict the observation the environment returns after this action.\n"
    "You should first reason step-by-step inside <think> </think> tags, then write the predicted "
    "observation, exactly as the environment would show it, within <next_state> </next_state> tags."
)
SEARCH_INSTRUCTION = (  # Search-R1's prompt (search QA, docs/reference/environments.md#search-qa)
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>."
)
STYLES = ("verl", "compact", "spa", "rwml", "search")  # the action tag of each: envs/actions.py


@dataclass
class EpisodeState:
    """What the next prompt ``h_t`` of an episode is rendered from: the task, the current
    observation, its admissible actions and every previous (observation, executed action)
    pair. One bookkeeping for rollouts (:mod:`paw_lightning.rollout.collector`) and
    demonstrations (:mod:`paw_lightning.demonstrations`)."""

    task: str
    observation: str
    admissible_actions: list[str]
    history: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def start(cls, observation: str, info: dict) -> EpisodeState:
        """The state after ``reset`` (``info`` holds ``task`` and ``admissible_actions``)."""
        return cls(info["task"], observation, info["admissible_actions"])

    def advance(self, action: str, observation: str, info: dict) -> None:
        """After ``step(action)`` returned ``observation`` and ``info``: (o_t, a_t) joins the history."""
        self.history.append((self.observation, action))
        self.observation, self.admissible_actions = observation, info["admissible_actions"]


@dataclass
class PromptBuilder:
    """Renders the prompt ``h_t`` of METHODS.md §1.

    Args:
        env_name: shown in the role line ("… operating in the {env_name} environment").
        history_length: K, how many previous (observation, action) pairs are shown.
        style: ``verl`` (METHODS.md §1, verl-agent's wording), ``compact`` (see above),
            ``spa`` (verl's prompt asking for SPA's ``<observation>``/``<prediction>``/``<answer>``)
            or ``rwml`` (a world-model task: the observation holds the history and the action,
            the response predicts the next observation in ``<next_state>``) or ``search``
            (Search-R1's prompt: the question, then every previous response span and
            ``<information>`` block; the response ends with ``<search>`` or ``<answer>``).
    """

    env_name: str
    history_length: int = 2
    style: str = "verl"

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"unknown prompt style {self.style!r}: choose one of {', '.join(STYLES)}")

    @property
    def action_tag(self) -> str | tuple[str, ...]:
        """The tag the response's action is in: ``answer`` (SPA), ``next_state`` (RWML), else
        ``action``; ``search``: the tuple ``("search", "answer")`` (see :func:`paw_lightning.envs.actions.parse_action`)."""
        return ACTION_TAGS.get(self.style, "action")

    @property
    def stop_strings(self) -> list[str]:
        """Generation stops after the first of these: the closing tag(s) of the action."""
        tag = self.action_tag
        return [f"</{t}>" for t in ((tag,) if isinstance(tag, str) else tag)]

    @property
    def sends_response(self) -> bool:
        """Whether the environment receives the whole response, valid or not (``rwml``: the
        world-model environment scores the ``<next_state>`` span itself, a missing one as 0;
        ``search``: the environment parses the ``<search>``/``<answer>`` span itself)."""
        return self.style in ("rwml", "search")

    def __call__(
        self,
        task: str,
        observation: str,
        history: list[tuple[str, str]],
        admissible_actions: list[str],
    ) -> str:
        """``history`` holds every previous (observation, executed action) pair of the episode."""
        step = len(history)
        actions = ", ".join(f"'{a}'" for a in admissible_actions if a != "help")
        if self.style == "compact":
            return self._compact(task, observation, history, actions)
        if self.style == "search":
            return self._search(task, observation, history)
        if self.style == "rwml":
            return f"You are the world model of a text environment. Your task is to: {task}\n{observation}\n{RWML_INSTRUCTION}"
        parts = [f"You are an expert agent operating in the {self.env_name} environment.", f"Your task is to: {task}"]
        recent = history[-self.history_length :] if self.history_length > 0 else []
        if recent:
            first = step - len(recent) + 1
            lines = [
                f"[Observation {first + i}:\n{obs}\nAction {first + i}: '{act}']" for i, (obs, act) in enumerate(recent)
            ]
            parts.append(
                f"Prior to this step, you have already taken {step} step(s). Below are the most recent "
                f"{len(recent)} observations and the corresponding actions you took:\n" + "\n".join(lines)
            )
        parts.append(f"You are now at step {step + 1} and your current observation is:\n{observation}")
        if actions:
            parts.append(f"Your admissible actions of the current situation are: [{actions}].")
        parts.append(SPA_INSTRUCTION if self.style == "spa" else INSTRUCTION)
        return "\n".join(parts)

    def render(self, state: EpisodeState) -> str:
        """The prompt of an episode's current step."""
        return self(state.task, state.observation, state.history, state.admissible_actions)

    def _compact(self, task: str, observation: str, history: list[tuple[str, str]], actions: str) -> str:
        step = len(history)
        recent = history[-self.history_length :] if self.history_length > 0 else []
        first = step - len(recent) + 1
        parts = [task, *(f"Step {first + i}: {obs}\nAction: {act}" for i, (obs, act) in enumerate(recent))]
        parts.append(f"Step {step + 1}: {observation}")
        if actions:
            parts.append(f"Admissible actions: [{actions}].")
        parts.append(COMPACT_INSTRUCTION)
        return "\n".join(parts)

    def _search(self, task: str, observation: str, history: list[tuple[str, str]]) -> str:
        """Search-R1's context: instruction, question, then the last K (action span, information)
        turns; the first observation is the question itself, so it is not repeated."""
        recent = history[-self.history_length :] if self.history_length > 0 else []
        start = len(history) - len(recent)
        parts = [SEARCH_INSTRUCTION, f"Question: {task}"]
        for k, (obs, action) in enumerate(recent):
            if start + k > 0:
                parts.append(obs)
            parts.append(action)
        if history:
            parts.append(observation)
        return "\n".join(parts)

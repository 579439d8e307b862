"""Demonstrations (expert or random admissible actions) as token-level SFT samples, in exactly
the policy's format: every step played becomes ``[prompt h_t][response a_t]``, ``h_t`` built as
the collector builds it, ``a_t`` = ``<think>{reason}</think><action>{action}</action>`` + eos (with
SPA's prompt style, SPA's format with the true states), the only part in ``loss_mask``.
Sources: ``expert`` (``walkthrough()``, else ``solve()``) teaches format and solution;
``random_valid`` (a uniform admissible action) the format only; ``random_moving`` (a uniform
admissible action among those that change the observation) the format without a bias towards
moves that change nothing: SPA's format predicts the next state before the answer, and a
warm-up on ``random_valid`` moves taught the 135M model that the next state equals the current
one and so to bump into the border. Simplifications: one fixed
reason (``REASON``); the response is tokenized in pieces so the action's tokens are known
exactly; every step played is kept, won or not.
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from paw_lightning.model import read_log_softmax, scatter_read
from paw_lightning.rollout.collector import derive_seed
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.prompts import EpisodeState, PromptBuilder
from paw_lightning.rollout.spa import spa_response

REASON = "The task requires this step next."
SOURCES = ("expert", "random_valid", "random_moving")
RANDOM_MAX_STEPS = 50  # cap of a random episode when no max_steps is given

# chooses the next action from (env, info of the current state, step index); None ends the episode
ActionSource = Callable[[object, dict, int], "str | None"]


@dataclass
class Demonstration:
    """One expert step as an SFT sample (1-D tensors of equal length)."""

    input_ids: torch.Tensor  # prompt ids (chat template, generation prompt) + response ids
    loss_mask: torch.Tensor  # True on the response tokens (eos included)
    action_mask: torch.Tensor  # True on the tokens of the action text inside <action></action>
    prompt: str  # h_t before the chat template
    response: str  # a_t without the eos token
    action: str
    task_seed: int
    step: int
    won: bool = False  # the episode this step belongs to was won
    observation: str = ""  # o_t, the observation the step answered
    next_observation: str = ""  # o_{t+1}, what the environment answered
    predictable: bool = True  # o_{t+1} is a world-model target (the step info's ``world_model_target``)

    @property
    def prompt_length(self) -> int:
        """Number of prompt tokens (the response follows them)."""
        return int((~self.loss_mask).sum())


def expert_plan(env, from_start: bool) -> list[str] | None:
    """The expert's actions: ``walkthrough()`` (only ``from_start``; ``None`` later: keep
    following the first plan) or ``solve()`` from the current state."""
    if callable(getattr(env, "walkthrough", None)):
        return list(env.walkthrough()) if from_start else None
    if callable(getattr(env, "solve", None)):
        return list(env.solve())
    raise ValueError(
        f"{type(env).__name__} has no expert: demonstrations need an environment with walkthrough() "
        "(a winning plan from the start) or solve() (a plan from the current state)"
    )


def response_text(prompt: PromptBuilder, action: str, reason: str, observation: str, next_observation: str) -> str:
    """The demonstrated response in the prompt's format: ``<think>{reason}</think><{tag}>{action}</{tag}>``
    (tag ``action``, or ``next_state`` for ``rwml``), or SPA's format with the true states o_t,
    o_{t+1} (prompt style ``spa``); style ``search``: ``<think>{reason}</think>{action}``, the
    expert's action being the whole ``<search>``/``<answer>`` span."""
    if prompt.style == "spa":
        return spa_response(observation, next_observation, action, reason)
    tag = prompt.action_tag
    if not isinstance(tag, str):  # ``search``: the action is already a whole span, <search>q</search>
        return f"<think>{reason}</think>{action}"
    return f"<think>{reason}</think><{tag}>{action}</{tag}>"


def response_ids(tokenizer: PreTrainedTokenizerBase, response: str, action: str, tag: str | tuple = "action") -> tuple[list[int], list[bool]]:
    """Token ids of ``response`` (which ends with ``{action}</{tag}>``; with a tuple of tags, with
    the action span itself) + eos, and which of them are the action text: the response is
    tokenized in three pieces so they are known exactly."""
    tail = f"</{tag}>" if isinstance(tag, str) else ""
    if not response.endswith(action + tail):
        raise ValueError(f"a demonstrated response must end with its action in <{tag}></{tag}>: {response[-60:]!r}")
    pieces = [response[: len(response) - len(action + tail)], action, tail]
    ids, is_action = [], []
    for k, piece in enumerate(pieces):
        piece_ids = tokenizer.encode(piece, add_special_tokens=False)
        ids += piece_ids
        is_action += [k == 1] * len(piece_ids)
    return ids + [tokenizer.eos_token_id], is_action + [False]


def demonstration(tokenizer, prompt_ids: list[int], prompt: str, response: str, action: str, tag: str | tuple, task_seed: int, step: int) -> Demonstration:
    """The SFT sample ``[prompt ids][response ids + eos]``: loss on the response, action mask on
    the action's tokens."""
    r_ids, is_action = response_ids(tokenizer, response, action, tag)
    return Demonstration(
        input_ids=torch.tensor(prompt_ids + r_ids, dtype=torch.long),
        loss_mask=torch.tensor([False] * len(prompt_ids) + [True] * len(r_ids)),
        action_mask=torch.tensor([False] * len(prompt_ids) + is_action),
        prompt=prompt,
        response=response,
        action=action,
        task_seed=task_seed,
        step=step,
    )


def expert_actions() -> ActionSource:
    """The expert as an action source: the first plan (walkthrough or ``solve()``, taken
    right after the reset) and, for ``solve()`` environments, a new plan at every later step."""
    plan: list[str] = []

    def choose(env, info: dict, t: int) -> str | None:
        nonlocal plan
        replanned = expert_plan(env, from_start=t == 0)
        if replanned is not None:
            plan = replanned
        return plan.pop(0) if plan else None

    return choose


def random_valid_actions(seed: int) -> ActionSource:
    """Uniformly random admissible actions (``help`` excluded), from ``random.Random(seed)``;
    at most ``RANDOM_MAX_STEPS`` of them."""
    rng = random.Random(seed)

    def choose(env, info: dict, t: int) -> str | None:
        actions = [a for a in info["admissible_actions"] if a != "help"]
        return rng.choice(actions) if actions and t < RANDOM_MAX_STEPS else None

    return choose


def random_moving_actions(seed: int, probe_env, task_seed: int) -> ActionSource:
    """Uniformly random admissible actions among those that change the observation (``help``
    excluded; all admissible ones when none does), from ``random.Random(seed)``; at most
    ``RANDOM_MAX_STEPS``. Each candidate is tried on ``probe_env``, replayed from
    ``reset(task_seed, 0)`` through the actions chosen so far, so the probe is exact for an
    environment that a (task seed, episode) pair determines (every seeded environment here)."""
    rng = random.Random(seed)
    history: list[str] = []

    def outcome(action: str | None) -> str:
        obs, _info = probe_env.reset(task_seed, 0)
        for step in history + ([action] if action else []):
            obs, _reward, _done, _info = probe_env.step(step)
        return obs

    def choose(env, info: dict, t: int) -> str | None:
        actions = [a for a in info["admissible_actions"] if a != "help"]
        if not actions or t >= RANDOM_MAX_STEPS:
            return None
        now = outcome(None)
        moving = [a for a in actions if outcome(a) != now]
        history.append(rng.choice(moving or actions))
        return history[-1]

    return choose


def play_episode(
    env, tokenizer: PreTrainedTokenizerBase, prompt: PromptBuilder, task_seed: int, choose: ActionSource, max_steps: int | None = None, reason: str = REASON
) -> list[Demonstration]:
    """One episode on task ``task_seed`` (``reset(task_seed, episode=0)``) with the actions of
    ``choose``, every step as an SFT sample."""
    obs, info = env.reset(task_seed, 0)
    state = EpisodeState.start(obs, info)
    demos: list[Demonstration] = []
    t = 0
    while max_steps is None or t < max_steps:
        action = choose(env, info, t)
        if action is None:
            break
        text = prompt.render(state)
        observation = state.observation
        if prompt.sends_response:  # the world-model task scores the whole response (next_observation is not needed)
            response = response_text(prompt, action, reason, observation, "")
            next_observation, _reward, done, info = env.step(response)
        else:
            next_observation, _reward, done, info = env.step(action)
            response = response_text(prompt, action, reason, observation, next_observation)
        demos.append(demonstration(tokenizer, chat_prompt_ids(tokenizer, text), text, response, action, prompt.action_tag, task_seed, t))
        demos[-1].observation, demos[-1].next_observation = observation, next_observation
        demos[-1].predictable = bool(info.get("world_model_target", True))
        state.advance(action, next_observation, info)
        t += 1
        if done:
            break
    won = bool(info.get("won", False))
    for demo in demos:
        demo.won = won
    return demos


def play_expert(
    env, tokenizer: PreTrainedTokenizerBase, prompt: PromptBuilder, task_seed: int, max_steps: int | None = None, reason: str = REASON
) -> list[Demonstration]:
    """One expert episode on task ``task_seed``."""
    return play_episode(env, tokenizer, prompt, task_seed, expert_actions(), max_steps, reason)


def collect_demonstrations(
    env_factory,
    tokenizer: PreTrainedTokenizerBase,
    prompt: PromptBuilder,
    task_seeds: list[int],
    max_steps: int | None = None,
    reason: str = REASON,
    source: str = "expert",
    seed: int = 0,
) -> list[Demonstration]:
    """Episodes of ``source`` (see ``SOURCES``) on ``task_seeds`` with one environment from
    ``env_factory`` (``random_moving``: a second one probes the actions); ``seed`` seeds the
    random draws."""
    if source not in SOURCES:
        raise ValueError(f"unknown demonstration source {source!r}: choose one of {', '.join(SOURCES)}")
    envs = [env_factory() for _ in range(2 if source == "random_moving" else 1)]
    try:
        demos = []
        for task_seed in task_seeds:
            if source == "expert":
                choose = expert_actions()
            elif source == "random_valid":
                choose = random_valid_actions(derive_seed(seed, "random-valid", task_seed))
            else:
                choose = random_moving_actions(derive_seed(seed, "random-moving", task_seed), envs[1], task_seed)
            demos += play_episode(envs[0], tokenizer, prompt, task_seed, choose, max_steps, reason)
        return demos
    finally:
        for env in envs:
            if callable(getattr(env, "close", None)):
                env.close()


def collate(demos: list[Demonstration], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask``, ``loss_mask``, ``action_mask``."""
    width = max(len(d.input_ids) for d in demos)
    batch = {
        "input_ids": torch.full((len(demos), width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros(len(demos), width, dtype=torch.long),
        "loss_mask": torch.zeros(len(demos), width, dtype=torch.bool),
        "action_mask": torch.zeros(len(demos), width, dtype=torch.bool),
    }
    for row, d in enumerate(demos):
        n = len(d.input_ids)
        batch["input_ids"][row, :n] = d.input_ids
        batch["attention_mask"][row, :n] = 1
        batch["loss_mask"][row, :n] = d.loss_mask
        batch["action_mask"][row, :n] = d.action_mask
    return batch


def token_logprobs(lm, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log p(x_t | x_<t) at the ``loss_mask`` positions (0 elsewhere), shape of ``input_ids``;
    the logits start at the batch's first loss position (:func:`~paw_lightning.model.read_log_softmax`)."""
    ids, mask = batch["input_ids"], batch["loss_mask"].bool()
    keep_from = max(int(mask.any(0).nonzero()[0]) if mask.any() else ids.shape[1] - 1, 1)
    logp, targets, _ = read_log_softmax(lm, ids, batch["attention_mask"], mask, keep_from)
    return scatter_read(logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), mask, keep_from)


def sft_loss(lm, batch: dict[str, torch.Tensor], tokens: int | None = None) -> tuple[torch.Tensor, int]:
    """Cross-entropy on the response tokens, summed and divided by ``tokens`` (default: this
    batch's response tokens, i.e. the token mean; a micro-batch divides by its whole batch's,
    so the micro-batches' losses add up to the batch's mean), and this batch's response tokens."""
    mask = batch["loss_mask"].float()
    n = int(mask.sum())
    return -(token_logprobs(lm, batch) * mask).sum() / max(n if tokens is None else tokens, 1), n

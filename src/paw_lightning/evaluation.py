"""A held-out evaluation (validation or test) of the current weights, in one place.

The data module plays the held-out tasks (:class:`~paw_lightning.rollout.played.PlayedEpisodes`,
with the :func:`eval_plan` of what it played); :class:`PaWModule` turns them into an
:class:`Evaluation` at the end of each validation / test: the episode metrics with pass@k,
the teacher-forced world-model NLL and token accuracy of its ``validation_step``s, and
greedy free-running next-observation predictions (:func:`predict_observations`) and, when
``data.evaluation.dream`` is on, the dream measures (:func:`dream_results`). The
evaluation report, the trajectory table, the progress lines and the run summary read the
module's latest ``Evaluation`` of a split and compute nothing themselves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from paw_lightning.metrics import episode_metrics, pass_at_k_metrics
from paw_lightning.rollout.collector import derive_seed
from paw_lightning.rollout.dream.lm import generate_observations
from paw_lightning.rollout.dream.measures import DreamRecords, dream_metrics, edit_distance
from paw_lightning.rollout.engine import GenerationEngine
from paw_lightning.rollout.played import PlayedEpisodes
from paw_lightning.rollout.samples import RolloutBuffer, spread_indices
from paw_lightning.scale import distributed


def eval_plan(split: str, env: str, env_kwargs: dict, groups: int, group_size: int, temperature: float, max_steps: int, seed: int) -> dict:
    """What an evaluation of ``split`` (``val`` / ``test``) plays, for its report: the held-out
    tasks (group g resets with task seed ``derive_seed(split, g)``, the same in every
    evaluation and run), the sampling seed of each rank (``derive_seed(seed, split, rank)``),
    the episodes per task, the temperature and the environment arguments."""
    return {
        "split": split,
        "env": env,
        "env_kwargs": dict(env_kwargs),
        "groups": groups,
        "group_size": group_size,
        "temperature": temperature,
        "max_steps": max_steps,
        "task_seeds": [derive_seed(split, g) for g in range(groups)],
        "sampling_seeds": [derive_seed(seed, split, r) for r in range(distributed.world_size())],
    }


def episode_results(trajectories) -> dict[str, float]:
    """The episode metrics of held-out episodes: :func:`~paw_lightning.metrics.episode_metrics`
    and pass@k (a collective under ``torch.distributed``: every rank calls it)."""
    return {**episode_metrics(trajectories), **pass_at_k_metrics(trajectories)}


@dataclass
class Evaluation:
    """One validation or test: what was played, and what was measured on it.

    Args:
        played: the held-out episodes of this rank.
        episode: :func:`episode_results` (logged as ``<split>/episode/*``).
        world_model: free-running prediction quality, ``exact_match`` and ``cer``
            (logged as ``<split>/wm_onpolicy/*``); empty when not measured.
        predictions: the free-running o_{t+1} per sample index (the trajectory table).
        dream: the world model as a simulator (:func:`dream_results`, logged as
            ``<split>/dream/*``); empty when not measured.
        fixed: the world model on the fixed held-out transitions (:func:`fixed_set_quality` and
            free-running predictions per source, logged as ``<split>/wm_fixed/*``); empty
            without a fixed set.
    """

    played: PlayedEpisodes
    episode: dict[str, float]
    world_model: dict[str, float] = field(default_factory=dict)
    predictions: dict[int, str] = field(default_factory=dict)
    dream: dict[str, float] = field(default_factory=dict)
    fixed: dict[str, float] = field(default_factory=dict)

    @property
    def split(self) -> str:
        return self.played.split


def teacher_forced_quality(logprobs: torch.Tensor, correct: torch.Tensor, obs_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Next-observation NLL per token, −Σ log p(o) / n, and token accuracy, Σ [argmax = o] / n,
    over the ``obs_mask`` tokens of a batch; returns (nll, accuracy, n). A batch without
    observation tokens gives n = 0 (and 0, 0): logged with ``batch_size=n`` it leaves the
    epoch's token-weighted mean unchanged, and an epoch without any target logs NaN, not 0."""
    n = obs_mask.sum()
    return -(logprobs * obs_mask).sum() / n.clamp(min=1), (correct & obs_mask).sum() / n.clamp(min=1), n


def first_token_quality(logprobs: torch.Tensor, correct: torch.Tensor, obs_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`teacher_forced_quality` of each observation's first token only (the first
    ``obs_mask`` position of a row): whether the model knows how an observation starts. A greedy
    prediction that misses it runs off in another direction from its first word, however well
    the rest is predicted after the true first token (docs/reference/dream.md)."""
    first = obs_mask & ~torch.nn.functional.pad(obs_mask[:, :-1], (1, 0), value=False)
    return teacher_forced_quality(logprobs, correct, first)


@torch.no_grad()
def fixed_set_quality(token_outputs, samples: dict[str, RolloutBuffer], batch_size: int, device, pad_token_id: int) -> dict[str, float]:
    """Teacher-forced quality of the fixed held-out transitions (:mod:`paw_lightning.fixed_set`):
    per source and over every source together (``all``), ``<source>/nll``, ``token_acc``
    (:func:`teacher_forced_quality`), ``first_token_nll``, ``first_token_acc``
    (:func:`first_token_quality`), token-weighted over every rank's share, and
    ``<source>/transitions``. ``token_outputs(batch, argmax=True)`` is the module's forward;
    ``samples`` this rank's share of each source. Every rank runs as many forwards (a rank
    with fewer batches runs idle ones): a collective."""
    totals: dict[str, list[float]] = {}
    for source, buffer in samples.items():
        sums = [0.0] * 6  # Σ nll·n, Σ acc·n, n over every token, then over first tokens
        by_length = sorted(range(len(buffer)), key=lambda i: buffer.input_ids[i].numel())
        chunks = [by_length[k : k + batch_size] for k in range(0, len(by_length), batch_size)]
        for k in range(distributed.max_across_ranks(len(chunks))):
            batch = buffer.collate(chunks[k]) if k < len(chunks) else distributed.idle_batch(pad_token_id)
            batch = {key: value.to(device) for key, value in batch.items()}
            outputs = token_outputs(batch, argmax=True)
            for j, quality in enumerate((teacher_forced_quality, first_token_quality)):
                nll, accuracy, n = quality(outputs["logprobs"], outputs["correct"], batch["obs_mask"])
                sums[3 * j : 3 * j + 3] = [sums[3 * j] + float(nll * n), sums[3 * j + 1] + float(accuracy * n), sums[3 * j + 2] + float(n)]
        totals[source] = distributed.sum_each_across_ranks([*sums, len(buffer)])
    if totals:
        totals["all"] = [sum(values) for values in zip(*totals.values())]
    out = {}
    for source, (nll, correct, n, first_nll, first_correct, first_n, count) in totals.items():
        out.update({f"{source}/nll": nll / n if n else math.nan, f"{source}/token_acc": correct / n if n else math.nan,
                    f"{source}/first_token_nll": first_nll / first_n if first_n else math.nan,
                    f"{source}/first_token_acc": first_correct / first_n if first_n else math.nan, f"{source}/transitions": count})
    return out


@torch.no_grad()
def predict_observations(lm, tokenizer, buffer: RolloutBuffer, n: int) -> tuple[dict[str, float], dict[int, str]]:
    """Greedy free-running prediction of o_{t+1} from (h_t, a_t) for ``n`` transitions spread
    over the buffer: exact match and character error rate against the true observation, and
    the predictions (sample index → text). Call it in the module's ``generating()`` context.

    Each prediction is exactly as many tokens as the true observation (or fewer, if the model
    ends its turn): the model is never trained on where an observation ends (the template's
    end-of-turn tokens are outside ``obs_mask``, METHODS.md §1), so an unbounded prediction
    would run on and count the overrun as errors (a CER above 1). Transitions without a
    world-model target (no ``obs_mask`` token) are not predicted. Every rank generates as many
    tokens (synced forwards under FSDP2)."""
    targets_at = [i for i in range(len(buffer)) if buffer.obs_mask[i].any()]
    indices = [targets_at[j] for j in spread_indices(len(targets_at), n)]
    contexts, targets, lengths = [], [], []
    for i in indices:
        ids, obs = buffer.input_ids[i], buffer.obs_mask[i]
        contexts.append(ids[~obs].tolist())
        targets.append(tokenizer.decode(ids[obs], skip_special_tokens=True).strip())
        lengths.append(int(obs.sum()))
    engine = GenerationEngine(lm, tokenizer, max([1, *lengths]))  # this rank's budget; the call takes the longest of all ranks
    preds = generate_observations(engine, tokenizer, contexts, lengths)
    predictions = dict(zip(indices, preds))
    # every rank's counts added up (ranks may hold different numbers of targets; one with none
    # still takes part, so every rank logs the same keys): corpus CER = edits / reference characters
    matches, count, edits, chars = distributed.sum_each_across_ranks([sum(p == t for p, t in zip(preds, targets)), len(preds),
                                                                     sum(edit_distance(p, t) for p, t in zip(preds, targets)),
                                                                     sum(map(len, targets))])
    if not count:
        return {}, predictions
    return {"exact_match": matches / count, "cer": edits / max(chars, 1)}, predictions


def dream_results(records: DreamRecords) -> dict[str, float]:
    """The dream measures of every rank's :class:`~paw_lightning.rollout.dream.measures.DreamRecords`
    together: k-step fidelity, success inside the model, replay (docs/reference/dream.md; a
    collective: every rank calls it)."""
    return dream_metrics(records)

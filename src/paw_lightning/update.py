"""One RL update, top to bottom: everything between the rollout and the first optimizer step.

:func:`prepare_update`, called once per RL iteration by ``PaWModule.on_train_epoch_start`` with
this rank's step samples and the :class:`UpdateInputs` it needs (nothing else of the module), fills in per sample everything ``PaWModule.compute_loss`` reads: (1) :func:`score`:
π_old, π_ref (only with the KL term), mean action-token entropies and, with a critic, V(h_t);
with an off-policy engine, the TIS weights min(π_old / π_engine, C); (2) the advantages A (and value targets) from the policy objective's estimator, format-guarded; (3) S_α, the
top-α entropy selection over every rank (a collective; unselected transitions lose their
observation tokens); (4) λ_g of each sample's task group, from the world-model's balancer.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from paw_lightning.model import reference_policy
from paw_lightning.objectives import PolicyObjective, WorldModelObjective
from paw_lightning.objectives.selection import transition_entropy
from paw_lightning.rollout.samples import RolloutBuffer
from paw_lightning.scale import distributed
from paw_lightning.training.learning_signal import zero_advantage_fraction
from paw_lightning.training.microbatch import split_by_tokens


@dataclass(frozen=True)
class ScoringModel:
    """The model as the scoring pass uses it.

    Args:
        lm: the (LoRA) language model; its adapters are disabled for π_ref.
        token_outputs: ``PaWModule.token_outputs``: per-token log-probs (and entropies, values) of a batch.
        forward_context: the trainer's compute precision around a forward.
        device: where batches go.
        idle_token_id: the token of an idle forward (a rank with fewer chunks than its peers runs one).
        batch_size: samples per scoring forward (``model.score_batch_size``).
    """

    lm: torch.nn.Module
    token_outputs: Callable[..., dict[str, torch.Tensor]]
    forward_context: Callable[[], AbstractContextManager]
    device: torch.device
    idle_token_id: int
    batch_size: int


@dataclass(frozen=True)
class UpdateInputs:
    """Everything preparing an update reads, and nothing more.

    Args:
        policy_objective: its advantage estimator fills A; ``needs_reference``: the KL term's π_ref.
        world_model_objective: S_α selection and λ_g; ``None`` for vanilla RL.
        model: the scoring pass's model.
        old_logprobs: ``recompute`` (a scoring forward) or ``rollout`` (the sampler's log-probs).
        with_values: a critic reads V(h_t) (PPO's GAE).
        off_policy: the rollout engine samples from another copy of the weights (TIS).
        tis_cap: C of the truncated importance weights; ``None``: report the gap only.
    """

    policy_objective: PolicyObjective
    world_model_objective: WorldModelObjective | None
    model: ScoringModel
    old_logprobs: str = "recompute"
    with_values: bool = False
    off_policy: bool = False
    tis_cap: float | None = None


def prepare_update(inputs: UpdateInputs, buffer: RolloutBuffer, max_return: float | None = None) -> dict[str, float]:
    """Steps 1–4 above, in place on ``buffer``; returns the update's diagnostics (the
    advantage estimator's, the share of zero advantages and the selection's entropy quantiles). ``max_return``: the
    environment's return of a won episode (R_max of the reward-adaptive λ)."""
    score(inputs, buffer)
    objective = inputs.policy_objective
    if inputs.with_values:
        buffer.advantages, buffer.returns = objective.advantages_and_returns(buffer.info)
    else:
        buffer.advantages = objective.advantages(buffer.info)
    metrics = dict(getattr(objective.advantage, "last_diagnostics", {}))
    in_loss = buffer.advantages if buffer.no_policy_loss is None else buffer.advantages[~buffer.no_policy_loss]
    metrics["policy/zero_advantage_fraction"] = zero_advantage_fraction(in_loss)  # of the samples the policy loss reads
    if inputs.off_policy:
        metrics.update(off_policy_correction(buffer, inputs.tis_cap))
    wm = inputs.world_model_objective
    if wm is None:
        return metrics
    entropies = buffer.action_entropy[wm.entropy]
    buffer.wm_selected = wm.select(entropies)
    buffer.drop_world_model_segments(~buffer.wm_selected)
    group_lambda = wm.balancer.lambdas(buffer.trajectories, max_return)
    buffer.wm_lambda = torch.tensor([group_lambda[int(g)] for g in buffer.info.group_ids], dtype=torch.float32)
    if entropies.numel():
        quantiles = torch.quantile(entropies.float(), torch.tensor([0.1, 0.5, 0.9]))
        metrics.update({
            "wm/entropy_p10": quantiles[0].item(),
            "wm/entropy_p50": quantiles[1].item(),
            "wm/entropy_p90": quantiles[2].item(),
            "wm/update_selected_fraction": buffer.wm_selected.float().mean().item(),
        })
    return metrics


def off_policy_correction(buffer: RolloutBuffer, cap: float | None) -> dict[str, float]:
    """The rollout engine's mismatch with the trainer (METHODS.md §2): ``rollout/engine_kl``,
    the mean |log π_engine − log π_old| over this rank's action tokens, and with a cap C the
    truncated importance weight min(π_old / π_engine, C) of every action token (1 elsewhere),
    which the policy loss multiplies each token's surrogate by; ``rollout/tis_capped_fraction``:
    the share of action tokens whose weight the cap cut."""
    if len(buffer.sampler_logprobs) != len(buffer):
        raise RuntimeError("the rollout engine recorded no log-probs: an off-policy engine must sample with token_stats=True")
    gaps, weights, capped = [], [], 0
    for old, sampled, mask in zip(buffer.old_logprobs, buffer.sampler_logprobs, buffer.action_mask):
        actions = mask[: len(old)]
        log_ratio = torch.where(actions, old - sampled, torch.zeros_like(old))
        gaps.append(log_ratio[actions].abs())
        if cap is not None:
            ratio = log_ratio.exp()
            capped += int((ratio[actions] > cap).sum())
            weights.append(torch.where(actions, ratio.clamp(max=cap), torch.ones_like(old)))
    buffer.tis_weights = weights
    gaps = torch.cat(gaps) if gaps else torch.zeros(0)
    metrics = {"rollout/engine_kl": float(gaps.mean()) if gaps.numel() else 0.0}
    if cap is not None:
        metrics["rollout/tis_capped_fraction"] = capped / max(gaps.numel(), 1)
    return metrics


@torch.no_grad()
def score(inputs: UpdateInputs, buffer: RolloutBuffer) -> None:
    """The scoring pass: π_old log-probs, reference log-probs (adapters disabled, only when
    the KL term needs them), each transition's mean action-token entropy (both estimators of
    :mod:`paw_lightning.objectives.selection`) and, with a critic, V(h_t). Runs on the
    buffer's :meth:`~RolloutBuffer.policy_view` in :func:`score_chunks`; every rank runs the
    same number of forwards (FSDP2 collectives). Skipped when the rollout
    already recorded π_old and the entropies (``model.old_logprobs: rollout``) and neither
    π_ref nor V(h_t) is needed."""
    from_rollout = inputs.old_logprobs == "rollout"  # the same decision on every rank (collectives)
    if from_rollout:
        if len(buffer.sampler_logprobs) != len(buffer):
            raise RuntimeError("model.old_logprobs is 'rollout' but the rollout recorded no sampler log-probs: its engine must run with token_stats=True")
        buffer.old_logprobs = list(buffer.sampler_logprobs)
        buffer.action_entropy = buffer.sampler_entropy or {"full": torch.zeros(0), "sampled": torch.zeros(0)}  # a rank without samples
    policy_forward = not from_rollout or inputs.with_values  # V(h_t) comes from the adapters-on forward
    needs_reference = inputs.policy_objective.needs_reference
    if not policy_forward and not needs_reference:
        return
    model = inputs.model
    was_training = model.lm.training
    model.lm.eval()
    try:
        with model.forward_context():  # the update's precision: π_old is the first optimizer step's π_θ
            _score_forwards(model, buffer, needs_reference, policy_forward, inputs.with_values)
    finally:
        model.lm.train(was_training)


def score_chunks(lengths: list[int], size: int) -> list[list[int]]:
    """The samples of each scoring forward: sorted by length (longest first, ties by index),
    ``size`` per forward. Neighbours in the buffer are steps of one episode, of every length;
    a forward of similar lengths pads little, and its LM head starts near each row's own
    prompt (``keep_from``, the forward's shortest prompt). No gradient, so nothing but the
    rounding depends on which samples share a forward."""
    return split_by_tokens(lengths, None, size)


def _score_forwards(model: ScoringModel, buffer: RolloutBuffer, needs_reference: bool, policy_forward: bool, with_values: bool) -> None:
    """The forwards of :func:`score`, in :func:`score_chunks` of ``model.batch_size``;
    each sample's results are stored at its own index."""
    view = buffer.policy_view()  # no world-model segment: π_old, π_ref and entropies are read on actions only
    lengths = [ids.numel() for ids in view.input_ids]
    chunks = score_chunks(lengths, model.batch_size)
    n = len(buffer)
    old = [None] * n
    ref = [None] * n if needs_reference else []
    values = torch.zeros(n, dtype=torch.float32) if with_values else None
    entropy = {name: torch.zeros(n, dtype=torch.float32) for name in ("full", "sampled")}  # the default dtype may be bfloat16 (bf16-true)
    for k in range(distributed.max_across_ranks(len(chunks))):
        if k >= len(chunks):  # keep this rank's forwards (FSDP2 collectives) in step with its peers
            idle = distributed.idle_batch(model.idle_token_id, model.device)
            if needs_reference:
                with reference_policy(model.lm):
                    model.token_outputs(idle)
            if policy_forward:
                model.token_outputs(idle)
            continue
        indices = chunks[k]
        batch = {key: v.to(model.device) for key, v in view.collate(indices).items()}
        if needs_reference:
            with reference_policy(model.lm):
                ref_lp = model.token_outputs(batch)["logprobs"].cpu()
            for row, i in enumerate(indices):
                ref[i] = ref_lp[row, : lengths[i]]
        if not policy_forward:
            continue
        outputs = model.token_outputs(batch, entropy=True)
        if values is not None:
            values[indices] = outputs["values"].float().cpu()
        for name in entropy:
            entropy[name][indices] = transition_entropy(outputs["entropy"], outputs["logprobs"], batch["action_mask"], name).cpu()
        logprobs = outputs["logprobs"].cpu()
        for row, i in enumerate(indices):
            old[i] = logprobs[row, : lengths[i]]
    buffer.ref_logprobs = ref
    if values is not None:
        buffer.info.values = values
    if policy_forward:
        buffer.old_logprobs = old
        buffer.action_entropy = entropy

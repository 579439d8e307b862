"""PaWModule: one causal LM with LoRA, trained on a policy objective and, from the same
forward pass, a world-model objective (METHODS.md §3).

``training_step`` is one optimizer step on one mini-batch (manual optimisation): token-budget
micro-batches (:mod:`paw_lightning.training.microbatch`) each run ``compute_loss`` (forward →
policy loss → world-model loss → combine) and backward, then clip and step. Objectives and
optimizer come from YAML. Before an RL iteration's first mini-batch, ``on_train_epoch_start``
takes the episodes the data module played (``datamodule.played["train"]``) and prepares the
update (:func:`paw_lightning.update.prepare_update`: π_old, π_ref, advantages, S_α and λ_g per
sample, which the batches then carry); the module owns the iteration's metrics and clock.
After a validation / test it turns the held-out episodes into an
:class:`~paw_lightning.evaluation.Evaluation` (``evaluations[split]``). Simplifications:
log-probs at temperature 1; logits only from the shortest prompt on (``logits_to_keep``);
weight-0 repeat micro-batches under FSDP2/DDP.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import sys
from pathlib import Path
from collections.abc import Iterator
from typing import Literal

import torch
from lightning.pytorch import LightningModule
from jsonargparse import lazy_instance
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from paw_lightning.data import RolloutDataModule
from paw_lightning.evaluation import Evaluation, dream_results, episode_results, first_token_quality, fixed_set_quality, predict_observations, teacher_forced_quality
from paw_lightning.metrics import episode_metrics
from paw_lightning.model import LMConfig, load_model, load_tokenizer, read_log_softmax, scatter_read
from paw_lightning.objectives import ClippedMAE, Critic, PolicyObjective, WorldModelObjective
from paw_lightning.objectives.types import LossOutput
from paw_lightning.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from paw_lightning.rollout.engine import GenerationEngine, HFEngine, RolloutEngine
from paw_lightning.rollout.played import FixedSamples, PlayedEpisodes
from paw_lightning.rollout.samples import RolloutBuffer
from paw_lightning.scale import distributed
from paw_lightning.scale.fsdp import fsdp_mixed_precision, gathered_for_generation, shard_model
from paw_lightning.scale import checkpointing
from paw_lightning.training.memory import peak_memory_gib
from paw_lightning.training.microbatch import matched_across_ranks, micro_batches
from paw_lightning.training import optimizer_settings
from paw_lightning.training.nonfinite import NonFiniteGuard, all_finite
from paw_lightning.training.perf import EpochClock
from paw_lightning.training.rollout_watch import RolloutWatch, rollout_counts
from paw_lightning.training.term_gradients import TermGradients
from paw_lightning.update import ScoringModel, UpdateInputs, prepare_update


DEFAULT_LR = 1e-4  # the recipe's AdamW learning rate; the CLI's model.optimizer default is built from it


def default_optimizer(params) -> torch.optim.Optimizer:
    """AdamW with lr :data:`DEFAULT_LR` and torch's other defaults (the CLI shows it as
    ``class_path: torch.optim.AdamW``, ``init_args.lr``)."""
    return torch.optim.AdamW(params, lr=DEFAULT_LR)


# The published PaW recipe as the signature's defaults (METHODS.md): GRPO's clipped surrogate
# with a k3 KL term; the clipped MAE on the top α = 0.75 action-entropy transitions weighted by
# the reward-adaptive λ_g. ``lazy_instance`` lets the CLI print and merge them as class_path /
# init_args; a module built with a default gets its own fresh instance (see _own).
PAW_POLICY = lazy_instance(PolicyObjective)  # advantage: null means GRPO()
PAW_WORLD_MODEL = lazy_instance(ClippedMAE)  # balancer: null means RewardAdaptiveLambda()


def policy_mask(batch: dict) -> torch.Tensor:
    """The tokens the policy loss reads: the action tokens, less those of the samples left out
    of it (``policy_mask``, e.g. truncated responses under ``data.rollout.mask_truncated``)."""
    return batch.get("policy_mask", batch["action_mask"])


def _own(value, default, cls):
    """``value``, or a new ``cls()`` when it is the signature's shared default object."""
    return cls() if value is default else value


class PaWModule(LightningModule):
    """Args:
    lm: which model to load and how to attach LoRA.
    policy_objective: the RL loss (advantage estimator + clipped surrogate + KL); default
        ``PolicyObjective()``: GRPO, ε 0.2, KL 0.01 (k3).
    critic: PPO's value head, value loss, its weight and learning rate
        (:class:`~paw_lightning.objectives.Critic`); required by, and only allowed with, an
        advantage estimator that reads values (GAE).
    world_model_objective: next-observation loss on the same weights; default ``ClippedMAE()``
        (PaW: ρ 0.2, α 0.75, reward-adaptive λ); ``null`` for vanilla RL.
    optimizer: built over the trainable (LoRA) parameters only; default AdamW, lr 1e-4.
    score_batch_size: samples per forward of the no-grad scoring pass (π_old, reference),
        grouped by length (``update.score_chunks``); the CPU recipes set 1.
    wm_eval_samples: validation transitions per rank whose next observation is predicted
        free-running (greedy) and scored with exact match and character error rate.
    micro_batch_tokens: token budget of one forward/backward of a training step: the
        mini-batch is split into micro-batches of at most this many padded tokens (rows ×
        longest row; a longer sample goes alone) and the gradients accumulate to one
        optimizer step; ``null``: the whole mini-batch at once.
    micro_batch_rows: at most this many samples per micro-batch as well (``null``: no cap).
        ``1`` runs each sample unpadded, with the LM head only over its own response and
        observation: on a CPU, for samples of varied lengths (ALFWorld's), the faster update
        (measured in docs/results/speed-and-memory.md); on a GPU leave it ``null`` and batch by
        ``micro_batch_tokens``.
    max_grad_norm: clip the global gradient norm to this before each optimizer step;
        ``null``: no clipping (replaces ``trainer.gradient_clip_val``, which manual
        optimisation does not support).
    gather_weights_for_generation: under FSDP2, keep the full weights gathered on every rank
        for a whole rollout (one all-gather per weight) instead of gathering each decoder
        layer for every generated token and freeing it after (see :mod:`paw_lightning.scale.fsdp`):
        much less communication, the full model's memory on every rank while generating.
        No effect without FSDP2.
    old_logprobs: where π_old (and the action entropy of the world-model selection) comes
        from. ``recompute`` (default, as verl): a no-grad scoring forward over the update's
        samples after the rollout. ``rollout``: the sampler's own log-probs and entropies,
        read from the logits that generated each token (see
        :mod:`paw_lightning.rollout.engine`), so the scoring forward runs only when the KL
        term (π_ref) or PPO's critic (V(h_t)) needs one. Same values up to floating-point
        rounding; ``rollout`` saves one forward over every sample per RL iteration.
    engine: what samples the rollouts: ``HFEngine`` (default, the trained model itself),
        ``paw_lightning.rollout.ct2.CT2Engine`` (an int8/float32 CTranslate2 copy re-synced
        after each update; CPU, one process), ``paw_lightning.rollout.vllm_engine.VLLMEngine``
        (CUDA) or ``paw_lightning.rollout.cb_engine.CBEngine`` (transformers' continuous
        batching on the merged copy); CT2 and vLLM are off-policy: π_old is recomputed and TIS
        corrects the gap.
    init_weights: start from the trainable (LoRA, critic) weights of an earlier run: a
        checkpoint (``last.ckpt``) or a cached warm-up (``warmup-*.pt``); a fresh fit (new
        optimizer, epoch 0), e.g. policy RL after an RWML or SPA stage. ``--ckpt_path``
        resumes a run instead.
    max_nonfinite_steps: an optimizer step whose loss or gradient is NaN/inf is skipped
        (``train/nonfinite_steps`` counts them); this many in a row stop the run
        (:mod:`paw_lightning.training.nonfinite`).
    term_gradients_every: on the first optimizer step of every this-many-th RL iteration, the
        policy term's and the world-model term's gradients on the LoRA weights, their norms and
        cosine (``train/grad/*``, :mod:`paw_lightning.training.term_gradients`); 0: off.
    """

    strict_loading = False  # checkpoints hold only the trainable (LoRA) weights

    def __init__(
        self,
        lm: LMConfig = LMConfig(),
        policy_objective: PolicyObjective | None = PAW_POLICY,
        critic: Critic | None = None,
        world_model_objective: WorldModelObjective | None = PAW_WORLD_MODEL,
        optimizer: OptimizerCallable = default_optimizer,
        score_batch_size: PositiveInt = 8,
        wm_eval_samples: NonNegativeInt = 8,
        micro_batch_tokens: PositiveInt | None = None,
        micro_batch_rows: PositiveInt | None = None,
        max_grad_norm: PositiveFloat | None = 1.0,
        gather_weights_for_generation: bool = False,
        old_logprobs: Literal["recompute", "rollout"] = "recompute",
        max_nonfinite_steps: PositiveInt = 3,
        term_gradients_every: NonNegativeInt = 1,
        engine: RolloutEngine | None = None,
        init_weights: str | None = None,
    ):
        super().__init__()
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ValueError(f"model.micro_batch_tokens must be at least 1 or null (got {micro_batch_tokens})")
        if micro_batch_rows is not None and micro_batch_rows < 1:
            raise ValueError(f"model.micro_batch_rows must be at least 1 or null (got {micro_batch_rows})")
        if score_batch_size < 1:
            raise ValueError(f"model.score_batch_size must be at least 1 (got {score_batch_size})")
        if max_grad_norm is not None and max_grad_norm <= 0:
            raise ValueError(f"model.max_grad_norm must be positive or null (got {max_grad_norm})")
        if old_logprobs not in ("recompute", "rollout"):
            raise ValueError(f"model.old_logprobs must be 'recompute' or 'rollout' (got {old_logprobs!r})")
        self.old_logprobs = old_logprobs
        self.engine = engine or HFEngine()
        if old_logprobs == "rollout" and self.engine.off_policy:
            raise ValueError("model.old_logprobs 'rollout' reads π_old from the sampler, which only an on-policy engine (hf, CBEngine) samples with π_θ: "
                             f"with {type(self.engine).__name__} set model.old_logprobs: recompute (--model.old_logprobs=recompute)")
        self.automatic_optimization = False  # training_step accumulates micro-batches itself
        self.micro_batch_tokens = micro_batch_tokens
        self.micro_batch_rows = micro_batch_rows
        self.max_grad_norm = max_grad_norm
        self.gather_weights_for_generation = gather_weights_for_generation
        self.lm_config = dataclasses.replace(lm) if lm is not None else LMConfig()  # a copy: the default instance is shared
        self.policy_objective = _own(policy_objective, PAW_POLICY, PolicyObjective) or PolicyObjective()
        estimator = type(self.policy_objective.advantage).__name__
        needs_values = getattr(self.policy_objective.advantage, "needs_values", False)
        if needs_values and critic is None:
            raise ValueError(f"the {estimator} advantage reads a critic's values: set model.critic (configs/algorithms/ppo.yaml does)")
        if critic is not None and not needs_values:
            raise ValueError(f"model.critic is set but the {estimator} advantage uses no values: remove model.critic, or use GAE (configs/algorithms/ppo.yaml)")
        self.critic = critic
        self.world_model_objective = _own(world_model_objective, PAW_WORLD_MODEL, ClippedMAE)
        self.optimizer_factory = optimizer
        self.init_weights = init_weights
        if init_weights is not None and not Path(init_weights).expanduser().is_file():
            raise FileNotFoundError(f"model.init_weights: no file {init_weights!r} (a last.ckpt of an earlier run or a warm-up cache file)")
        self.score_batch_size = score_batch_size
        self.wm_eval_samples = wm_eval_samples
        self.tokenizer = load_tokenizer(self.lm_config)  # also validates the model source early
        self.lm = None
        self.evaluations: dict[str, Evaluation] = {}  # the latest validation / test of each split
        self.checkpoint_epoch: int | None = None  # epoch of the loaded checkpoint, if any
        self.nonfinite = NonFiniteGuard(max_nonfinite_steps)
        self.term_gradients = TermGradients(term_gradients_every)
        self.clock = EpochClock()  # train/perf/*: the rollout's time as played, the scoring pass and the update as run here
        self.rollout_watch = RolloutWatch()  # warns when RL has no signal, its format drifts or it plays one action everywhere
        self.offline_updates = 0  # fits of the weights outside the trainer's steps (warm-up, SFT stages): see sampler()

    # ----------------------------------------------------------------- set-up
    def configure_model(self) -> None:
        if self.lm is not None:
            return
        attached = self._trainer is not None
        self.lm = load_model(self.lm_config, device=self.trainer.strategy.root_device if attached else self.device)
        if self.critic is not None:  # PPO: V(h_t) from the last hidden state of the prompt
            self.critic.build(self.lm.config.hidden_size)
        if self.init_weights is not None:  # before sharding: every rank loads the full weights
            checkpointing.load_trainable(self, self.init_weights)
        if attached and isinstance(self.trainer.strategy, ModelParallelStrategy):
            shard_model(self.lm, self.device_mesh["data_parallel"], mp_policy=fsdp_mixed_precision(self.trainer.precision))
            if self.critic is not None:
                fully_shard(self.critic.head, mesh=self.device_mesh["data_parallel"])

    def setup(self, stage: str) -> None:
        self.engine.check(self.lm_config, self.trainer.world_size)

    def sampler(self, max_new_tokens: int, token_stats: bool = False) -> GenerationEngine:
        """The rollout engine's sampler on the current weights. Their version, by which an engine
        that samples from a copy knows when to refresh it: the global step and the number of
        :meth:`weights_changed` calls (the stages before the first update, such as the warm-up
        and SPA's self-play SFT, change the weights at global step 0)."""
        return self.engine.sampler(self.lm, self.tokenizer, max_new_tokens, token_stats, version=(self.global_step, self.offline_updates))

    @property
    def records_token_stats(self) -> bool:
        """Whether training rollouts record the sampler's log-probs and entropies: π_old itself
        (``old_logprobs: rollout``) or π_engine of an off-policy engine (TIS)."""
        return self.old_logprobs == "rollout" or self.engine.off_policy

    @property
    def trains_world_model(self) -> bool:
        """Whether training samples carry the next-observation segment (not for vanilla RL)."""
        return self.world_model_objective is not None

    def update_inputs(self) -> UpdateInputs:
        """What :func:`~paw_lightning.update.prepare_update` reads of this module."""
        model = ScoringModel(self.lm, self.token_outputs, self.forward_context, self.device, self.tokenizer.eos_token_id, self.score_batch_size)
        return UpdateInputs(
            self.policy_objective,
            self.world_model_objective,
            model,
            old_logprobs=self.old_logprobs,
            with_values=self.critic is not None,
            off_policy=self.engine.off_policy,
            tis_cap=self.engine.tis_cap,
        )

    def weights_changed(self) -> None:
        """Tell the rollout engine that the weights changed outside the trainer's steps."""
        self.offline_updates += 1

    def weights_digest(self) -> str:
        """SHA-256 of the model's configuration and its trainable weights (gathered: a collective)."""
        digest = hashlib.sha256(repr(dataclasses.asdict(self.lm_config)).encode())
        for name, tensor in sorted(checkpointing.trainable_state_dict(self).items()):
            digest.update(name.encode())
            digest.update(tensor.detach().float().cpu().numpy().tobytes())
        return digest.hexdigest()

    def forward_context(self) -> contextlib.AbstractContextManager:
        """The trainer's compute precision (``trainer.precision``; ``bf16-mixed``: autocast to
        bfloat16, the LoRA weights staying float32) around a forward outside ``training_step``
        and ``validation_step``, which Lightning wraps itself: the rollouts and the scoring pass
        compute as the update does, so π_old is what the first optimizer step's forward gives."""
        trainer = self._trainer  # None outside a fit (tests, scripts): no precision to apply
        return trainer.precision_plugin.forward_context() if trainer is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Sampling mode for rollouts and free-running predictions: the LM in eval mode (no
        dropout), in the trainer's precision (:meth:`forward_context`) and, with
        ``gather_weights_for_generation``, its FSDP2 weights gathered until the block ends;
        all restored after."""
        was_training = self.lm.training
        self.lm.eval()
        try:
            with gathered_for_generation(self.lm, self.gather_weights_for_generation), self.forward_context():
                yield
        finally:
            self.lm.train(was_training)

    def configure_optimizers(self):
        actor = [p for n, p in self.named_parameters() if p.requires_grad and not n.startswith("critic.")]
        optimizer = self.optimizer_factory(actor if self.critic is None else [{"params": actor}, self.critic.parameter_group()])
        self.configured_optimizer = optimizer_settings.configured(optimizer)  # re-applied after a resume
        return optimizer

    def on_train_start(self) -> None:
        """After a resume, the optimizer's settings are the config's again
        (:mod:`paw_lightning.training.optimizer_settings`), its moments the checkpoint's."""
        changes = optimizer_settings.reapply(self.trainer.optimizers[0], self.configured_optimizer)
        if changes and distributed.rank() == 0:
            print(f"optimizer: the config's settings replace the checkpoint's: {', '.join(changes)}", file=sys.stderr)

    def on_fit_start(self) -> None:
        trainer = self.trainer
        if trainer.reload_dataloaders_every_n_epochs != 1:
            raise ValueError("trainer.reload_dataloaders_every_n_epochs must be 1: every epoch trains on fresh on-policy rollouts")
        if isinstance(trainer.strategy, ModelParallelStrategy) and trainer.strategy._save_distributed_checkpoint:
            raise ValueError(
                "ModelParallelStrategy must save one full checkpoint file, resumable at any world size: use "
                "paw_lightning.scale.strategy.FSDP2Strategy (as configs/scale/*.yaml do) or set "
                "trainer.strategy.init_args.save_distributed_checkpoint=false"
            )

    # --------------------------------------------------------------- forward
    def token_outputs(self, batch: dict, entropy: bool = False, argmax: bool = False, entropy_grad: bool = False) -> dict[str, torch.Tensor]:
        """Per-token log p(x_t | x_<t) at the positions some loss reads (``action_mask`` or
        ``obs_mask``; zeros elsewhere), aligned with ``input_ids``; optionally the entropy of the
        predictive distribution there (with a gradient only if ``entropy_grad``) and whether
        argmax == x_t; with a critic also ``values`` V(h_t), read at each sample's last prompt token.

        Memory: the vocabulary-sized log-softmax is taken only at the read positions, not
        over the whole sequence (the logits themselves start at the shortest prompt)."""
        input_ids = batch["input_ids"]
        keep_from = int(batch["keep_from"])
        with_values = self.critic is not None and "prompt_lengths" in batch
        read = torch.zeros_like(input_ids, dtype=torch.bool)
        for key in ("action_mask", "obs_mask"):
            if key in batch:
                read |= batch[key].bool()
        logp, targets, out = read_log_softmax(self.lm, input_ids, batch["attention_mask"], read, keep_from, output_hidden_states=with_values)

        def full(values):
            return scatter_read(values, read, keep_from)

        outputs = {"logprobs": full(logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1))}
        if entropy:
            with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                outputs["entropy"] = full(-(logp.exp() * logp).sum(-1))
        if argmax:
            outputs["correct"] = full(logp.argmax(-1) == targets)
        if with_values:
            outputs["values"] = self.critic(out.hidden_states[-1], batch["prompt_lengths"])
        return outputs

    # -------------------------------------------------------------- training
    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        """One optimizer step on one mini-batch, accumulated over its micro-batches."""
        optimizer = self.optimizers()
        totals = self.loss_totals(batch)
        parts = micro_batches(batch, self.micro_batch_tokens, self.micro_batch_rows)
        metrics: dict[str, torch.Tensor] = {}
        measured = self.term_gradients.measures(self.current_epoch, batch_idx)
        with self.clock.phase("update", self.device):
            for micro, weight in matched_across_ranks(parts):
                out = self.compute_loss(micro, totals)
                if measured:
                    self.term_gradients.add(out.terms, [p for p in self.lm.parameters() if p.requires_grad], weight)
                self.manual_backward(out.loss * weight)
                for key, value in out.metrics.items():
                    metrics[key] = metrics.get(key, 0.0) + weight * value  # micro-batch shares add up to the mini-batch's value
            def where() -> str:  # only formatted for a skipped step
                return f"epoch {self.current_epoch}, mini-batch {batch_idx}, task groups {sorted(set(batch['group_ids'].tolist()))}"

            if self.nonfinite.step_ok(all_finite(metrics["loss"], self.parameters()), where):
                optimizer.step()  # gradient clipping: on_before_optimizer_step
            optimizer.zero_grad(set_to_none=True)
        self.clock.count("update", batch["attention_mask"].sum())
        self.log_dict({f"train/{k}": v for k, v in metrics.items()}, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(batch["input_ids"]))
        if measured:  # one process only (TermGradients): nothing to sync
            self.log_dict({f"train/{k}": v for k, v in self.term_gradients.metrics().items()}, on_step=False, on_epoch=True, batch_size=1)
        if batch_idx == self.trainer.num_training_batches - 1:  # the update's last step: every rank is here
            self._log_update_summary()
        return metrics["loss"]

    def compute_loss(self, batch: dict, totals: dict | None = None) -> LossOutput:
        """forward → policy loss → (value loss) → world-model loss → combine, for a batch; with the
        ``totals`` of a whole mini-batch (``loss_totals``) the loss and metrics of a micro-batch
        are its additive share of the mini-batch's."""
        totals = totals or self.loss_totals(batch)
        # entropy is logged as train/policy/entropy; it is a loss term only when entropy_coef > 0
        outputs = self.token_outputs(batch, entropy=True, entropy_grad=self.policy_objective.entropy_coef > 0)
        policy = self.policy_objective(
            outputs["logprobs"],
            batch["old_logprobs"],
            batch["advantages"],
            policy_mask(batch),
            ref_logprobs=batch.get("ref_logprobs"),
            entropy=outputs.get("entropy"),
            tis_weights=batch.get("tis_weights"),
            totals=totals["policy"],
        )
        loss, metrics, terms = policy.loss, dict(policy.metrics), {"policy": policy.loss}
        if self.critic is not None:
            value = self.critic.loss(outputs["values"], batch, samples=totals["samples"])
            loss = loss + value.loss
            metrics.update(value.metrics)
        if self.world_model_objective is not None:
            wm = self.world_model_objective(
                outputs["logprobs"], batch["obs_mask"], batch["group_ids"], batch["wm_lambda"], batch.get("wm_selected"), totals=totals["wm"]
            )
            loss = loss + wm.loss
            metrics.update(wm.metrics)
            terms["world_model"] = wm.loss
        metrics["loss"] = loss.detach()
        return LossOutput(loss, metrics, terms)

    def loss_totals(self, batch: dict) -> dict:
        """The normalisers of a whole mini-batch that every objective divides by (see the
        objectives' ``totals``): data only, no forward."""
        totals = {"policy": self.policy_objective.totals(batch["advantages"], policy_mask(batch)), "samples": len(batch["input_ids"])}
        if self.world_model_objective is not None:
            totals["wm"] = self.world_model_objective.totals(batch["obs_mask"], batch["group_ids"], batch["wm_lambda"], batch.get("wm_selected"))
        return totals

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.max_grad_norm is not None:
            self.clip_gradients(optimizer, gradient_clip_val=self.max_grad_norm, gradient_clip_algorithm="norm")

    def _log_update_summary(self) -> None:
        """Peak memory (GPU: allocated tensors; CPU: peak RSS): ``train/memory/peak_gib`` is the
        max over ranks and, with several ranks, ``train/memory/peak_gib/rank_<r>`` each rank's;
        and the iteration's time split and throughput, ``train/perf/*`` (:mod:`paw_lightning.training.perf`);
        ``train/nonfinite_steps``: optimizer steps skipped so far for a NaN/inf loss or gradient.

        Called at the end of the update's last training step, not in ``on_train_epoch_end``: these
        are collectives, and at epoch end Lightning's progress bar, on rank 0 only, first syncs
        the epoch's ``sync_dist`` metrics (collectives the other ranks run later), so a
        collective in that hook would pair with the wrong operation and hang."""
        peaks = distributed.gather_floats(peak_memory_gib(self.device))
        per_rank = {f"train/memory/peak_gib/rank_{r}": peak for r, peak in enumerate(peaks)} if len(peaks) > 1 else {}
        perf = {f"train/{k}": v for k, v in self.clock.metrics().items()}
        perf["train/nonfinite_steps"] = float(self.nonfinite.skipped)
        self.log_dict({"train/memory/peak_gib": max(peaks), **per_rank, **perf}, on_step=False, on_epoch=True, rank_zero_only=True, batch_size=1)

    def _played(self, split: str) -> PlayedEpisodes | None:
        """The data module's latest episodes of ``split`` (none with another kind of data)."""
        datamodule = self.trainer.datamodule
        return datamodule.played.get(split) if isinstance(datamodule, RolloutDataModule) else None

    def on_train_epoch_start(self) -> None:
        """Prepare this RL iteration's update from the episodes just played, before its first
        mini-batch is collated: the scoring pass, advantages, S_α and λ_g
        (:func:`~paw_lightning.update.prepare_update`); log the episode and update metrics."""
        played = self._played("train")
        if played is None or played.epoch != self.current_epoch:
            return
        self.clock.reset()
        self.clock.add("rollout", played.seconds, played.response_tokens)
        with self.clock.phase("scoring", self.device):
            update = prepare_update(self.update_inputs(), played.samples, played.max_return)
        sync_seconds = getattr(self.engine, "last_sync_seconds", None)  # an engine that samples from a copy
        if sync_seconds is not None:
            update["perf/engine_sync_s"] = sync_seconds
        update.update(played.metrics)  # how the rollout was played (dynamic sampling, truncation)
        policy_episodes = played.policy_episodes  # with dynamic sampling its first round, not the kept groups
        episodes = episode_metrics(policy_episodes)
        counts = rollout_counts(len(policy_episodes), sum(len(t.steps) for t in policy_episodes), sum(t.invalid_steps for t in policy_episodes),
                                sum(t.won for t in policy_episodes), update["policy/zero_advantage_fraction"] == 1.0)
        for warning in self.rollout_watch.observe(counts, episodes["top_action_share"]):
            if distributed.rank() == 0:
                print(warning)
        self._log_episode_metrics("train", episodes)
        self.log_dict({f"train/{k}": v for k, v in update.items()}, sync_dist=True)

    # ------------------------------------------------------------ evaluation
    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._world_model_quality(batch, "val")

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._world_model_quality(batch, "test")

    def on_validation_epoch_end(self) -> None:
        """The held-out episodes just played become this split's :class:`Evaluation`: episode
        metrics with pass@k, on ``wm_eval_samples`` transitions free-running predictions and,
        with ``data.evaluation.dream``, the dream measures (``<split>/dream/*``)."""
        split = "test" if self.trainer.testing else "val"
        played = self._played(split)
        if played is None:
            return
        evaluation = self.evaluations[split] = Evaluation(played, episode_results(played.trajectories))
        self._log_episode_metrics(split, evaluation.episode)
        if self.wm_eval_samples > 0:
            evaluation.world_model, evaluation.predictions = self.predict_observations(played.samples, self.wm_eval_samples)
            self.log_dict({f"{split}/wm_onpolicy/{k}": v for k, v in evaluation.world_model.items()}, sync_dist=True)
        evaluation.fixed = self.score_fixed_set(played.fixed) if played.fixed is not None else {}
        self.log_dict({f"{split}/wm_fixed/{k}": float(v) for k, v in evaluation.fixed.items()}, sync_dist=True)
        if played.dream is not None:  # data.evaluation.dream: the dream the data module played beside these episodes
            evaluation.dream = dream_results(played.dream)
            self.log_dict({f"{split}/dream/{k}": float(v) for k, v in evaluation.dream.items()}, sync_dist=True)

    on_test_epoch_end = on_validation_epoch_end

    def predict_observations(self, buffer: RolloutBuffer, n: int) -> tuple[dict[str, float], dict[int, str]]:
        """:func:`paw_lightning.evaluation.predict_observations` with the current weights, in sampling mode."""
        with self.generating():
            return predict_observations(self.lm, self.tokenizer, buffer, n)

    def score_fixed_set(self, fixed: FixedSamples) -> dict[str, float]:
        """The world model on a split's fixed held-out transitions: teacher-forced
        (:func:`~paw_lightning.evaluation.fixed_set_quality`) and, on ``fixed.predict`` transitions
        per source, free-running exact match and CER (``all/exact_match``: over every source's
        predictions)."""
        with torch.no_grad(), self.forward_context():
            scores = fixed_set_quality(self.token_outputs, fixed.sources, fixed.batch_size, self.device, self.tokenizer.eos_token_id)
        predict = math.ceil(fixed.predict / distributed.world_size())
        if predict:
            predicted = {source: self.predict_observations(buffer, predict) for source, buffer in fixed.sources.items()}
            counts = dict(zip(predicted, distributed.sum_each_across_ranks([len(p[1]) for p in predicted.values()])))
            for source, (measures, _) in predicted.items():
                scores.update({f"{source}/{k}": v for k, v in measures.items()})
            if sum(counts.values()):
                scores["all/exact_match"] = sum(predicted[s][0].get("exact_match", 0.0) * n for s, n in counts.items()) / sum(counts.values())
        return scores

    def _world_model_quality(self, batch: dict, split: str) -> None:
        """Teacher-forced next-observation NLL per token and token accuracy, over every observation
        token and over each observation's first (:mod:`paw_lightning.evaluation`)."""
        outputs = self.token_outputs(batch, argmax=True)
        nll, accuracy, n = teacher_forced_quality(outputs["logprobs"], outputs["correct"], batch["obs_mask"])
        self.log_dict({f"{split}/wm_onpolicy/nll": nll, f"{split}/wm_onpolicy/token_acc": accuracy}, on_epoch=True, sync_dist=True, batch_size=int(n))
        nll, accuracy, n = first_token_quality(outputs["logprobs"], outputs["correct"], batch["obs_mask"])
        self.log_dict({f"{split}/wm_onpolicy/first_token_nll": nll, f"{split}/wm_onpolicy/first_token_acc": accuracy}, on_epoch=True, sync_dist=True, batch_size=int(n))

    def _log_episode_metrics(self, split: str, metrics: dict[str, float]) -> None:
        if metrics:
            self.log_dict({f"{split}/episode/{k}": float(v) for k, v in metrics.items()}, sync_dist=True)
            # the progress bar shows the latest success rate and return (not logged twice)
            bar = {f"{split}_success": metrics["success_rate"], f"{split}_return": metrics["return_mean"]}
            self.log_dict({k: float(v) for k, v in bar.items()}, prog_bar=True, logger=False, sync_dist=True)

    # ----------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        """Keep only the trainable (LoRA) weights and the optimizer state, both gathered and
        keyed by name so that any world size resumes them (:mod:`paw_lightning.scale.checkpointing`),
        and the RNG states for an exact resume. A collective: runs on every rank."""
        checkpoint["state_dict"] = checkpointing.trainable_state_dict(self)
        checkpoint["trainable_parameters"] = checkpointing.trainable_names(self)
        if "optimizer_states" in checkpoint:
            checkpoint["optimizer_states"] = [checkpointing.optimizer_state_dict(self, opt) for opt in self.trainer.optimizers]
        checkpoint["rng_states"] = checkpointing.rng_states()
        checkpoint["nonfinite_steps"] = self.nonfinite.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.checkpoint_epoch = checkpoint.get("epoch")  # names the evaluation reports of validate / test
        # under ModelParallelStrategy the strategy has already loaded (and removed) state_dict
        saved = checkpoint.get("trainable_parameters") or checkpoint.get("state_dict", {})
        missing = set(checkpointing.trainable_names(self)) - set(saved)
        if missing:
            raise ValueError(
                f"the checkpoint lacks {len(missing)} of this model's trainable weights (e.g. {sorted(missing)[0]}): "
                "it was written with a different model or LoRA configuration"
            )
        if checkpoint.get("rng_states"):
            checkpointing.restore_rng_states(checkpoint["rng_states"])
        self.nonfinite.load_state_dict(checkpoint.get("nonfinite_steps", {}))

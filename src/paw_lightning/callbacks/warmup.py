"""Behaviour-cloning warm-up: a short SFT on demonstrations before RL starts.

At ``on_fit_start`` of a fresh run, plays demonstration episodes on training-split tasks
(:mod:`paw_lightning.demonstrations`, ``source``: ``expert`` plans, ``random_valid`` or
``random_moving`` actions, in the policy's exact format) and fits the LoRA weights to them
with cross-entropy on the response tokens, with its own AdamW (the trainer's optimizer is untouched). Each batch runs
in the update's micro-batches (``model.micro_batch_tokens`` and ``micro_batch_rows``: one
demonstration at a time in the CPU recipes) and every rank runs the same number of
forward/backward passes. With ``cache_dir`` the result is saved under a hash of
everything that determines it (``model.init_weights``' bytes included: a warm-up after an RWML
stage starts from its weights) and loaded by later fits with the same settings, so the runs of
a comparison start from the same policy. A config sets it as ``stages.warmup``
(:mod:`paw_lightning.callbacks.stages`). Without a terminal it prints a line with the
demonstrations and one per epoch (:func:`progress_line`, shared with the stages built on it).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

import torch
from lightning.pytorch import Callback
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from paw_lightning.demonstrations import REASON, SOURCES, Demonstration, collate, collect_demonstrations, sft_loss
from paw_lightning.progress import interactive, progress_bar
from paw_lightning.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from paw_lightning.rollout.collector import derive_seed
from paw_lightning.scale import distributed
from paw_lightning.scale import checkpointing
from paw_lightning.training.microbatch import matched_across_ranks, micro_batches


def progress_line(stage: str, *parts: str, enabled: bool = True) -> None:
    """A stage's progress as one plain line where its rich bar does not show (stdout is a log
    file or a pipe, not :func:`~paw_lightning.progress.interactive`)::

        behaviour-cloning warm-up · epoch 1/2 · loss 1.234 · 181.0 s

    ``stage · part · part``, printed by rank 0 and flushed; nothing on a terminal or when not
    ``enabled`` (the stage's ``progress`` or ``data.progress`` is off)."""
    if enabled and distributed.rank() == 0 and not interactive():
        print(" · ".join([stage, *(part for part in parts if part)]), flush=True)


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes: names the weights a warm-up starts from."""
    digest = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class BehaviourCloningWarmup(Callback):
    """A short SFT on demonstrations before RL (see the module docstring).

    Args:
    demonstrations: demonstration episodes (all ranks together).
    epochs: passes over the demonstration steps.
    lr: AdamW learning rate of the warm-up.
    batch_size: demonstration steps per optimizer step and rank.
    seed: seeds the task choice, the shuffling and the random actions.
    source: ``expert``, ``random_valid`` or ``random_moving`` (see above).
    reason: the fixed text inside ``<think></think>`` of every demonstration (a short one
        makes every later response, and so every rollout step, shorter).
    progress: show a rich progress bar on a terminal, plain lines elsewhere (a line with the
        demonstrations, one per epoch: :func:`progress_line`); rank 0; also off when
        ``data.progress`` is false.
    cache_dir: save the warmed-up LoRA weights here and reuse them in later fits with the
        same settings (see above); ``null``: always train.
    """

    name = "behaviour-cloning warm-up"  # in the printed summary
    metric_prefix = "warmup"  # warmup/loss, warmup/demo_steps

    def __init__(
        self, demonstrations: NonNegativeInt = 16, epochs: NonNegativeInt = 2, lr: PositiveFloat = 1e-4, batch_size: PositiveInt = 4, seed: int = 0, progress: bool = True, cache_dir: str | None = None,
        source: str = "expert", reason: str = REASON,
    ):
        if demonstrations < 0 or epochs < 0 or batch_size < 1 or lr <= 0:
            raise ValueError("BehaviourCloningWarmup needs demonstrations >= 0, epochs >= 0, batch_size >= 1 and lr > 0")
        if source not in SOURCES:
            raise ValueError(f"BehaviourCloningWarmup source must be one of {', '.join(SOURCES)}, got {source!r}")
        self.source, self.reason = source, reason
        self.demonstrations, self.epochs, self.lr, self.batch_size, self.seed, self.progress = demonstrations, epochs, lr, batch_size, seed, progress
        self.cache_dir = cache_dir
        self.losses: list[float] = []  # warm-up loss per epoch of the last run

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 0 or trainer.ckpt_path is not None or self.demonstrations == 0 or self.epochs == 0:
            return
        losses = self.warm_up_or_load(pl_module, trainer.datamodule, trainer.precision_plugin.forward_context)
        if trainer.logger is not None and trainer.is_global_zero:
            for epoch, loss in enumerate(losses):
                trainer.logger.log_metrics({f"{self.metric_prefix}/loss": loss, f"{self.metric_prefix}/demo_steps": float(self._total_steps)}, step=epoch)

    def demonstrations_for_rank(self, pl_module, datamodule) -> list[Demonstration]:
        """This rank's share of the demonstration episodes, as SFT samples."""
        mine = range(distributed.rank(), self.demonstrations, distributed.world_size())
        seeds = [derive_seed(self.seed, "demo", i) for i in mine]
        return collect_demonstrations(
            datamodule.env_factory, pl_module.tokenizer, datamodule.prompt, seeds, max_steps=datamodule.rollout.max_steps, reason=self.reason, source=self.source, seed=self.seed
        )

    def warm_up(self, pl_module, datamodule, forward_context=contextlib.nullcontext) -> list[float]:
        """Collect demonstrations and fit the LoRA weights; the loss of every epoch.
        ``forward_context``: wraps each forward (the trainer's precision, e.g. autocast)."""
        start = time.perf_counter()
        lm, tokenizer = pl_module.lm, pl_module.tokenizer
        demos = self.demonstrations_for_rank(pl_module, datamodule)
        self._total_steps = int(distributed.sum_across_ranks(len(demos)))
        params = [p for p in lm.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.lr)
        n_batches = distributed.max_across_ranks(-(-len(demos) // self.batch_size))
        enabled = self.shows_progress(datamodule) and distributed.rank() == 0
        progress_line(self.name, self.describe(demos), f"{self.epochs} epoch{'s' * (self.epochs != 1)} of {n_batches} batches",
                      f"collected in {time.perf_counter() - start:.1f} s", enabled=enabled)
        was_training = lm.training
        lm.train()
        self.losses = []
        try:
            with progress_bar("warm-up", self.epochs * n_batches, "batches", enabled) as bar:
                for epoch in range(self.epochs):
                    epoch_start = time.perf_counter()
                    order = list(range(len(demos)))
                    random.Random(derive_seed(self.seed, "demo-shuffle", epoch, distributed.rank())).shuffle(order)
                    total, tokens = 0.0, 0
                    for k in range(n_batches):
                        chunk = [demos[i] for i in order[k * self.batch_size : (k + 1) * self.batch_size]]
                        batch = collate(chunk, tokenizer.pad_token_id) if chunk else distributed.idle_batch(tokenizer.eos_token_id)
                        batch = {key: v.to(pl_module.device) for key, v in batch.items()}
                        n = int(batch["loss_mask"].sum())
                        optimizer.zero_grad(set_to_none=True)
                        for micro, weight in matched_across_ranks(self.split(pl_module, batch)):
                            with forward_context():
                                loss, _ = sft_loss(lm, micro, tokens=n)  # the micro-batch's share of the batch's mean
                            (loss * weight).backward()
                            total += weight * loss.item() * n
                        distributed.average_gradients(params)
                        optimizer.step()
                        tokens += n
                        bar.advance()
                    self.losses.append(distributed.sum_across_ranks(total) / max(distributed.sum_across_ranks(tokens), 1))
                    progress_line(self.name, f"epoch {epoch + 1}/{self.epochs}", f"loss {self.losses[-1]:.3f}", f"{time.perf_counter() - epoch_start:.1f} s", enabled=enabled)
        finally:
            optimizer.zero_grad(set_to_none=True)
            lm.train(was_training)
            pl_module.weights_changed()
        if distributed.rank() == 0:
            print(f"{self.name}: {self.describe(demos)}, {self.epochs} epoch{'s' * (self.epochs != 1)}, loss {' → '.join(f'{x:.3f}' for x in self.losses)} ({time.perf_counter() - start:.1f} s)", flush=True)
        return self.losses

    def shows_progress(self, datamodule) -> bool:
        """Whether this stage shows its progress (a bar on a terminal, lines elsewhere): its own
        ``progress`` and the data module's."""
        return bool(self.progress and getattr(datamodule, "progress", True))

    @staticmethod
    def split(pl_module, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        """``batch`` in the micro-batches of the update's settings (``model.micro_batch_tokens``
        and ``micro_batch_rows``: on a CPU, one unpadded demonstration per forward/backward),
        the same gradients up to float rounding; a batch that fits whole runs as collated."""
        parts = micro_batches(batch, getattr(pl_module, "micro_batch_tokens", None), getattr(pl_module, "micro_batch_rows", None))
        return parts if len(parts) > 1 else [batch]

    def describe(self, demos: list[Demonstration]) -> str:
        """What the SFT was fitted on, for the summary line (this rank's ``demos``)."""
        won = sum(d.won and d.step == 0 for d in demos)
        return f"{self._total_steps} {self.source} steps from {self.demonstrations} episodes (rank 0: {won} of {len(set(d.task_seed for d in demos))} won)"

    def warm_up_or_load(self, pl_module, datamodule, forward_context=contextlib.nullcontext) -> list[float]:
        """:meth:`warm_up`, or with ``cache_dir`` the weights of an earlier warm-up with the same
        settings (saved after training when there is none); the warm-up losses."""
        cached = self.cache_file(pl_module, datamodule)
        if cached is not None and cached.is_file():
            return self.load_cached(pl_module, cached)
        losses = self.warm_up(pl_module, datamodule, forward_context)
        if cached is not None:
            self.save_cached(pl_module, cached)
        return losses

    def cache_file(self, pl_module, datamodule) -> Path | None:
        """Where the warmed-up weights of these settings live in ``cache_dir`` (or ``None``)."""
        if self.cache_dir is None:
            return None
        key = {
            "lm": dataclasses.asdict(pl_module.lm_config),
            "weights_dtype": str(next(pl_module.lm.parameters()).dtype),  # what dtype ``auto`` became here
            "env": datamodule.env_name,
            "env_kwargs": getattr(datamodule, "env_kwargs", {}),
            "prompt": [datamodule.prompt.style, datamodule.prompt.history_length],
            "max_steps": datamodule.rollout.max_steps,
            "warmup": [self.demonstrations, self.epochs, self.lr, self.batch_size, self.seed, self.source, self.reason],
            "world_size": distributed.world_size(),
        }
        trainer = getattr(pl_module, "_trainer", None)
        precision = str(trainer.precision) if trainer is not None else "32-true"
        if precision != "32-true":  # e.g. bf16-mixed trains other weights; absent at 32-true, so older caches still match
            key["precision"] = precision
        start = getattr(pl_module, "init_weights", None)
        if start is not None:  # the weights it starts from (e.g. an RWML stage's); absent otherwise, so older caches still match
            key["init_weights"] = file_digest(start)
        digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]
        name = re.sub(r"[^\w.-]", "_", datamodule.env_name)  # a file name inside cache_dir, whatever the env's name
        return Path(self.cache_dir).expanduser() / f"warmup-{name}-{digest}.pt"

    def save_cached(self, pl_module, path: Path) -> None:
        """The LoRA weights of ``pl_module.lm`` (gathered; written by rank 0) and the losses."""
        state = {k: v for k, v in checkpointing.trainable_state_dict(pl_module).items() if k.startswith("lm.")}
        if distributed.rank() == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            torch.save({"state_dict": state, "losses": self.losses, "demo_steps": self._total_steps}, tmp)
            tmp.replace(path)  # atomic: a concurrent run never reads half a file
            print(f"behaviour-cloning warm-up saved to {path}", flush=True)

    def load_cached(self, pl_module, path: Path) -> list[float]:
        """Load weights saved by :meth:`save_cached` into this model (any sharding); the
        warm-up losses they were trained with."""
        saved = torch.load(path, map_location="cpu", weights_only=True)
        missing = {n for n in checkpointing.trainable_names(pl_module) if n.startswith("lm.")} - set(saved["state_dict"])
        if missing:
            raise ValueError(f"the cached warm-up {path} lacks {len(missing)} of this model's LoRA weights (e.g. {sorted(missing)[0]}); delete it to train again")
        state = saved["state_dict"] if distributed.rank() == 0 or not distributed.is_distributed() else {}
        set_model_state_dict(pl_module, state, options=StateDictOptions(full_state_dict=True, strict=False, broadcast_from_rank0=distributed.is_distributed()))
        self.losses, self._total_steps = list(saved["losses"]), saved["demo_steps"]
        pl_module.weights_changed()
        if distributed.rank() == 0:
            print(f"behaviour-cloning warm-up loaded from {path} (its loss: {' → '.join(f'{x:.3f}' for x in self.losses)})", flush=True)
        return self.losses


"""RWML's data stage (METHODS.md §4): triplets, the filter model and easy-sample subsampling.

At ``on_fit_start`` of a fresh run on the world-model task (``data.env: world_model``, prompt
style ``rwml``): play the source environment (the current policy at temperature 1, or random
admissible actions), turn the steps into triplets, split them 1 − f / f (f = 0.1) and write
``candidates``, ``filter`` and ``eval`` (held-out source tasks) into the task's directory; fit
the filter model (SFT of the LoRA weights on the ``filter`` split, predicting the true o_{t+1});
let it make K predictions per candidate, rewarded at the data-stage τ_d; keep every candidate
that is not easy and an easy one with probability p (``train``); then restore the weights the
fit started with (unless ``start_from_filter``). GRPO on ``train`` is the fit itself.
One process only. The config's ``stages.rwml``; without a terminal each phase prints plain lines
(:func:`~paw_lightning.callbacks.warmup.progress_line`). Logs ``rwml/{triplets,filter_reward_rate,easy_fraction,kept,filter_loss}`` and
``rwml/wrong_copy_reward_rate`` (how often the training reward pays the wrong prediction
"nothing changes"; a warning when it is 50% or more: the embedder cannot tell the states apart).
"""
from __future__ import annotations

import functools
import random
import time

import torch

from paw_lightning.callbacks.warmup import BehaviourCloningWarmup, progress_line
from paw_lightning.demonstrations import Demonstration, collect_demonstrations
from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.envs.world_model import Triplet, WorldModelEnv, write_triplets
from paw_lightning.objectives.rwml import easy_mask, keep_mask
from paw_lightning.ranges import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveFloat, PositiveInt
from paw_lightning.rollout.collector import Collector, derive_seed
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.triplets import random_triplets, triplets_from_trajectories
from paw_lightning.scale import distributed

ACTIONS = ("policy", "random_valid")
BLIND_REWARD = 0.5  # warn when the reward pays a wrong "nothing changes" on this share of changing triplets


def split_factory(datamodule, split: str, **kwargs) -> functools.partial:
    """The data module's world-model environment on another split (and other ``kwargs``)."""
    return functools.partial(datamodule.env_factory.func, **{**datamodule.env_factory.keywords, **kwargs, "split": split})


class RWMLData(BehaviourCloningWarmup):
    """Args:
    tasks: source training tasks played.
    episodes_per_task: N episodes per task.
    eval_tasks: held-out source tasks (one episode each): the ``eval`` split.
    max_steps: step cap of the source episodes.
    actions: ``policy`` (the current model, temperature 1; the paper) or ``random_valid``.
    policy_prompt_style: the source prompt's style (``policy`` actions).
    max_new_tokens: the source policy's response budget.
    filter_fraction: the share of the triplets the filter model is fitted on (paper: 0.1).
    samples: K, the filter model's predictions per candidate (paper: 10).
    tau_d: the data-stage distance threshold (paper: 0.1).
    tau_easy: a candidate is easy when its failure rate is ≤ tau_easy (paper: 0).
    keep_easy: p, the probability an easy candidate is kept (paper: 0.1; 1.0: no subsampling).
    epochs, lr, batch_size, reason: the filter model's SFT.
    start_from_filter: keep the filter model's weights for GRPO (a format warm-up for models
        that do not write ``<next_state>`` yet; the paper's filter is a separate model).
    seed: seeds the tasks, the split, the sampling and the subsampling; default: the data's seed
        (the run's ``seed_everything``), so every seed of a sweep collects its own triplets.
    progress: as for :class:`BehaviourCloningWarmup`.
    """

    name = "RWML filter SFT"
    metric_prefix = "rwml/filter"

    def __init__(
        self, tasks: PositiveInt = 16, episodes_per_task: PositiveInt = 2, eval_tasks: PositiveInt = 8, max_steps: PositiveInt = 8, actions: str = "policy",
        policy_prompt_style: str = "verl", max_new_tokens: PositiveInt = 96, filter_fraction: OpenUnitInterval = 0.1, samples: PositiveInt = 10,
        tau_d: NonNegativeFloat = 0.1, tau_easy: NonNegativeFloat = 0.0, keep_easy: ClosedUnitInterval = 0.1, epochs: NonNegativeInt = 2, lr: PositiveFloat = 1e-4, batch_size: PositiveInt = 4,
        reason: str = "I predict the next observation.", start_from_filter: bool = False, seed: int | None = None, progress: bool = True,
    ):
        super().__init__(demonstrations=1, epochs=epochs, lr=lr, batch_size=batch_size, seed=0 if seed is None else seed, progress=progress, reason=reason)
        self.follows_run_seed = seed is None
        if actions not in ACTIONS:
            raise ValueError(f"RWMLData actions must be one of {', '.join(ACTIONS)}, got {actions!r}")
        if min(tasks, episodes_per_task, eval_tasks, max_steps, samples) < 1 or not 0 < filter_fraction < 1 or not 0 <= keep_easy <= 1:
            raise ValueError("RWMLData needs tasks, episodes_per_task, eval_tasks, max_steps, samples >= 1, 0 < filter_fraction < 1 and 0 <= keep_easy <= 1")
        self.tasks, self.episodes_per_task, self.eval_tasks, self.max_steps = tasks, episodes_per_task, eval_tasks, max_steps
        self.actions, self.policy_prompt_style, self.max_new_tokens = actions, policy_prompt_style, max_new_tokens
        self.filter_fraction, self.samples, self.tau_d, self.tau_easy, self.keep_easy = filter_fraction, samples, tau_d, tau_easy, keep_easy
        self.start_from_filter = start_from_filter
        self.source = "world-model SFT"
        self.stats: dict[str, float] = {}

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != 0 or trainer.ckpt_path is not None:
            return  # a resumed run trains on the triplets its first start wrote
        datamodule = trainer.datamodule
        if not isinstance(datamodule.env_factory(), WorldModelEnv) or datamodule.prompt.style != "rwml":
            raise ValueError("RWMLData needs the world-model task: data.env=world_model and data.rollout.prompt_style=rwml (configs/methods/rwml.yaml sets both)")
        if distributed.world_size() > 1:
            raise ValueError("RWMLData runs in one process: collect the triplets in a single-process fit, then train on them with FSDP (data.env_kwargs.directory)")
        self.stats = self.prepare(pl_module, datamodule, trainer.precision_plugin.forward_context)
        if trainer.logger is not None:
            trainer.logger.log_metrics({f"rwml/{k}": v for k, v in self.stats.items()}, step=0)

    def prepare(self, pl_module, datamodule, forward_context) -> dict[str, float]:
        """Write the splits, fit the filter, subsample; the stage's statistics."""
        start = time.perf_counter()
        if self.follows_run_seed:
            self.seed = datamodule.seed
        wm = datamodule.env_factory()
        shown = self.shows_progress(datamodule)
        progress_line("RWML data", f"playing {self.tasks} source tasks × {self.episodes_per_task} episodes and {self.eval_tasks} held-out tasks",
                      f"{self.actions} actions", enabled=shown)
        triplets, held_out = self.play(pl_module, wm)
        progress_line("RWML data", f"{len(triplets)} triplets, {len(held_out)} held out", f"{time.perf_counter() - start:.1f} s", enabled=shown)
        random.Random(derive_seed(self.seed, "rwml-split")).shuffle(triplets)
        n_filter = max(1, round(self.filter_fraction * len(triplets)))
        if len(triplets) - n_filter < 1 or not held_out:
            raise ValueError(
                f"RWMLData collected {len(triplets)} training and {len(held_out)} held-out triplets: too few to split "
                "(with policy actions only steps with a parsed action count; raise tasks/episodes_per_task or use actions=random_valid)"
            )
        candidates = triplets[n_filter:]
        for name, items in (("filter", triplets[:n_filter]), ("candidates", candidates), ("eval", held_out)):
            write_triplets(wm.directory / f"{name}.jsonl", items)
        initial = {n: p.detach().clone() for n, p in pl_module.lm.named_parameters() if p.requires_grad}
        self.demonstrations, self._filter_factory = n_filter, split_factory(datamodule, "filter")
        losses = self.warm_up(pl_module, datamodule, forward_context)
        rewards = self.filter_rewards(pl_module, datamodule, split_factory(datamodule, "candidates", tau_d=self.tau_d), len(candidates))
        kept = keep_mask(rewards.mean(1), self.tau_easy, self.keep_easy, torch.Generator().manual_seed(derive_seed(self.seed, "rwml-keep")))
        if not kept.any():
            raise ValueError(f"RWMLData: all {len(candidates)} candidates were easy and none was kept (keep_easy={self.keep_easy}): raise keep_easy or tau_d")
        write_triplets(wm.directory / "train.jsonl", [t for t, k in zip(candidates, kept.tolist()) if k])
        if not self.start_from_filter:
            with torch.no_grad():
                for name, param in pl_module.lm.named_parameters():
                    if name in initial:
                        param.copy_(initial[name])
            pl_module.weights_changed()  # an engine that samples from a copy (merged, CTranslate2, vLLM) holds the filter model's
        easy = easy_mask(rewards.mean(1), self.tau_easy).float().mean().item()
        stats = {"triplets": float(len(triplets)), "filter_triplets": float(n_filter), "eval_triplets": float(len(held_out)),
                 "filter_reward_rate": rewards.mean().item(), "easy_fraction": easy, "kept": float(kept.sum()), "filter_loss": losses[-1] if losses else float("nan")}
        blind = wm.wrong_copy_reward_rate(triplets + held_out)
        if blind is not None:
            stats["wrong_copy_reward_rate"] = blind
        print(
            f"RWML data: {len(triplets)} triplets ({n_filter} for the filter, {len(held_out)} held out), filter reward rate "
            f"{stats['filter_reward_rate']:.3f} at τ_d {self.tau_d}, easy {easy:.1%}, kept {int(stats['kept'])} of {len(candidates)} "
            f"in {wm.directory} ({time.perf_counter() - start:.1f} s)", flush=True
        )
        if blind is not None and blind >= BLIND_REWARD:
            print(
                f"warning: RWML's reward (τ_d {wm.tau_d}, embedder {wm.embedder!r}) rewards the wrong prediction 'nothing changes' on "
                f"{blind:.0%} of the triplets whose observation changed: it cannot tell this environment's states apart, so its reward "
                "rate measures the format, not the world model (see val/episode/score, the exact-match rate). Lower data.env_kwargs.tau_d "
                "or set data.env_kwargs.embedder to a sharper embedding model.", flush=True
            )
        return stats

    def play(self, pl_module, wm: WorldModelEnv) -> tuple[list[Triplet], list[Triplet]]:
        """Triplets of the source's training tasks (N episodes each) and of its held-out tasks."""
        factory = make_env_factory(wm.source, **wm.source_kwargs)
        train = [(derive_seed(self.seed, "rwml-task", i), self.episodes_per_task) for i in range(self.tasks)]
        held_out = [(derive_seed(self.seed, "rwml-eval-task", i), 1) for i in range(self.eval_tasks)]
        if self.actions == "random_valid":
            env, rng = factory(), random.Random(derive_seed(self.seed, "rwml-actions"))

            def play(tasks: list[tuple[int, int]]) -> list[Triplet]:
                return [t for seed, n in tasks for _ in range(n) for t in random_triplets(env, seed, rng, self.max_steps, wm.history_length)]

            return play(train), play(held_out)
        prompt = PromptBuilder(wm.source.rsplit(".", 1)[-1], wm.history_length, self.policy_prompt_style)
        results = []
        for k, tasks in enumerate((train, held_out)):
            with EnvPool(factory, len(tasks) * tasks[0][1]) as pool, pl_module.generating():
                collector = Collector(pool, pl_module.sampler(self.max_new_tokens), prompt, self.max_steps, invalid_penalty=0.0)
                trajectories = collector.collect(list(enumerate(s for s, _ in tasks)), tasks[0][1], 1.0, derive_seed(self.seed, "rwml-play", k), "RWML data", self.progress)
            results.append(triplets_from_trajectories(trajectories, wm.history_length))
        return results[0], results[1]

    def demonstrations_for_rank(self, pl_module, datamodule) -> list[Demonstration]:
        """The filter model's SFT samples: every ``filter`` triplet with its true next observation."""
        return collect_demonstrations(self._filter_factory, pl_module.tokenizer, datamodule.prompt, list(range(self.demonstrations)), max_steps=1, reason=self.reason)

    def describe(self, demos: list[Demonstration]) -> str:
        return f"{self._total_steps} triplets with their true next observation"

    def filter_rewards(self, pl_module, datamodule, factory, n: int, chunk: int = 16) -> torch.Tensor:
        """(n, K) rewards of the filter model's K predictions per candidate (temperature 1)."""
        k = self.samples
        rows: list[list[float]] = []
        start, shown = time.perf_counter(), self.shows_progress(datamodule)
        with EnvPool(factory, min(n, chunk) * k) as pool, pl_module.generating():
            collector = Collector(pool, pl_module.sampler(datamodule.rollout.max_new_tokens), datamodule.prompt, 1, invalid_penalty=0.0)
            for first in range(0, n, chunk):
                tasks = [(i, i) for i in range(first, min(n, first + chunk))]
                trajectories = collector.collect(tasks, k, 1.0, derive_seed(self.seed, "rwml-filter", first), f"RWML filter {first}/{n}", self.progress)
                rows += [[sum(s.reward for s in t.steps) for t in trajectories[j * k : (j + 1) * k]] for j in range(len(tasks))]
                progress_line("RWML data", f"filter predictions for {len(rows)}/{n} candidates ({k} each)", f"{time.perf_counter() - start:.1f} s", enabled=shown)
        return torch.tensor(rows, dtype=torch.float32).reshape(n, k)

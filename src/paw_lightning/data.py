"""RolloutDataModule: regenerates on-policy data every epoch (one epoch = one RL iteration).

``train_dataloader`` (every epoch) plays this rank's share of ``rollout.groups ×
rollout.group_size`` episodes with the current policy, turns every step into a sample, keeps
them as ``played["train"]`` (:class:`~paw_lightning.rollout.played.PlayedEpisodes`) and
yields ``ppo_epochs`` passes of shuffled mini-batches over them; the module prepares the
update from ``played["train"]`` before the first batch (``PaWModule.on_train_epoch_start``).
Validation and test play fixed held-out tasks when their loader is iterated, i.e. with the
weights of that moment (``played["val"]`` / ``played["test"]``). Rank r plays groups
``[r·n, (r+1)·n)``, and every rank yields the same number of batches (FSDP2, DDP). DAPO's
rollout settings: dynamic sampling plays more rounds of groups (the same number on every
rank, :mod:`~paw_lightning.rollout.dynamic_sampling`), the soft overlong punishment shapes the
rewards (:mod:`~paw_lightning.rollout.overlong`), and ``mask_truncated`` takes responses cut
by the budget out of the policy loss.

Data flows one way: this module uses the model only through :class:`Policy` (generation), runs
no training computation and reads nothing back from the module.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, IterableDataset

from paw_lightning.envs import EnvPool, check_env_config, make_env_factory, tagged_env_kwargs
from paw_lightning.evaluation import eval_plan
from paw_lightning.ranges import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, NonPositiveFloat, PositiveInt
from paw_lightning.rollout.collector import Collector, Trajectory, derive_seed
from paw_lightning.rollout import overlong
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.dream.lm import PolicyActor, WorldModelPredictor
from paw_lightning.rollout.dream.measures import DreamRecords
from paw_lightning.rollout.dream.play import dream_evaluation
from paw_lightning.rollout.dream.settings import DreamSettings
from paw_lightning.rollout.dynamic_sampling import DynamicSampling, sample_groups
from paw_lightning.rollout.failures import check_failures
from paw_lightning.rollout.engine import GenerationEngine
from paw_lightning.fixed_set import SOURCES as FIXED_SOURCES, FixedSet, FixedSetSettings, build_source, has_expert, note, opened, scripted_trajectories
from paw_lightning.rollout.played import FixedSamples, PlayedEpisodes
from paw_lightning.rollout.prompts import EpisodeState, PromptBuilder
from paw_lightning.rollout.samples import RolloutBuffer, build_buffer
from paw_lightning.scale import distributed


class Policy(Protocol):
    """What the data module uses of the model (``PaWModule``): generation, and the two facts
    that shape a sample."""

    tokenizer: Any

    def sampler(self, max_new_tokens: int, token_stats: bool = False) -> GenerationEngine: ...

    def generating(self) -> AbstractContextManager: ...

    @property
    def records_token_stats(self) -> bool:
        """Whether training rollouts record the sampler's log-probs and entropies."""

    @property
    def trains_world_model(self) -> bool:
        """Whether samples carry the next-observation segment."""

    def weights_digest(self) -> str:
        """A digest of the weights the policy samples with (names the start policy's fixed set)."""


@dataclass
class RolloutSettings:
    """How training episodes are played and turned into samples (``data.rollout``).

    Args:
        groups: task groups per update (all ranks together).
        group_size: G, episodes per task.
        max_steps: episode cap (also of validation and test episodes).
        max_new_tokens: response budget per step.
        temperature: sampling temperature of training rollouts.
        history_length: K, previous (observation, action) pairs in the prompt.
        prompt_style: ``verl`` (METHODS.md §1), ``compact`` (fewer tokens, same format) or
            ``spa`` (SPA's format, the action in ``<answer>``); see :mod:`paw_lightning.rollout.prompts`.
        invalid_penalty: reward added on a step whose response has no well-formed action tag.
        max_obs_tokens: observation tokens kept in the world-model segment.
        mask_truncated: a response cut by ``max_new_tokens`` (no stop string, no end-of-turn
            token within the budget) gets no policy loss: its action tokens leave the policy
            loss's mask (DAPO's overlong filtering; the world-model segment still trains).
        overlong_buffer: L_cache of DAPO's soft overlong punishment: a training response longer
            than ``max_new_tokens − overlong_buffer`` tokens gets the reward
            ``overlong_penalty_factor · (max_new_tokens − overlong_buffer − |y|) / overlong_buffer``
            on its step (:mod:`paw_lightning.rollout.overlong`); 0: off.
        overlong_penalty_factor: the punishment at the full budget (−factor).
        dynamic_sampling: keep only task groups whose returns differ, playing more groups
            until the update holds ``groups`` of them (DAPO;
            :mod:`paw_lightning.rollout.dynamic_sampling`).
    """

    groups: PositiveInt = 4
    group_size: PositiveInt = 4
    max_steps: PositiveInt = 8
    max_new_tokens: PositiveInt = 96
    temperature: NonNegativeFloat = 1.0
    history_length: NonNegativeInt = 2
    prompt_style: str = "verl"
    invalid_penalty: NonPositiveFloat = -0.1
    max_obs_tokens: PositiveInt = 512
    mask_truncated: bool = False
    overlong_buffer: NonNegativeInt = 0
    overlong_penalty_factor: NonNegativeFloat = 1.0
    dynamic_sampling: DynamicSampling = field(default_factory=DynamicSampling)


@dataclass
class EvaluationSettings:
    """The held-out episodes of validation and test (``data.evaluation``).

    Args:
        groups: held-out validation tasks.
        group_size: episodes per task (validation and test).
        test_groups: held-out test tasks (``test`` subcommand).
        temperature: sampling temperature of validation and test rollouts.
        batch_size: samples per forward of the world-model metrics.
        env_kwargs: overrides of ``data.env_kwargs`` for validation and test episodes, e.g.
            ``{split: eval_in_distribution}`` for ALFWorld's held-out games.
        dream: the world model as a simulator (``<split>/dream/*``, docs/reference/dream.md):
            ``{horizon: 4, tasks: 8}``; off by default (``tasks: 0``).
        fixed: the fixed held-out transitions that every validation and test scores the world
            model on (``<split>/wm_fixed/<source>/*``, :mod:`paw_lightning.fixed_set`);
            ``null``: none.
    """

    groups: PositiveInt = 8
    group_size: PositiveInt = 1
    test_groups: PositiveInt = 32
    temperature: NonNegativeFloat = 0.4
    batch_size: PositiveInt = 8
    env_kwargs: dict[str, Any] | None = None
    dream: DreamSettings = field(default_factory=DreamSettings)
    fixed: FixedSetSettings | None = field(default_factory=FixedSetSettings)


def check_env_settings(env: str, env_kwargs: dict | None, evaluation_env_kwargs: dict | None, build: bool = True) -> None:
    """``data.env``'s arguments for training (``data.env_kwargs``) and for validation and test
    (those overridden by ``data.evaluation.env_kwargs``), each error naming its key
    (:func:`~paw_lightning.envs.check_env_config`; ``build``: also build a registered
    environment with them). The CLI calls it while parsing: the types before the input files are
    read (their checks name the file), the construction after; the data module again, for a
    module built in Python."""
    check_env_config(env, [("data.env_kwargs", env_kwargs), ("data.evaluation.env_kwargs", evaluation_env_kwargs)], build)


class RolloutDataModule(LightningDataModule):
    """Args:
    env: environment name (``frozenlake``, ``sokoban``, ``sudoku``, ``alfworld``, ``webshop``, ``search_qa``) or dotted path to a TextEnv class.
    env_kwargs: keyword arguments of the environment's constructor.
    rollout: how training episodes are played (:class:`RolloutSettings`).
    evaluation: the held-out episodes of validation and test (:class:`EvaluationSettings`).
    ppo_epochs: passes over the update's samples.
    mini_batch_size: samples per optimizer step, all ranks together (each rank takes its share).
    env_workers: environment worker processes (0: step in this process).
    env_timeout: seconds a worker may take to answer one batched reset or step; a silent worker
        is killed and replaced, its episodes end failed (``env_error_rate``). Needs env_workers >= 1.
    max_failed_share: a rollout (training, validation or test; all ranks together) in which more
        than this share of the episodes failed in the environment, or every one, stops the run
        with the environment's own error (:mod:`paw_lightning.rollout.failures`); below it the
        failed episodes are counted (``env_error_rate``) and the run goes on.
    seed: seeds task selection and sampling; default: the run's ``seed_everything``.
    progress: show the rollout progress bar.
    """

    def __init__(
        self,
        env: str = "frozenlake",
        env_kwargs: dict[str, Any] | None = None,
        rollout: RolloutSettings = RolloutSettings(),
        evaluation: EvaluationSettings = EvaluationSettings(),
        ppo_epochs: int = 1,
        mini_batch_size: int = 16,
        env_workers: int = 0,
        env_timeout: float | None = None,
        max_failed_share: ClosedUnitInterval = 0.5,
        seed: int | None = None,
        progress: bool = True,
    ):
        super().__init__()
        # copies: the default instances are shared by every call
        rollout = rollout if rollout is not None else RolloutSettings()
        self.rollout = rollout = dataclasses.replace(rollout, dynamic_sampling=dataclasses.replace(rollout.dynamic_sampling))
        self.evaluation = evaluation = dataclasses.replace(evaluation) if evaluation is not None else EvaluationSettings()
        if evaluation.fixed is not None:
            evaluation.fixed = dataclasses.replace(evaluation.fixed)
        positive = {"rollout.groups": rollout.groups, "rollout.group_size": rollout.group_size, "rollout.max_steps": rollout.max_steps,
                    "evaluation.groups": evaluation.groups, "evaluation.group_size": evaluation.group_size, "ppo_epochs": ppo_epochs, "mini_batch_size": mini_batch_size}
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"data.{name} must be at least 1 (got {value})")
        rollout.dynamic_sampling.check(rollout.group_size)
        overlong.check(rollout.max_new_tokens, rollout.overlong_buffer, rollout.overlong_penalty_factor)
        self.env_kwargs = dict(env_kwargs or {})
        check_env_settings(env, self.env_kwargs, evaluation.env_kwargs)
        self.env_factory = make_env_factory(env, **self.env_kwargs)
        self.eval_env_factory = make_env_factory(env, **{**self.env_kwargs, **(evaluation.env_kwargs or {})})
        self.env_name = env.rsplit(".", 1)[-1]
        self.max_return: float | None = getattr(self.env_factory.func, "max_return", None)
        self.prompt = PromptBuilder(self.env_name, rollout.history_length, rollout.prompt_style)  # renders h_t (rollouts and warm-up)
        self.ppo_epochs, self.mini_batch_size = ppo_epochs, mini_batch_size
        if env_timeout is not None and (env_timeout <= 0 or env_workers < 1):
            raise ValueError(f"data.env_timeout={env_timeout} needs a positive number of seconds and data.env_workers >= 1 "
                             "(an environment stepping in the training process cannot be interrupted)")
        self.env_workers, self.env_timeout, self.progress = env_workers, env_timeout, progress
        self.max_failed_share = max_failed_share
        self._seed = seed
        self.pools: dict[str, EnvPool] = {}  # "train" and "eval", built on first use
        self.played: dict[str, PlayedEpisodes] = {}  # the latest episodes of each split: this module's output
        self.fixed: dict[str, FixedSet] = {}  # each split's fixed held-out transitions (kept in checkpoints)
        fixed = evaluation.fixed
        if fixed is not None and fixed.sources is not None and "expert" in fixed.sources and not has_expert(self.eval_env_factory):
            raise ValueError(f"data.evaluation.fixed.sources: the {self.env_name} environment has no expert (walkthrough() or solve()); "
                             f"choose from {', '.join(s for s in FIXED_SOURCES if s != 'expert')}")

    @property
    def seed(self) -> int:
        return self._seed if self._seed is not None else int(os.environ.get("PL_GLOBAL_SEED", 0))

    # ------------------------------------------------------------ lifecycle
    def _pool(self, kind: str) -> EnvPool:
        if kind not in self.pools:
            ev = self.evaluation
            factory, groups, size = (
                (self.env_factory, self._train_pool_groups(), self.rollout.group_size) if kind == "train" else (self.eval_env_factory, max(ev.groups, ev.test_groups), ev.group_size)
            )
            self.pools[kind] = EnvPool(factory, groups * size, num_workers=self.env_workers, timeout=self.env_timeout)
        return self.pools[kind]

    def _train_pool_groups(self) -> int:
        """Task groups the training pool holds: every rank's groups, or one rank's largest round
        of dynamic sampling if that is more."""
        sampling = self.rollout.dynamic_sampling
        per_round = sampling.round_size(len(self._my_groups(self.rollout.groups))) if sampling.enabled else 0
        return max(self.rollout.groups, per_round)

    def teardown(self, stage: str) -> None:
        for pool in self.pools.values():
            pool.close()
        self.pools = {}

    # ------------------------------------------------------------- training
    def train_dataloader(self) -> DataLoader:
        if self._fit_is_over():  # Lightning asks for the data even then: no rollout for it
            return DataLoader([], batch_sampler=[])
        epoch = self.trainer.current_epoch
        if epoch == 0 and self.trainer.global_step == 0 and self.evaluation.fixed is not None:  # RL starts: every stage has run
            for split in ("val", "test"):
                if split not in self.fixed:  # not restored from a checkpoint
                    self.fixed[split] = self._build_fixed_set(split)
        played = self.played["train"] = self._play_train(epoch)
        batches = []
        for k in range(self.ppo_epochs):
            order = torch.randperm(len(played.samples), generator=torch.Generator().manual_seed(derive_seed(self.seed, "shuffle", epoch, k)))
            batches += self._split(order.tolist(), max(1, self.mini_batch_size // distributed.world_size()))
        return self._loader(played.samples, batches)

    # ----------------------------------------------------------- evaluation
    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val", self.evaluation.groups)

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test", self.evaluation.test_groups)

    def eval_plan(self, split: str) -> dict:
        """What an evaluation of ``split`` (``val`` / ``test``) plays (:func:`paw_lightning.evaluation.eval_plan`)."""
        groups = self.evaluation.groups if split == "val" else self.evaluation.test_groups
        env_kwargs = {**tagged_env_kwargs(self.eval_env_factory), **(getattr(self.eval_env_factory, "keywords", {}) or {})}
        return eval_plan(split, self.env_name, env_kwargs, groups, self.evaluation.group_size, self.evaluation.temperature, self.rollout.max_steps, self.seed)

    def _eval_loader(self, split: str, groups: int) -> DataLoader:
        self._my_groups(groups)  # a bad number of groups fails here, not mid-evaluation
        if self.evaluation.dream.enabled:
            self._my_groups(self.evaluation.dream.tasks)
        return DataLoader(_EvalEpisodes(self, split, groups), batch_size=None)

    def play_eval(self, split: str, groups: int) -> RolloutBuffer:
        """Play this rank's share of the held-out tasks with the current policy; keeps them as
        ``played[split]`` and returns their samples."""
        tasks = [(g, derive_seed(split, g)) for g in self._my_groups(groups)]
        played = self._play(split, tasks, self.evaluation.group_size, self.evaluation.temperature, derive_seed(self.seed, split, distributed.rank()), split)
        played.plan = self.eval_plan(split)
        played.fixed = self._fixed_samples(split)
        self.played[split] = played
        if self.evaluation.dream.enabled:
            played.dream = self._dream(split, played)
            played.plan["dream"] = {"horizon": self.evaluation.dream.horizon, "tasks": self.evaluation.dream.tasks}
        return played.samples

    def _dream(self, split: str, played: PlayedEpisodes) -> DreamRecords:
        """This rank's dream evaluation (:mod:`paw_lightning.rollout.dream`): k-step fidelity along
        the episodes just played, one imagined episode per task of its share of
        ``evaluation.dream.tasks`` (the split's tasks 0, 1, …) and its replay."""
        settings, policy = self.evaluation.dream, self.policy
        mine = self._my_groups(settings.tasks)
        if "dream" not in self.pools:
            self.pools["dream"] = EnvPool(self.eval_env_factory, len(mine), num_workers=self.env_workers, timeout=self.env_timeout)
        engine = policy.sampler(self.rollout.max_new_tokens)
        stops = self.prompt.stop_strings
        act = PolicyActor(engine, self.evaluation.temperature, derive_seed(self.seed, split, "dream", distributed.rank()), stops[0] if len(stops) == 1 else tuple(stops))
        with policy.generating():
            return dream_evaluation(self.pools["dream"], [derive_seed(split, g) for g in mine], played.trajectories, act,
                                    WorldModelPredictor(engine, policy.tokenizer), Judge.for_env(self.eval_env_factory), self.prompt, settings.horizon)

    # ------------------------------------------------------ fixed held-out set
    def _fixed_samples(self, split: str) -> FixedSamples | None:
        """This rank's share of ``split``'s fixed transitions (``None`` with ``data.evaluation.fixed:
        null``). A set neither built when RL started (:meth:`train_dataloader`) nor restored from
        a checkpoint (a ``validate`` or ``test`` of weights without one) is built now."""
        settings = self.evaluation.fixed
        if settings is None:
            return None
        if split not in self.fixed:
            self.fixed[split] = self._build_fixed_set(split)
            starting = self.trainer.state.fn == "fit" and self.trainer.global_step == 0
            if not starting and "start_policy" in self.fixed[split].sources and distributed.rank() == 0:
                note(f"no stored {split} set: its start_policy transitions are played by the weights evaluated now")
        rank, world = distributed.rank(), distributed.world_size()
        buffers = {source: build_buffer(trajectories[rank::world], self.policy.tokenizer, self.rollout.max_obs_tokens)
                   for source, trajectories in self.fixed[split].sources.items()}
        return FixedSamples(buffers, self.evaluation.batch_size, settings.predict)

    def _build_fixed_set(self, split: str) -> FixedSet:
        settings, policy = self.evaluation.fixed, self.policy
        explicit = settings.sources is not None
        sources = settings.sources or [s for s in FIXED_SOURCES if s != "expert" or has_expert(self.eval_env_factory)]
        identity = self._fixed_identity(split)
        started = time.perf_counter()
        trajectories, keys = {}, {}
        for source in sources:
            own = identity if source != "start_policy" else {**identity, "temperature": self.evaluation.temperature,
                                                              "max_new_tokens": self.rollout.max_new_tokens, "weights": policy.weights_digest()}
            played, key = build_source(split, source, settings, own, lambda source_, seeds: self._play_fixed(split, source_, seeds))
            if played:
                trajectories[source], keys[source] = played, key
            elif explicit:
                raise ValueError(f"data.evaluation.fixed: the {source} source played no transition on the {split} tasks "
                                 f"(the {self.env_name} environment lists no admissible actions)")
        fixed = FixedSet(split, trajectories, keys)
        if self.progress and distributed.rank() == 0:
            counts = ", ".join(f"{s} {fixed.transitions(s)}" for s in fixed.sources)
            note(f"{split}: {counts} transitions ({time.perf_counter() - started:.1f} s)")
        return fixed

    def _fixed_identity(self, split: str) -> dict:
        """What determines every source's transitions of ``split`` besides the source's own
        settings: environment, step cap, tokenizer and the rendered first prompt of task 0 (so
        that a change to the prompt or the environment's text makes new transitions)."""
        with opened(self.eval_env_factory, f"the {split} fixed held-out set") as env:
            obs, info = env.reset(derive_seed(split, 0), 0)
            first_prompt = self.prompt.render(EpisodeState.start(obs, info))
        tokenizer = self.policy.tokenizer
        return {"env": self.env_name, "env_kwargs": self.eval_plan(split)["env_kwargs"], "max_steps": self.rollout.max_steps,
                "tokenizer": [tokenizer.name_or_path, len(tokenizer)], "first_prompt": first_prompt}

    def _play_fixed(self, split: str, source: str, task_seeds: list[int]) -> list[Trajectory]:
        """Play one source of the fixed set on ``task_seeds``: the scripted ones in this process,
        the start policy on this rank's share of the tasks (then every rank's episodes are
        gathered, so every rank holds the whole set)."""
        settings, policy = self.evaluation.fixed, self.policy
        if source != "start_policy":
            with opened(self.eval_env_factory, f"the {split} fixed held-out set ({source})") as env:
                return scripted_trajectories(env, policy.tokenizer, self.prompt, task_seeds, source, settings.seed, self.rollout.max_steps)
        mine = self._my_groups(len(task_seeds))
        if "fixed" not in self.pools:
            self.pools["fixed"] = EnvPool(self.eval_env_factory, len(mine), num_workers=self.env_workers, timeout=self.env_timeout)
        collector = Collector(self.pools["fixed"], policy.sampler(self.rollout.max_new_tokens), self.prompt, self.rollout.max_steps, self.rollout.invalid_penalty)
        with policy.generating():
            played = collector.collect([(g, task_seeds[g]) for g in mine], 1, self.evaluation.temperature,
                                       derive_seed(settings.seed, "fixed", split, "start_policy", distributed.rank()), f"fixed set: start policy ({split})", progress=self.progress)
        return sorted((t for every in distributed.gather_objects(played) for t in every), key=lambda t: t.group_id)

    def state_dict(self) -> dict:
        """The fixed held-out sets travel in every checkpoint (plain Python values)."""
        return {"fixed": {split: fixed.state() for split, fixed in self.fixed.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.fixed = {split: FixedSet.from_state(state) for split, state in state_dict.get("fixed", {}).items()}

    # -------------------------------------------------------------- helpers
    @property
    def policy(self) -> Policy:
        return self.trainer.lightning_module

    def _play(self, split: str, tasks, group_size, temperature, seed, description) -> PlayedEpisodes:
        """Episodes of ``tasks`` with the current policy, and their samples."""
        started = time.perf_counter()
        trajectories = self._episodes(split, tasks, group_size, temperature, seed, description)
        return self._played(split, trajectories, trajectories, started)

    def _play_train(self, epoch: int) -> PlayedEpisodes:
        """This rank's groups of RL iteration ``epoch``: its share of ``rollout.groups`` or, with
        dynamic sampling, the groups with differing returns of as many rounds as it takes (the
        same number on every rank), after the soft overlong punishment if it is on (so that
        dynamic sampling judges the final returns); with ``mask_truncated`` the truncated
        responses leave the policy loss's mask."""
        rollout, rank, started = self.rollout, distributed.rank(), time.perf_counter()
        rounds: list[list[Trajectory]] = []

        def play_round(round_: int, groups: list[int]) -> list[Trajectory]:
            tasks = [(g, derive_seed(self.seed, "train", epoch, g)) for g in groups]
            seed = derive_seed(self.seed, "sample", epoch, rank) if round_ == 0 else derive_seed(self.seed, "sample", epoch, rank, round_)
            description = f"rollout {epoch}" + (f" (extra round {round_})" if round_ else "")
            trajectories = self._episodes("train", tasks, rollout.group_size, rollout.temperature, seed, description)
            if rollout.overlong_buffer:
                overlong.punish_overlong(trajectories, rollout.max_new_tokens, rollout.overlong_buffer, rollout.overlong_penalty_factor)
            rounds.append(trajectories)
            return trajectories

        mine = self._my_groups(rollout.groups)
        metrics: dict[str, float] = {}
        if rollout.dynamic_sampling.enabled:
            trajectories, every, metrics = sample_groups(play_round, mine, rollout.groups, rollout.dynamic_sampling)
        else:
            trajectories = every = play_round(0, list(mine))
        played = self._played("train", trajectories, every, started, metrics)
        if rollout.dynamic_sampling.enabled:
            played.first_round = rounds[0]
        if rollout.mask_truncated:
            played.samples.no_policy_loss = played.samples.truncated.clone()
        played.metrics.update(overlong.metrics(trajectories, rollout.max_new_tokens, rollout.overlong_buffer, rollout.overlong_penalty_factor, rollout.mask_truncated))
        return played

    def _episodes(self, split: str, tasks, group_size, temperature, seed, description) -> list[Trajectory]:
        """Play ``tasks`` (group id, task seed) × ``group_size`` episodes with the current policy."""
        policy, train = self.policy, split == "train"
        engine = policy.sampler(self.rollout.max_new_tokens, token_stats=train and policy.records_token_stats)
        collector = Collector(self._pool("train" if train else "eval"), engine, self.prompt, self.rollout.max_steps, self.rollout.invalid_penalty)
        with policy.generating():
            trajectories = collector.collect(tasks, group_size, temperature, seed, description, progress=self.progress)
        check_failures(trajectories, self.max_failed_share, description)
        return trajectories

    def _played(self, split: str, trajectories: list[Trajectory], every: list[Trajectory], started: float, metrics: dict | None = None) -> PlayedEpisodes:
        """The samples of ``trajectories``; the time since ``started`` and the response tokens
        of ``every`` episode played for them (dynamic sampling plays more than it keeps)."""
        policy, train = self.policy, split == "train"
        seconds = time.perf_counter() - started
        samples = build_buffer(trajectories, policy.tokenizer, self.rollout.max_obs_tokens, world_model=not train or policy.trains_world_model)
        tokens = sum(len(step.response_ids) for traj in every for step in traj.steps)
        return PlayedEpisodes(split, self.trainer.current_epoch, trajectories, samples, started, seconds, tokens, self.max_return, metrics=dict(metrics or {}))

    @staticmethod
    def _my_groups(groups: int) -> range:
        world = distributed.world_size()
        if groups % world:
            raise ValueError(f"{groups} groups cannot be shared evenly by {world} ranks: make the number of groups a multiple of the world size")
        per_rank = groups // world
        return range(distributed.rank() * per_rank, (distributed.rank() + 1) * per_rank)

    @staticmethod
    def _split(indices: list[int], batch_size: int) -> list[list[int]]:
        """Split into the same number of non-empty chunks on every rank: as many as the rank
        with the most samples needs, but never more than the rank with the fewest has."""
        n = distributed.max_across_ranks(math.ceil(len(indices) / batch_size))
        n = min(n, distributed.min_across_ranks(len(indices)))
        return [chunk.tolist() for chunk in torch.tensor(indices, dtype=torch.long).tensor_split(n)] if n else []

    def _fit_is_over(self) -> bool:
        """Whether the fit has no update left: ``fit --trainer.max_epochs=0`` (e.g. the warm-up or
        SPA's stages alone), or a resume of a finished run."""
        trainer = self.trainer
        epochs_done = trainer.max_epochs is not None and 0 <= trainer.max_epochs <= trainer.current_epoch
        return epochs_done or 0 <= trainer.max_steps <= trainer.global_step

    @staticmethod
    def _loader(buffer: RolloutBuffer, batches: list[list[int]]) -> DataLoader:
        return DataLoader(range(len(buffer)), batch_sampler=batches, collate_fn=buffer.collate)


class _EvalEpisodes(IterableDataset):
    """Validation / test batches of episodes played when iteration starts (every evaluation);
    every rank yields the same number of batches. The samples go into batches by length, so
    that a batch's right padding (to its longest sample) stays small: the metrics are sums over
    tokens, so the grouping changes none of them."""

    def __init__(self, datamodule: RolloutDataModule, split: str, groups: int):
        self.datamodule, self.split, self.groups = datamodule, split, groups

    def __iter__(self):
        dm = self.datamodule
        buffer = dm.play_eval(self.split, self.groups)
        by_length = sorted(range(len(buffer)), key=lambda i: buffer.input_ids[i].numel())
        for indices in dm._split(by_length, dm.evaluation.batch_size):
            yield buffer.collate(indices)

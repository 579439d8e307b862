"""SPA's self-play world-model SFT before RL (METHODS.md §5).

At ``on_fit_start`` of a fresh run (``stages.self_play``: after ``stages.warmup``, e.g. a format warm-up)
the current policy plays ``episodes`` training tasks with SPA's prompt (``data.rollout.prompt_style:
spa``); every step whose response has SPA's ``<observation>``/``<prediction>`` spans and an
``<answer>`` becomes an SFT sample with the beliefs replaced by the true states o_t, o_{t+1}
(:func:`paw_lightning.rollout.spa.with_true_states`; the answer normalised to the parsed action),
and the LoRA weights are fitted to them as the behaviour-cloning warm-up fits demonstrations
(cross-entropy on the response, the prompt masked; its own AdamW). Logs ``spa/loss`` per epoch.
"""
from __future__ import annotations

from paw_lightning.callbacks.warmup import BehaviourCloningWarmup, progress_line
from paw_lightning.demonstrations import Demonstration, demonstration
from paw_lightning.envs import EnvPool
from paw_lightning.ranges import NonNegativeInt, PositiveFloat, PositiveInt
from paw_lightning.rollout.collector import Collector, derive_seed
from paw_lightning.rollout.spa import with_true_states
from paw_lightning.scale import distributed


class SelfPlaySFT(BehaviourCloningWarmup):
    """Args:
    episodes: self-play episodes on training tasks (all ranks together).
    epochs: passes over the rewritten steps (paper: about 5).
    lr: AdamW learning rate (paper: 1e-4).
    batch_size: steps per optimizer step and rank.
    seed: seeds the task choice, the sampling and the shuffling; default: the data's seed (the
        run's ``seed_everything``), so every seed of a sweep plays its own self-play episodes
        (the format warm-up before it is shared by all seeds on purpose: its seed is fixed).
    progress: show a rich progress bar on a terminal, plain lines elsewhere (rank 0).
    """

    name = "self-play SFT"
    metric_prefix = "spa"

    def __init__(self, episodes: PositiveInt = 16, epochs: NonNegativeInt = 5, lr: PositiveFloat = 1e-4, batch_size: PositiveInt = 4, seed: int | None = None, progress: bool = True):
        super().__init__(demonstrations=episodes, epochs=epochs, lr=lr, batch_size=batch_size, seed=0 if seed is None else seed, progress=progress)
        self.source = "self-play"
        self.follows_run_seed = seed is None

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.datamodule.prompt.style != "spa":
            raise ValueError("SelfPlaySFT needs SPA's response format: set data.rollout.prompt_style=spa (configs/methods/spa.yaml does)")
        super().on_fit_start(trainer, pl_module)

    def demonstrations_for_rank(self, pl_module, datamodule) -> list[Demonstration]:
        """This rank's share of the self-play episodes, played by the current policy and
        rewritten with the true states (a collective: every rank plays)."""
        if self.follows_run_seed:  # before the fit's shuffling reads it too
            self.seed = datamodule.seed
        mine = range(distributed.rank(), self.demonstrations, distributed.world_size())
        tasks = [(i, derive_seed(self.seed, "self-play", i)) for i in mine]
        rollout = datamodule.rollout
        progress_line(self.name, f"playing {self.demonstrations} episodes with the current policy", enabled=self.shows_progress(datamodule))
        with EnvPool(datamodule.env_factory, max(len(tasks), 1)) as pool:
            collector = Collector(pool, pl_module.sampler(rollout.max_new_tokens), datamodule.prompt, rollout.max_steps, invalid_penalty=0.0)
            with pl_module.generating():
                trajectories = collector.collect(tasks, 1, rollout.temperature, derive_seed(self.seed, "self-play-sample", distributed.rank()), progress=False)
        demos, steps = [], 0
        tokenizer = pl_module.tokenizer
        for traj in trajectories:
            for t, step in enumerate(traj.steps):
                steps += 1
                rewritten = with_true_states(step.response, step.observation, step.next_observation)
                if rewritten is None or step.action is None:
                    continue
                response = rewritten[: rewritten.index("<answer>")] + f"<answer>{step.action}</answer>"
                prompt = tokenizer.decode(step.prompt_ids, skip_special_tokens=True)
                demos.append(demonstration(tokenizer, step.prompt_ids, prompt, response, step.action, "answer", traj.task_seed, t))
        if distributed.sum_across_ranks(len(demos)) == 0:  # the same answer on every rank
            raise ValueError(
                f"self-play SFT: none of the policy's {int(distributed.sum_across_ranks(steps))} responses used SPA's format "
                "(<observation>, <prediction>, <answer>): start from a policy that follows it, e.g. a BehaviourCloningWarmup "
                "as stages.warmup, which runs before stages.self_play (with prompt_style spa its demonstrations are in SPA's format)"
            )
        return demos

"""A config's module, data, warm-up and training rollout, built as ``fit`` builds them, for the
benchmarks that time one phase of an RL iteration (``wm_overhead.py``, ``prefix_sharing.py``)."""
from __future__ import annotations

import argparse
from pathlib import Path

from paw_lightning.callbacks import BehaviourCloningWarmup
from paw_lightning.cli import PawCLI
from paw_lightning.envs import EnvPool
from paw_lightning.model import default_cache_dir
from paw_lightning.rollout.collector import Collector, derive_seed


def add_run_arguments(parser: argparse.ArgumentParser, config: Path) -> None:
    """The arguments :func:`build` and :func:`warm_up` read; any other argument goes to the CLI."""
    parser.add_argument("--config", type=Path, default=config, help=f"the run's config (default: {config.name})")
    parser.add_argument("--model", default="embedded", help="model.lm.name_or_path (default: embedded)")
    parser.add_argument("--warmup", type=int, default=0, help="expert episodes of a BC warm-up before the rollout, instead of the config's (0: the config's, if any)")
    parser.add_argument("--groups", type=int, help="override data.rollout.groups of the config")
    parser.add_argument("--group-size", type=int, help="override data.rollout.group_size")
    parser.add_argument("--max-steps", type=int, help="override data.rollout.max_steps")
    parser.add_argument("--threads", type=int, help="torch threads (default: the CLI's threads: auto)")


def build(args, workdir: Path):
    """The config's module (model loaded, trainer attached for its precision), data module and
    trainer, as ``fit`` builds them; ``--groups`` / ``--group-size`` / ``--max-steps`` and the
    extra CLI arguments (``args.extra``) applied."""
    argv = ["-c", str(args.config), f"--model.lm.name_or_path={args.model}", "--data.progress=false", "--trainer.enable_progress_bar=false",
            f"--trainer.default_root_dir={workdir / 'runs'}", f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}"]
    overrides = {"groups": args.groups, "group_size": args.group_size, "max_steps": args.max_steps}
    argv += [f"--data.rollout.{key}={value}" for key, value in overrides.items() if value is not None]
    if args.threads:
        argv.append(f"--threads={args.threads}")  # else the CLI's choice: one per core other processes leave free
    cli = PawCLI(args=argv + args.extra, run=False)
    module, data = cli.model, cli.datamodule
    module.trainer = cli.trainer  # forward_context(): the trainer's precision, as in fit
    module.configure_model()
    module.setup("fit")  # the engine's checks
    return module, data, cli.trainer


def warm_up(module, data, trainer, episodes: int) -> None:
    """The config's warm-up callback (``--warmup N``: one of N expert episodes instead), or none."""
    callbacks = [cb for cb in trainer.callbacks if isinstance(cb, BehaviourCloningWarmup)]
    if episodes:
        callbacks = [BehaviourCloningWarmup(demonstrations=episodes, epochs=2, batch_size=2, cache_dir=str(default_cache_dir() / "warmup"))]
    for callback in callbacks:
        callback.progress = False
        callback.warm_up_or_load(module, data, module.forward_context)


def collect(module, data, epoch: int = 0):
    """One training rollout of the config's groups with its engine, as the data module plays
    it in ``epoch`` (its tasks and sampling seed)."""
    rollout = data.rollout
    with EnvPool(data.env_factory, rollout.groups * rollout.group_size) as pool:
        collector = Collector(pool, module.sampler(rollout.max_new_tokens, token_stats=module.records_token_stats), data.prompt, rollout.max_steps, rollout.invalid_penalty)
        tasks = [(g, derive_seed(data.seed, "train", epoch, g)) for g in range(rollout.groups)]
        with module.generating():
            return collector.collect(tasks, rollout.group_size, rollout.temperature, derive_seed(data.seed, "sample", epoch, 0), "rollout", progress=False)

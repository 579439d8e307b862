"""Command line: ``python -m paw_lightning fit|validate|test -c CONFIG [-c OVERLAY …] [--a.b=c]``.

A LightningCLI with the omegaconf parser (``${…}`` interpolation; repeated ``-c`` merges,
last wins), the optimizer injected into :class:`PaWModule` (``model.optimizer``), the
trainer defaults an on-policy loop needs, and the resolved config, git SHA and seed saved
to the MLflow run. User mistakes (unknown environment, missing model, bad values) end
with one ``error: …`` line and exit code 2; ``PAW_LIGHTNING_DEBUG=1`` shows the traceback.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from paw_lightning.callbacks import LossBalancer
from paw_lightning.data import RolloutDataModule
from paw_lightning.loggers import git_sha
from paw_lightning.module import PaWModule

TRAINER_DEFAULTS = {
    "reload_dataloaders_every_n_epochs": 1,  # one epoch = one RL iteration on fresh rollouts
    "use_distributed_sampler": False,  # RolloutDataModule shards groups by rank itself
    "num_sanity_val_steps": 0,  # a sanity check would play validation episodes
    "log_every_n_steps": 1,
    "logger": {"class_path": "paw_lightning.loggers.PawMLFlowLogger"},
}


class MLflowSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config as the run's ``config.yaml`` artifact, plus git SHA, seed and
    the tags that let the MLflow UI group runs (environment, objectives)."""

    def __init__(self, parser, config, **kwargs):
        kwargs["save_to_log_dir"] = False
        super().__init__(parser, config, **kwargs)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        logger = next((lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)), None)
        if logger is None:
            return
        client, run_id = logger.experiment, logger.run_id
        client.log_text(run_id, self.parser.dump(self.config, skip_none=False), self.config_filename)
        sha = git_sha()
        datamodule = trainer.datamodule
        wm = pl_module.world_model_objective
        tags = {
            "git_sha": sha,
            "mlflow.source.git.commit": sha,
            "env": datamodule.env_name if datamodule is not None else "",
            "policy_objective": type(pl_module.policy_objective).__name__,
            "advantage": type(getattr(pl_module.policy_objective, "advantage", None)).__name__,
            "world_model_objective": type(wm).__name__ if wm is not None else "none",
        }
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        if datamodule is not None:
            client.log_param(run_id, "seed", datamodule.seed)


class PawCLI(LightningCLI):
    """Adds two always-present callbacks with their own config sections: ``balancer`` (the
    world-model loss balancing, swapped by the objective overlays) and ``checkpoint``."""

    def __init__(self, args=None, run: bool = True):
        super().__init__(
            model_class=PaWModule,
            datamodule_class=RolloutDataModule,
            save_config_callback=MLflowSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            trainer_defaults=TRAINER_DEFAULTS,
            seed_everything_default=0,
            parser_kwargs={"parser_mode": "omegaconf"},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(LossBalancer, "balancer", subclass_mode=True)
        parser.set_defaults({"balancer": {"class_path": "paw_lightning.callbacks.RewardAdaptiveLambda"}})
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_epochs": 1})


def check_config_files(args: list[str]) -> None:
    """Fail early, naming the file, when a ``-c``/``--config`` file is missing or not valid YAML
    (the parser's own message would print the whole usage and hide the file name)."""
    for flag, value in zip(args, args[1:]):
        if flag not in ("-c", "--config"):
            continue
        path = Path(value)
        if not path.is_file():
            raise FileNotFoundError(f"config file '{value}' does not exist")
        try:
            yaml.safe_load(path.read_text())
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(err, "problem", None) or str(err)
            raise ValueError(f"config file '{value}' is not valid YAML{where}: {problem}") from err


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m paw_lightning`` and ``paw-lightning``."""
    try:
        check_config_files(list(sys.argv[1:] if args is None else args))
        PawCLI(args=args)
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}\n(set PAW_LIGHTNING_DEBUG=1 to see the traceback)", file=sys.stderr)
        sys.exit(2)

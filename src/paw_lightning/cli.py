"""Command line: ``python -m paw_lightning fit|validate|test -c CONFIG [-c OVERLAY …] [--a.b=c]``.

A LightningCLI with the omegaconf parser (``${…}`` interpolation; repeated ``-c`` merges,
last wins), the optimizer injected into :class:`PaWModule` (``model.optimizer``), the
trainer defaults an on-policy loop needs, and the resolved config, git SHA and seed saved
to the MLflow run. ``fit --ckpt_path=…`` continues the MLflow run recorded in the checkpoint
(when that run exists in the tracking store). User mistakes (unknown environment, missing model, bad values) end
with one ``error: …`` line and exit code 2; ``PAW_LIGHTNING_DEBUG=1`` shows the traceback.
When stdout is not a terminal (a log file, CI), Lightning's rich progress bar gives way to
:class:`~paw_lightning.progress.PlainProgressBar` (one line per epoch), and when stderr is not
one, Hugging Face's download / weight-loading bars are off.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch
import yaml
from lightning.fabric.utilities.load import _METADATA_FILENAME
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback

from paw_lightning.callbacks import EvaluationReport, LossBalancer, MLflowTracking, RunSummary
from paw_lightning.callbacks.mlflow import RUN_ID_KEY, mlflow_logger
from paw_lightning.data import RolloutDataModule
from paw_lightning.loggers import default_tracking_uri, git_sha
from paw_lightning.module import PaWModule
from paw_lightning.nonfinite import NonFiniteTrainingError
from paw_lightning.progress import PlainProgressBar, interactive

TRAINER_DEFAULTS = {
    "reload_dataloaders_every_n_epochs": 1,  # one epoch = one RL iteration on fresh rollouts
    "use_distributed_sampler": False,  # RolloutDataModule shards groups by rank itself
    "num_sanity_val_steps": 0,  # a sanity check would play validation episodes
    "log_every_n_steps": 1,
    "logger": {"class_path": "paw_lightning.loggers.PawMLFlowLogger"},
}


ALGORITHM_NAMES = {"GAE": "ppo"}  # the `algorithm` tag: the advantage estimator's name, lower case, except PPO


class MLflowSaveConfigCallback(SaveConfigCallback):
    """Saves the resolved config as the run's ``config.yaml`` artifact, plus git SHA, seed and
    the tags that let the MLflow UI group runs (environment, algorithm, objectives)."""

    def __init__(self, parser, config, **kwargs):
        kwargs["save_to_log_dir"] = False
        super().__init__(parser, config, **kwargs)

    def save_config(self, trainer, pl_module, stage: str) -> None:
        logger = mlflow_logger(trainer)
        if logger is None:
            return
        client, run_id = logger.experiment, logger.run_id
        client.log_text(run_id, self.parser.dump(self.config, skip_none=False), self.config_filename)
        sha = git_sha()
        datamodule = trainer.datamodule
        wm = pl_module.world_model_objective
        advantage = type(getattr(pl_module.policy_objective, "advantage", None)).__name__
        tags = {
            "git_sha": sha,
            "mlflow.source.git.commit": sha,
            "env": datamodule.env_name if datamodule is not None else "",
            "policy_objective": type(pl_module.policy_objective).__name__,
            "advantage": advantage,
            "algorithm": ALGORITHM_NAMES.get(advantage, advantage.lower()),
            "world_model_objective": type(wm).__name__ if wm is not None else "none",
        }
        if logger._run_name is None and not getattr(logger, "_resuming", False):  # named like the sweeps' runs, not at random
            tags["mlflow.runName"] = f"{tags['algorithm']}+{tags['world_model_objective'] if wm is not None else 'vanilla'}/seed{datamodule.seed if datamodule is not None else 0}"
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
        if datamodule is not None:
            logged = client.get_run(run_id).data.params.get("seed")
            if logged is not None and logged != str(datamodule.seed):  # a resumed run (MLflow params are write-once)
                raise ValueError(f"MLflow run {run_id} was logged with seed {logged}, not {datamodule.seed}: resume with the same seed (--seed_everything={logged} or --data.seed={logged})")
            client.log_param(run_id, "seed", datamodule.seed)


class PawCLI(LightningCLI):
    """Adds always-present callbacks with their own config sections: ``balancer`` (the
    world-model loss balancing, swapped by the objective overlays), ``checkpoint``,
    ``mlflow`` (trajectory tables, LoRA adapter artifact, system metrics, run id in
    checkpoints), ``evaluation`` (a JSON report per evaluation) and ``summary`` (``fit``: a
    validation before the first update and the before → after table at the end)."""

    def __init__(self, args=None, run: bool = True):
        if not _stream_is_tty(sys.stderr):  # a log file or CI: no tqdm bars redrawn with carriage returns
            import transformers

            transformers.utils.logging.disable_progress_bar()
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
        # save at every epoch end, also when validation runs only every k epochs (Lightning would wait for it)
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_epochs": 1, "checkpoint.save_on_train_epoch_end": True})
        parser.add_lightning_class_args(MLflowTracking, "mlflow")
        parser.add_lightning_class_args(EvaluationReport, "evaluation")
        parser.add_lightning_class_args(RunSummary, "summary")

    def _instantiate_trainer(self, config: dict, callbacks: list):
        """Lightning's rich progress bar animates only on a terminal: elsewhere (stdout is a log
        file or a pipe) the progress bar is :class:`PlainProgressBar`, unless the config names a
        progress bar itself or turns it off (``trainer.enable_progress_bar=false``)."""
        listed = config.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        has_bar = any(isinstance(cb, ProgressBar) for cb in [*listed, *callbacks])
        if config.get("enable_progress_bar") is not False and not has_bar and not interactive():
            callbacks = [*callbacks, PlainProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def before_instantiate_classes(self) -> None:
        """``fit --ckpt_path=…``: log into the MLflow run the checkpoint was written by."""
        if self.subcommand == "fit":
            config = self.config["fit"]
            resume_mlflow_run(config.trainer.logger, config.get("ckpt_path"))

    def before_fit(self) -> None:
        if self.trainer.gradient_clip_val:  # Lightning would refuse it with manual optimisation, less clearly
            raise ValueError(
                "trainer.gradient_clip_val is not used: PaWModule optimises manually (micro-batches); "
                f"set model.max_grad_norm={self.trainer.gradient_clip_val} instead"
            )


def _stream_is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def checkpoint_run_id(path: str | Path) -> str | None:
    """The MLflow run id stored in a checkpoint file or in FSDP2's distributed-checkpoint folder
    (its non-tensor entries live in the folder's metadata file); ``None`` if absent."""
    path = Path(path)
    if path.is_dir():
        path = path / _METADATA_FILENAME
    if not path.is_file():
        return None
    checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)  # tensors and plain types only: no pickled code runs
    return checkpoint.get(RUN_ID_KEY) if isinstance(checkpoint, dict) else None


def resume_mlflow_run(logger_config, ckpt_path: str | None) -> None:
    """Set ``run_id`` of an MLflow logger's config to the run recorded in ``ckpt_path``, unless a
    run id is already given or that run is not in the logger's tracking store (then the
    resumed fit starts a new run, with a warning)."""
    loggers = logger_config if isinstance(logger_config, list) else [logger_config]
    for logger in loggers:
        if not ckpt_path or not hasattr(logger, "class_path") or not logger.class_path.endswith("MLFlowLogger"):
            continue
        init_args = logger.get("init_args")
        if init_args is None or init_args.get("run_id"):
            continue
        run_id = checkpoint_run_id(ckpt_path)
        if run_id is None:
            continue
        uri = init_args.get("tracking_uri") or default_tracking_uri()
        try:
            import mlflow

            mlflow.MlflowClient(uri).get_run(run_id)
        except Exception as err:  # noqa: BLE001 - any lookup failure means: start a new run
            print(f"warning: MLflow run {run_id} of the checkpoint is not in {uri} ({type(err).__name__}); starting a new run", file=sys.stderr)
            continue
        init_args.run_id = run_id


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
    # Lightning's own use of a torch API that torch deprecated, once per training step: nothing a user can act on
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    try:
        check_config_files(list(sys.argv[1:] if args is None else args))
        PawCLI(args=args)
    except (ValueError, FileNotFoundError) as err:
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"error: {message}\n(set PAW_LIGHTNING_DEBUG=1 to see the traceback)", file=sys.stderr)
        sys.exit(2)
    except NonFiniteTrainingError as err:  # the run itself failed (not its input): exit code 1
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)

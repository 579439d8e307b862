"""Command line: ``python -m paw_lightning fit|validate|test -c CONFIG [-c OVERLAY …] [--a.b=c]``.

A LightningCLI with the omegaconf parser (``${…}`` interpolation; repeated ``-c`` merges,
last wins), the optimizer injected into :class:`PaWModule` (``model.optimizer``), the
trainer defaults an on-policy loop needs, and the always-present callbacks; run tracking
lives in :mod:`paw_lightning.tracking`. User mistakes end with one ``error: …`` line and
exit code 2 (``PAW_LIGHTNING_DEBUG=1`` shows the traceback); without a terminal, progress
bars give way to plain lines.

"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Literal, Optional, Union

import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from paw_lightning.callbacks import RunSummary
from paw_lightning.callbacks.stages import STAGES, stage_replacements
from paw_lightning.cli_checks import check_declared_ranges, check_finite, one_line
from paw_lightning.input_files import check_checkpoint, check_config_files, check_input_files
from paw_lightning.data import RolloutDataModule, check_env_settings
from paw_lightning.module import DEFAULT_LR, PaWModule
from paw_lightning.progress import PlainProgressBar, interactive
from paw_lightning.rollout.failures import RolloutFailureError
from paw_lightning.ranges import PositiveFloat, PositiveInt
from paw_lightning.scale import peers
from paw_lightning.tracking import EvaluationReport, MLflowSaveConfigCallback, MLflowTracking, resume_mlflow_run
from paw_lightning.training import stop_deadline
from paw_lightning.training.checkpoint_io import CheckpointWriteError
from paw_lightning.training.nonfinite import NonFiniteTrainingError
from paw_lightning.training.precision import auto_precision
from paw_lightning.training.threads import choose_threads

BASE_CONFIG = Path(__file__).parent / "configs" / "base.yaml"  # the settings every recipe shares
TRAINER_DEFAULTS = {
    "reload_dataloaders_every_n_epochs": 1,  # one epoch = one RL iteration on fresh rollouts
    "use_distributed_sampler": False,  # RolloutDataModule shards groups by rank itself
    "num_sanity_val_steps": 0,  # a sanity check would play validation episodes
    "log_every_n_steps": 1,
    "logger": {"class_path": "paw_lightning.tracking.PawMLFlowLogger"},
    "plugins": [{"class_path": "paw_lightning.training.checkpoint_io.DurableCheckpointIO"}],  # fsync + rename: a kill mid-write loses nothing
}


class PawCLI(LightningCLI):
    """Adds always-present callbacks with their own config sections: ``checkpoint``,
    ``mlflow`` (trajectory tables, LoRA adapter artifact, system metrics, run id in
    checkpoints), ``evaluation`` (a JSON report per evaluation) and ``summary`` (``fit``: a
    validation before the first update and the before → after table at the end); and the
    stages before RL by name (``stages.warmup``, ``stages.self_play``, ``stages.rwml``:
    :mod:`paw_lightning.callbacks.stages`), which run first, in that order, then
    ``trainer.callbacks`` (a user's own), then the always-present ones."""

    def __init__(self, args=None, run: bool = True):
        if not _stream_is_tty(sys.stderr):  # a log file or CI: no tqdm bars redrawn with carriage returns
            import transformers

            transformers.utils.logging.disable_progress_bar()
        # the base recipe is read before any -c (run=False: no subcommands); a parse error raises
        # (main prints it as one line) instead of printing the whole usage
        base = {"default_config_files": [str(BASE_CONFIG)], "exit_on_error": False, "allow_abbrev": False}  # --model.max_grad must not mean max_grad_norm
        super().__init__(
            model_class=PaWModule,
            datamodule_class=RolloutDataModule,
            save_config_callback=MLflowSaveConfigCallback,
            save_config_kwargs={"overwrite": True},
            trainer_defaults=TRAINER_DEFAULTS,
            seed_everything_default=0,
            parser_kwargs={"parser_mode": "omegaconf", "exit_on_error": False, "allow_abbrev": False, **({command: base for command in ("fit", "validate", "test")} if run else base)},
            auto_configure_optimizers=False,
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        # save at every epoch end, also when validation runs only every k epochs (Lightning would wait for it)
        parser.set_defaults({"checkpoint.save_last": True, "checkpoint.every_n_epochs": 1, "checkpoint.save_on_train_epoch_end": True})
        # PaWModule's default optimizer as a class spec, so that --model.optimizer.init_args.lr=… works
        parser.set_defaults({"model.optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": DEFAULT_LR}}})
        parser.add_lightning_class_args(MLflowTracking, "mlflow")
        parser.add_lightning_class_args(EvaluationReport, "evaluation")
        parser.add_lightning_class_args(RunSummary, "summary")
        for key, (stage_type, purpose) in STAGES.items():  # by key: a later -c file changes one stage, not a list
            parser.add_argument(f"--stages.{key}", type=Optional[stage_type], default=None, help=f"{purpose} (null: none)")
        parser.add_argument("--threads", type=Optional[Union[PositiveInt, Literal["auto"]]], default="auto",
                            help="torch threads on CPU: auto (one per core other processes leave free), a number, or null (torch's default)")
        parser.add_argument("--stop_deadline_s", type=Optional[PositiveFloat], default=60.0,
                            help="after SIGTERM, exit at the latest this many seconds later, even if blocked (null: wait for Lightning's orderly stop)")

    def parse_arguments(self, parser, args) -> None:
        """Parse; then (rank 0, also for ``--print_config``) one stderr line per stage that a
        later ``-c`` file changed, replaced or removed (:func:`~paw_lightning.callbacks.stages.stage_replacements`);
        then the checks of :mod:`paw_lightning.cli_checks` (NaN/inf, the declared ranges of
        Lightning's keys), the environment's arguments (:func:`~paw_lightning.data.check_env_settings`)
        and :mod:`paw_lightning.input_files`, before the seed is set and anything is built."""
        argv = sys.argv[1:] if args is None else args
        files = _config_files(argv) if isinstance(argv, (list, tuple)) else []
        try:
            super().parse_arguments(parser, args)
        except SystemExit as done:
            if not done.code:  # --print_config (or --help) ends the parse
                _report_stage_replacements(files)
            raise
        _report_stage_replacements(files)
        config = self.config[self.config["subcommand"]] if self.config.get("subcommand") else self.config
        check_finite(config)  # the input (paw_lightning.cli_checks), before the seed is set or anything is built
        check_declared_ranges(config)
        data = config.get("data")
        if data is not None:  # the environment's arguments: their types, before the files they name are read
            check_env_settings(data.env, data.env_kwargs, data.evaluation.get("env_kwargs"), build=False)
        check_input_files(config)
        if data is not None:  # then the environment built with them (its own rules)
            check_env_settings(data.env, data.env_kwargs, data.evaluation.get("env_kwargs"))

    def _instantiate_trainer(self, config: dict, callbacks: list):
        """The stages (``stages.*``, in :data:`~paw_lightning.callbacks.stages.STAGES` order) go
        first in the trainer's callbacks, before ``trainer.callbacks``. Lightning's rich progress
        bar animates only on a terminal: elsewhere (stdout is a log file or a pipe) the progress
        bar is :class:`PlainProgressBar`, unless the config names a progress bar itself or turns
        it off (``trainer.enable_progress_bar=false``)."""
        listed = config.get("callbacks") or []
        listed = listed if isinstance(listed, list) else [listed]
        stages = self._get(self.config_init, "stages", default=None) or {}
        listed = [stage for stage in (stages.get(key) for key in STAGES) if stage is not None] + listed
        config["callbacks"] = listed
        has_bar = any(isinstance(cb, ProgressBar) for cb in [*listed, *callbacks])
        if config.get("enable_progress_bar") is not False and not has_bar and not interactive():
            callbacks = [*callbacks, PlainProgressBar()]
        return super()._instantiate_trainer(config, callbacks)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path``: opened here (:func:`~paw_lightning.input_files.check_checkpoint`, tensors
        left on disk) before Lightning's own parse would ``torch.load`` a damaged file with a
        traceback; Lightning's step (the model's hyper-parameters, which paw_lightning's
        checkpoints do not hold) runs only for a checkpoint that has them. Lightning's ``last`` and
        ``best`` are refused: they look in the new run's checkpoint folder, which is named after
        its new MLflow run, so they would find nothing and start afresh in another MLflow run."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if str(path) in ("last", "best"):
            raise ValueError(f"ckpt_path '{path}': name the checkpoint file, e.g. runs/<experiment id>/<run id>/checkpoints/last.ckpt "
                             f"(each MLflow run keeps its own checkpoint folder: '{path}' would find none there and start afresh)")
        if not path or str(path) == "hpc" or str(path).startswith("registry") or "://" in str(path):
            return  # a name Lightning resolves itself, or a remote file
        if "hyper_parameters" in check_checkpoint(str(path), "ckpt_path", resume=subcommand == "fit"):
            super()._parse_ckpt_path()

    def before_instantiate_classes(self) -> None:
        """Torch threads (``threads``), the SIGTERM deadline (``stop_deadline_s``,
        :mod:`paw_lightning.training.stop_deadline`), Dr. GRPO's L (:func:`budget_as_loss_norm`),
        ``bf16-mixed`` for an unset ``trainer.precision`` with a bfloat16 ``dtype: auto`` base
        (:mod:`paw_lightning.training.precision`); ``fit --ckpt_path=…``: log into the MLflow
        run the checkpoint was written by."""
        config = self.config[self.subcommand] if self.subcommand is not None else self.config
        if self.subcommand is not None:
            chosen = choose_threads(config.get("threads"))
            if chosen:
                print(chosen, file=sys.stderr)
            stop_deadline.install(config.get("stop_deadline_s"))
        budget_as_loss_norm(config)
        config.trainer.precision, chosen = auto_precision(config.trainer.precision, config.model.lm.dtype, config.trainer.accelerator)
        if chosen:
            print(chosen, file=sys.stderr)
        if self.subcommand == "fit":
            resume_mlflow_run(config.trainer.logger, config.get("ckpt_path"))

    def _run_subcommand(self, subcommand: str) -> None:
        """Run it; a fit that stops on bad input (a ``ValueError``, e.g. a checkpoint from another
        model, named with the reason it does not fit) before it logged anything takes its new
        MLflow run with it. An unreachable
        tracking server stops it before anything runs. A collective that fails because another
        rank died or hangs becomes one line naming that rank (:mod:`paw_lightning.scale.peers`)."""
        check_server = getattr(getattr(self.trainer, "logger", None), "check_server", None)
        if callable(check_server):
            check_server()
        peers.name_lost_ranks_on_observer_kill(lambda: getattr(self.trainer.checkpoint_callback, "last_model_path", None))
        try:
            super()._run_subcommand(subcommand)
        except (ValueError, FileNotFoundError, RuntimeError) as err:
            checkpoint = self.config[subcommand].get("ckpt_path")
            restoring = bool(checkpoint) and _raised_while_restoring(err)  # a checkpoint of another model or LoRA shape
            if isinstance(err, RuntimeError) and not restoring:  # another rank died or hangs: say which, in one line
                if not peers.is_collective_failure(err, self.trainer.world_size):
                    raise
                launched = getattr(self.trainer.strategy.launcher, "procs", None)
                last = getattr(self.trainer.checkpoint_callback, "last_model_path", None)
                raise peers.collective_failure(err, self.trainer.global_rank, self.trainer.world_size, launched, last) from err
            logger = getattr(self.trainer, "logger", None)
            if callable(getattr(logger, "discard_if_unstarted", None)):
                logger.discard_if_unstarted()
            if restoring:  # say which checkpoint could not be restored, and why
                reason = str(err).strip().splitlines()[-1].strip() if str(err).strip() else type(err).__name__
                raise ValueError(f"ckpt_path '{checkpoint}' cannot be restored into this model: {reason}") from err
            raise

    def before_fit(self) -> None:
        """Settings that make a fit meaningless fail here, before an MLflow run is created."""
        estimator = self.model.policy_objective.advantage
        if getattr(estimator, "compares_episodes", False) and self.datamodule.rollout.group_size < 2:
            raise ValueError(
                f"{type(estimator).__name__} compares the episodes of a task with each other: with data.rollout.group_size "
                f"{self.datamodule.rollout.group_size} every advantage is 0; use group_size >= 2 (or GAE with a critic)"
            )
        if self.trainer.gradient_clip_val:  # Lightning would refuse it with manual optimisation, less clearly
            raise ValueError(
                "trainer.gradient_clip_val is not used: PaWModule optimises manually (micro-batches); "
                f"set model.max_grad_norm={self.trainer.gradient_clip_val} instead"
            )


def budget_as_loss_norm(config) -> None:
    """``seq-mean-token-sum-norm`` (Dr. GRPO) divides by a constant L, the generation budget:
    ``loss_norm_tokens: null`` there takes ``data.rollout.max_new_tokens``, so the recipe follows
    the environment's budget (one home for it). A number given stays."""
    args = getattr(config.model.get("policy_objective"), "init_args", None)
    if args is not None and args.get("aggregation") == "seq-mean-token-sum-norm" and args.get("loss_norm_tokens") is None:
        args.loss_norm_tokens = config.data.rollout.max_new_tokens


def _raised_while_restoring(err: BaseException) -> bool:
    """Whether ``err`` was raised while Lightning restored a checkpoint into the model."""
    frames = traceback.extract_tb(err.__traceback__)
    return any(frame.filename.endswith("checkpoint_connector.py") for frame in frames)


def _stream_is_tty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _config_files(args) -> list[str]:
    """The ``-c``/``--config`` files of a command line, in order."""
    files = []
    for flag, value in zip(args, [*args[1:], None]):
        if flag in ("-c", "--config") and isinstance(value, str):
            files.append(value)
        elif isinstance(flag, str) and flag.startswith("--config="):
            files.append(flag.split("=", 1)[1])
    return files


def _report_stage_replacements(files: list[str]) -> None:
    if rank_zero_only.rank == 0:  # a launched process of another rank parses the same files
        for line in stage_replacements(files, base=BASE_CONFIG):
            print(line, file=sys.stderr, flush=True)


def resolved_config(*configs: str | Path, overrides: tuple[str, ...] = ()) -> dict:
    """The configuration ``fit -c CONFIG … OVERRIDES`` would run with, as plain data: the base
    recipe, the files in order, then the dotted overrides (parsed only, nothing instantiated)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")  # a script's own sys.argv is not this config's
        PawCLI(args=["fit", *(arg for path in configs for arg in ("-c", str(path))), *overrides, "--print_config"])
    if not printed.getvalue():
        raise ValueError(f"cannot resolve the config {' + '.join(map(str, configs))}: run it with --print_config to see why")
    return yaml.safe_load(printed.getvalue())


def main(args: list[str] | None = None) -> None:
    """Entry point of ``python -m paw_lightning`` and ``paw-lightning``."""
    # Lightning's own use of a torch API that torch deprecated, once per training step: nothing a user can act on
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    argv = list(sys.argv[1:] if args is None else args)
    try:
        check_config_files(argv)
        PawCLI(args=args)
    except argparse.ArgumentError as err:  # the parser: an unknown key, a wrong type, a missing class
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        print(f"error: {one_line(str(err), argv)} (--help lists the options)", file=sys.stderr)
        sys.exit(2)
    except (ValueError, FileNotFoundError, MisconfigurationException) as err:  # bad input, ours or Lightning's
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        message = one_line(str(err), argv) if str(err).strip() else type(err).__name__  # a class's union error: the innermost reason
        print(f"error: {message} (PAW_LIGHTNING_DEBUG=1 shows the traceback)", file=sys.stderr)
        sys.exit(2)
    except (NonFiniteTrainingError, CheckpointWriteError, RolloutFailureError, peers.PeerLostError) as err:  # the run itself failed (not its input): exit code 1
        if os.environ.get("PAW_LIGHTNING_DEBUG"):
            raise
        peers.report(str(err))  # once: rank 0's child-process observer may have printed it already
        sys.exit(1)

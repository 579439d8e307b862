"""MLflow run contents beyond the metrics: trajectory tables, the LoRA adapter, system metrics,
and the run id inside checkpoints (so a resumed ``fit`` continues the same run).

:class:`MLflowTracking` is always on (the CLI's ``mlflow:`` section) and records
``trajectory_rows`` transitions of rank 0's episodes after every validation / test, the
trained LoRA adapter at the end of ``fit``, ``system/*`` metrics on rank 0 every epoch and
``mlflow_run_id`` in every checkpoint. Each part can be switched off:
``--mlflow.trajectory_rows=0``, ``--mlflow.log_adapter=false``, ``--mlflow.system_metrics=false``.

"""
from __future__ import annotations

from pathlib import Path

import psutil
import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import MLFlowLogger

from paw_lightning.rollout.samples import spread_indices
from paw_lightning.scale.checkpointing import trainable_state_dict
from paw_lightning.training.memory import peak_rss_gib

RUN_ID_KEY = "mlflow_run_id"


def mlflow_logger(trainer) -> MLFlowLogger | None:
    return next((lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)), None)


def run_directory(trainer) -> Path:
    """This run's local directory (rank 0 only): ``<save_dir or default_root_dir>/<experiment
    id>/<run id>`` with an MLflow logger — where ModelCheckpoint puts ``checkpoints/`` —
    else ``default_root_dir``."""
    logger = mlflow_logger(trainer)
    root = Path(trainer.default_root_dir)
    if logger is None:
        return root
    return Path(logger.save_dir or root) / str(logger.experiment_id) / str(logger.run_id)


def evaluated_epoch(trainer, pl_module) -> int | None:
    """The training epoch of the weights being evaluated: the current epoch inside ``fit`` (``-1``
    for the validation before the first update, :mod:`paw_lightning.callbacks.summary`), the
    checkpoint's epoch for ``validate``/``test --ckpt_path``, ``None`` for the base model."""
    if trainer.state.fn == "fit":
        return trainer.current_epoch
    return getattr(pl_module, "checkpoint_epoch", None) if trainer.ckpt_path is not None else None


def epoch_label(trainer, pl_module) -> str:
    """``epoch<E>`` (see :func:`evaluated_epoch`), ``start`` for the validation of a fit before its
    first update, or ``base`` for the untrained model."""
    epoch = evaluated_epoch(trainer, pl_module)
    return "base" if epoch is None else "start" if epoch < 0 else f"epoch{epoch}"


def trajectory_rows(buffer, tokenizer, predictions: dict[int, str], n: int) -> dict[str, list]:
    """Columns of the trajectory table for ``n`` transitions spread over ``buffer`` (step samples
    in trajectory order)."""
    transitions = [(traj, t, step) for traj in buffer.trajectories for t, step in enumerate(traj.steps)]
    columns = {name: [] for name in ("group", "episode", "step", "prompt", "response", "action", "observation", "reward", "next_observation", "predicted_next_observation")}
    for i in spread_indices(len(transitions), n):
        traj, t, step = transitions[i]
        row = {
            "group": traj.group_id,
            "episode": traj.traj_id,
            "step": t,
            "prompt": tokenizer.decode(step.prompt_ids),
            "response": step.response,
            "action": step.action,
            "observation": step.observation,
            "reward": step.reward,
            "next_observation": step.next_observation,
            "predicted_next_observation": predictions.get(i),
        }
        for name, value in row.items():
            columns[name].append(value)
    return columns


def save_adapter(model, state: dict[str, torch.Tensor], directory: Path) -> Path:
    """Write the LoRA adapter of the peft ``model`` with the given (full) weights."""
    model.save_pretrained(str(directory), state_dict=state, save_embedding_layers=False)
    return directory


def system_metrics(process: psutil.Process) -> dict[str, float]:
    """One reading; CPU percentages are averages since the previous reading (100 = one core
    for the process)."""
    gib = 2**30
    children = process.children(recursive=True)
    children_rss = 0
    for child in children:
        try:
            children_rss += child.memory_info().rss
        except psutil.Error:  # a worker that just exited
            pass
    metrics = {
        "system/cpu_percent": psutil.cpu_percent(interval=None),
        "system/process_cpu_percent": process.cpu_percent(interval=None),
        "system/rss_gib": process.memory_info().rss / gib,
        "system/children_rss_gib": children_rss / gib,
        "system/peak_rss_gib": peak_rss_gib(),
        "system/memory_percent": psutil.virtual_memory().percent,
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        metrics["system/gpu_memory_allocated_gib"] = torch.cuda.memory_allocated() / gib
        metrics["system/gpu_memory_reserved_gib"] = torch.cuda.memory_reserved() / gib
    return metrics


class MLflowTracking(Callback):
    """Args:
    trajectory_rows: transitions per validation / test in the MLflow trajectory table (0: no table).
    log_adapter: save the final LoRA adapter (peft format) and log it as the ``adapter`` artifact.
    system_metrics: log ``system/*`` (CPU, memory, GPU memory) from rank 0 every epoch.
    """

    def __init__(self, trajectory_rows: int = 8, log_adapter: bool = True, system_metrics: bool = True):
        if trajectory_rows < 0:
            raise ValueError(f"mlflow.trajectory_rows must be >= 0 (got {trajectory_rows}); 0 turns the table off")
        self.trajectory_rows, self.log_adapter, self.system_metrics = trajectory_rows, log_adapter, system_metrics
        self.adapter_dir: Path | None = None  # where the last fit wrote its adapter (rank 0)
        self._process: psutil.Process | None = None

    # ------------------------------------------------------------- run id
    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        logger = mlflow_logger(trainer)
        if logger is not None and trainer.is_global_zero:
            checkpoint[RUN_ID_KEY] = logger.run_id

    # ----------------------------------------------------- system metrics
    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.system_metrics and trainer.is_global_zero:
            self._process = psutil.Process()
            self._process.cpu_percent(interval=None)  # start both CPU averages now
            psutil.cpu_percent(interval=None)

    def _log_system(self, trainer) -> None:
        if self._process is None or not trainer.is_global_zero:
            return
        metrics = system_metrics(self._process)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.current_epoch)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._log_system(trainer)

    # ------------------------------------------------- trajectory tables
    def _log_table(self, trainer, pl_module, split: str) -> None:
        logger = mlflow_logger(trainer)
        evaluation = getattr(pl_module, "evaluations", {}).get(split)  # a module other than PaWModule has none
        if logger is None or evaluation is None or self.trajectory_rows == 0 or not trainer.is_global_zero or trainer.sanity_checking:
            return
        columns = trajectory_rows(evaluation.played.samples, pl_module.tokenizer, evaluation.predictions, self.trajectory_rows)
        if columns["prompt"]:
            logger.experiment.log_table(logger.run_id, columns, f"trajectories/{split}_{epoch_label(trainer, pl_module)}.json")

    def on_validation_end(self, trainer, pl_module) -> None:
        self._log_table(trainer, pl_module, "val")
        if trainer.state.fn != "fit":
            self._log_system(trainer)

    def on_test_end(self, trainer, pl_module) -> None:
        self._log_table(trainer, pl_module, "test")
        self._log_system(trainer)

    # ------------------------------------------------------------ adapter
    def on_fit_end(self, trainer, pl_module) -> None:
        if not self.log_adapter or pl_module.lm is None:
            return
        state = trainable_state_dict(pl_module.lm)  # every rank: FSDP2 all-gathers
        if not trainer.is_global_zero:
            return
        self.adapter_dir = save_adapter(pl_module.lm, state, run_directory(trainer) / "adapter")
        logger = mlflow_logger(trainer)
        if logger is not None:
            logger.experiment.log_artifacts(logger.run_id, str(self.adapter_dir), "adapter")

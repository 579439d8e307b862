"""One JSON report per evaluation (validation inside ``fit``, ``validate``, ``test``).

After every validation / test, rank 0 writes ``<run dir>/eval/<split>_<epoch label>.json``
(``epoch<E>``, ``start`` before a fit's first update, ``base`` without a checkpoint) and logs
it to the MLflow run as ``eval/<same name>``: every ``<split>/`` metric, the stage, epoch,
checkpoint and the evaluation plan (:func:`paw_lightning.evaluation.eval_plan`, read from the
module's latest :class:`~paw_lightning.evaluation.Evaluation`), so a number in a table can be
traced to what was played. ``--evaluation.write_json=false`` turns it off.
"""
from __future__ import annotations

import json
import math

from lightning.pytorch import Callback

from paw_lightning.tracking.artifacts import (
    epoch_label,
    evaluated_epoch,
    mlflow_logger,
    run_directory,
)


def _number(value) -> float | None:
    value = float(value.item() if hasattr(value, "item") else value)
    return None if math.isnan(value) else value


class EvaluationReport(Callback):
    """Args:
    write_json: write the per-evaluation JSON report (and log it as an MLflow artifact).
    """

    def __init__(self, write_json: bool = True):
        self.write_json = write_json
        self.last_report: dict | None = None  # the latest report written on this rank (rank 0)

    def report(self, trainer, pl_module, split: str) -> dict:
        metrics = {k: _number(v) for k, v in sorted(trainer.logged_metrics.items()) if k.startswith(f"{split}/")}
        evaluation = getattr(pl_module, "evaluations", {}).get(split)  # a module other than PaWModule has none
        return {
            "stage": str(trainer.state.fn.value),
            "split": split,
            "epoch": evaluated_epoch(trainer, pl_module),
            "global_step": trainer.global_step,
            "checkpoint": str(trainer.ckpt_path) if trainer.ckpt_path else None,
            "metrics": metrics,
            "eval": evaluation.played.plan if evaluation is not None else None,
        }

    def _write(self, trainer, pl_module, split: str) -> None:
        if not self.write_json or not trainer.is_global_zero or trainer.sanity_checking:
            return
        report = self.report(trainer, pl_module, split)
        directory = run_directory(trainer) / "eval"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{split}_{epoch_label(trainer, pl_module)}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        self.last_report = {**report, "path": str(path)}
        logger = mlflow_logger(trainer)
        if logger is not None:
            logger.experiment.log_artifact(logger.run_id, str(path), "eval")

    def on_validation_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module, "val")

    def on_test_end(self, trainer, pl_module) -> None:
        self._write(trainer, pl_module, "test")

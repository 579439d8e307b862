"""A resumed ``fit`` continues the MLflow run its checkpoint was written by."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from lightning.fabric.utilities.load import _METADATA_FILENAME

from paw_lightning.tracking.artifacts import RUN_ID_KEY
from paw_lightning.tracking.logger import default_tracking_uri


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

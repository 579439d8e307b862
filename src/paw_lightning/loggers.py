"""MLflow logging defaults: a SQLite tracking store (MLflow 3 refuses the file store)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


class PawMLFlowLogger(MLFlowLogger):
    """Lightning's MLFlowLogger with this project's defaults.

    Args:
        experiment_name: MLflow experiment (group runs you want to compare in one).
        run_name: shown in the MLflow UI; default: MLflow's generated name.
        tracking_uri: ``sqlite:///path.db``, ``postgresql://…`` or an ``http://`` tracking
            server; default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<cwd>/mlflow.db``.
        tags: extra run tags.
    """

    def __init__(self, experiment_name: str = "paw_lightning", run_name: str | None = None, tracking_uri: str | None = None, tags: dict | None = None, **kwargs):
        uri = tracking_uri or default_tracking_uri()
        if uri.startswith("file:") or "://" not in uri:
            raise ValueError(
                f"MLflow tracking_uri {uri!r} is a file store, which MLflow 3 refuses: use 'sqlite:///mlflow.db' or a server URL"
            )
        super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=uri, tags=tags, **kwargs)


def git_sha(path: str | Path | None = None) -> str:
    """The commit of the code that runs (default: the repository holding this package),
    ``+dirty`` if tracked files changed; ``unknown`` for an installed copy outside git."""
    path = path or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=path, capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"

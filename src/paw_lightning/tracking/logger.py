"""MLflow logging defaults: a SQLite tracking store (MLflow 3 refuses the file store), the
epoch as every metric's step, and resuming into an existing run."""
from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only
from mlflow.exceptions import MlflowException

from paw_lightning.tracking.outage import OutageTolerantClient, server_unreachable


EXPERIMENT_KIND = "mlflow.experimentKind"  # MLflow 3's UI: genai_development (traces first) or custom_model_development


def mark_model_training(client, experiment_id: str) -> None:
    """Tag the experiment so that MLflow 3's UI opens its run list and charts (not the GenAI view).
    Runs that start together may race to set it: the one that loses finds it set and goes on."""
    if EXPERIMENT_KIND in client.get_experiment(experiment_id).tags:
        return
    try:
        client.set_experiment_tag(experiment_id, EXPERIMENT_KIND, "custom_model_development")
    except MlflowException:
        if EXPERIMENT_KIND not in client.get_experiment(experiment_id).tags:
            raise


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` if set, else ``sqlite:///<cwd>/mlflow.db``."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


class PawMLFlowLogger(MLFlowLogger):
    """Lightning's MLFlowLogger with this project's defaults.

    Args:
        experiment_name: MLflow experiment (group runs you want to compare in one).
        run_name: shown in the MLflow UI; default: ``<algorithm>+<world-model objective>/seed<seed>``
            (set by the CLI once the model is built, e.g. ``gigpo+ClippedMAE/seed0``), as the
            sweeps name their runs.
        tracking_uri: ``sqlite:///path.db``, ``postgresql://…`` or an ``http://`` tracking
            server; default ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<cwd>/mlflow.db``.
        tags: extra run tags.
        run_id: log into this existing run (set by the CLI when ``fit`` resumes from a
            checkpoint that recorded its run); its status goes back to RUNNING.
        outage_retry_s: while a tracking server is unreachable, how often to try sending the
            metrics kept meanwhile (at the next metric write after that many seconds).

    With a tracking server (``http(s)://``), training survives the server going away
    (:mod:`paw_lightning.tracking.outage`), and ``check_server`` (called by the CLI before a
    subcommand runs) fails fast when it does not answer at the start.

    Experiments it creates are model-training experiments (tag ``mlflow.experimentKind``), so
    MLflow 3's UI opens them on the run list and metric charts, not the GenAI traces view.

    Metrics are logged with the epoch as their MLflow step (Lightning passes the global step;
    ``trainer.current_epoch`` rides along as the ``epoch`` metric), so train and validation
    curves share one x-axis and a resumed run continues the same axis.
    """

    def __init__(self, experiment_name: str = "paw_lightning", run_name: str | None = None, tracking_uri: str | None = None, tags: dict | None = None, run_id: str | None = None,
                 outage_retry_s: float = 30.0, **kwargs):
        uri = tracking_uri or default_tracking_uri()
        if uri.startswith("file:") or ("://" not in uri and uri != "databricks"):
            raise ValueError(
                f"MLflow tracking_uri {uri!r} is a file store, which MLflow 3 refuses: use 'sqlite:///mlflow.db', "
                "'postgresql://…' or a tracking server URL such as 'http://127.0.0.1:5000'"
            )
        super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=uri, tags=tags, run_id=run_id, **kwargs)
        self._resuming = run_id is not None
        if uri.startswith(("http://", "https://")):
            self._mlflow_client = OutageTolerantClient(self._mlflow_client, uri, retry_every=outage_retry_s, unsent_dir=Path.cwd())

    def check_server(self) -> None:
        """Fail fast, in one line, when the tracking server does not answer (a run started
        against it would otherwise wait through MLflow's retries, minutes)."""
        if isinstance(self._mlflow_client, OutageTolerantClient):
            reason = server_unreachable(self._tracking_uri)
            if reason:
                raise ValueError(
                    f"MLflow tracking server {self._tracking_uri} is unreachable ({reason}): start it (e.g. mlflow server "
                    "--host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///mlflow.db) or log to a local store "
                    "with --trainer.logger.init_args.tracking_uri=sqlite:///mlflow.db"
                )

    @property
    @rank_zero_experiment
    def experiment(self):
        first = not self._initialized
        client = MLFlowLogger.experiment.fget(self)
        if first and self._resuming:
            client.update_run(self._run_id, status="RUNNING")
        if first:
            mark_model_training(client, self._experiment_id)
        return client

    @rank_zero_only
    def discard_if_unstarted(self) -> bool:
        """Delete the run this logger created if nothing was logged to it yet (a fit that
        failed on its input before its first validation or epoch); a resumed run is kept.
        Whether it deleted one."""
        if self._resuming or not self._initialized or self._run_id is None:
            return False
        client = self.experiment
        if client.get_run(self._run_id).data.metrics:
            return False
        client.delete_run(self._run_id)
        return True

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """End the run; during a tracking-server outage that has not ended, the unsent metrics
        and the run's end status go to a file instead (:mod:`paw_lightning.tracking.outage`)."""
        if isinstance(self._mlflow_client, OutageTolerantClient) and self._initialized:
            end = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, "KILLED")
            if self._mlflow_client.close(self._run_id, end) is not None:
                return
        super().finalize(status)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if "epoch" in metrics:
            step = int(metrics["epoch"])
        super().log_metrics(metrics, step)


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

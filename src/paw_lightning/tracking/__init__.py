"""Run tracking in one place: the MLflow logger and its defaults (``logger``), the run's
artifacts, trajectory tables, adapter, system metrics and run id in checkpoints
(``artifacts``), one JSON report per evaluation (``evaluation``), the resolved config and
grouping tags (``run_config``), and resuming into a checkpoint's run (``resume``)."""
from paw_lightning.tracking.artifacts import RUN_ID_KEY, MLflowTracking, mlflow_logger, run_directory
from paw_lightning.tracking.evaluation import EvaluationReport
from paw_lightning.tracking.logger import PawMLFlowLogger, default_tracking_uri, git_sha
from paw_lightning.tracking.resume import checkpoint_run_id, resume_mlflow_run
from paw_lightning.tracking.run_config import MLflowSaveConfigCallback

__all__ = [
    "RUN_ID_KEY",
    "EvaluationReport",
    "MLflowSaveConfigCallback",
    "MLflowTracking",
    "PawMLFlowLogger",
    "checkpoint_run_id",
    "default_tracking_uri",
    "git_sha",
    "mlflow_logger",
    "resume_mlflow_run",
    "run_directory",
]

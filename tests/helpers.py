"""Helpers for the end-to-end tests: CLI arguments for tiny runs and MLflow read-back."""
from __future__ import annotations

from pathlib import Path

import mlflow

ROOT = Path(__file__).resolve().parents[1]


def tiny_args(model_dir: Path, workdir: Path, *extra: str, config: str = "configs/frozenlake.yaml") -> list[str]:
    return [
        "-c", str(ROOT / config),
        "-c", str(ROOT / "tests/configs/tiny.yaml"),
        f"--model.lm.name_or_path={model_dir}",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}",
        f"--trainer.default_root_dir={workdir / 'runs'}",
        *extra,
    ]


def mlflow_runs(workdir: Path, experiment: str = "frozenlake"):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def metric_history(client, run, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]

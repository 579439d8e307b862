"""Helpers for the end-to-end tests: CLI arguments for tiny runs and MLflow read-back."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import torch

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


SMALL_WARMUP = """
trainer:
  callbacks:
    - class_path: paw_lightning.callbacks.warmup.BehaviourCloningWarmup
      init_args: {demonstrations: 2, epochs: 2, batch_size: 2, progress: false}
"""


def small_warmup(workdir: Path) -> str:
    """An overlay that cuts an env config's behaviour-cloning warm-up to 2 episodes × 2 epochs."""
    path = workdir / "warmup.yaml"
    path.write_text(SMALL_WARMUP)
    return str(path)


def mlflow_runs(workdir: Path, experiment: str = "frozenlake"):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    return client, client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"])


def metric_history(client, run, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)]


# Greedy rollouts and no KL term: a fit whose losses do not depend on how the groups are
# spread over processes (see test_fsdp_fit.py).
RANK_INDEPENDENT = ("--trainer.accelerator=cpu", "--data.rollout.temperature=0", "--data.evaluation.temperature=0", "--trainer.max_epochs=2",
                    "--model.optimizer.init_args.lr=0.01", "--data.mini_batch_size=8", "--model.policy_objective.init_args.kl_coef=0")


def fit_in_subprocess(model_dir: Path, workdir: Path, *extra: str):
    """`python -m paw_lightning fit` on the tiny model in a fresh `workdir` (RANK_INDEPENDENT
    settings, then `extra`); returns `mlflow_runs(workdir)`."""
    workdir.mkdir()
    args = tiny_args(model_dir, workdir, *RANK_INDEPENDENT, *extra)
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return mlflow_runs(workdir)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a free loopback port with a SQLite store in ``workdir``; ``stop`` it
    (SIGTERM, or SIGKILL: gone at once) and ``start`` it again on the same port and store."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port, self.process = workdir, free_port(), None
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        with open(self.workdir / "server.log", "a") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.workdir / 'server.db'}",
                 "--artifacts-destination", str(self.workdir / "server_artifacts"), "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1"],
                cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        for _ in range(300):  # a loaded CI machine can take a minute to migrate the database and start
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.workdir / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return self.url
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(1)
        raise RuntimeError("mlflow server did not answer /health")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """The server and its uvicorn workers (its own process group)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def redrawn_lora(lm, std: float = 0.5):
    """Inside the block, ``lm``'s LoRA B weights are redrawn from N(0, std²) (an update, as a
    rollout engine's copy would see it); restored after it."""
    lora_b = [p for n, p in lm.named_parameters() if "lora_B" in n]
    saved = [p.detach().clone() for p in lora_b]
    try:
        with torch.no_grad():
            for p in lora_b:
                p.normal_(0, std)
        yield
    finally:
        with torch.no_grad():
            for p, value in zip(lora_b, saved):
                p.copy_(value)

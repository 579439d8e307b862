"""A tracking server that goes away: training goes on, the metrics logged meanwhile arrive when
it is back (or wait in a file that `python -m paw_lightning.tracking.outage` sends later), the run
is tagged with the outage, checkpoints are unaffected; an unreachable server at the start is one
line and exit code 2, before anything runs."""
from __future__ import annotations

import signal
import subprocess
import sys

import lightning.pytorch as pl
import mlflow
import pytest
import torch

from paw_lightning.cli import main

from helpers import MlflowServer, free_port, tiny_args

pytestmark = pytest.mark.slow  # an MLflow server process and fits

SERVER: MlflowServer | None = None  # the test's server, for ServerSwitch


class ServerSwitch(pl.Callback):
    """Kills the tracking server (SIGKILL) at the end of epoch ``down_after``; starts it again on the
    same port and store at the end of epoch ``up_after`` (never if None)."""

    def __init__(self, down_after: int = 0, up_after: int | None = None) -> None:
        self.down_after, self.up_after = down_after, up_after

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if trainer.current_epoch == self.down_after:
            SERVER.stop(signal.SIGKILL)
        if trainer.current_epoch == self.up_after:
            SERVER.start()


def fit_with_switch(tiny_model_dir, tmp_path, url: str, up_after: int | None) -> None:
    switch = f"--trainer.callbacks+={{'class_path': 'test_mlflow_outage.ServerSwitch', 'init_args': {{'down_after': 0, 'up_after': {'null' if up_after is None else up_after}}}}}"
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=3", "--trainer.check_val_every_n_epoch=1",
                            f"--trainer.logger.init_args.tracking_uri={url}", "--trainer.logger.init_args.outage_retry_s=0"), switch])


def server_run(url: str):
    client = mlflow.MlflowClient(tracking_uri=url)
    (run,) = client.search_runs([client.get_experiment_by_name("frozenlake").experiment_id])
    return client, run


def steps(client, run, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run.info.run_id, key))


@pytest.fixture
def server(tmp_path, monkeypatch):
    global SERVER
    # a write to a killed server fails at once (connection refused) instead of retrying: the
    # outage handling under test is the same, without MLflow's seconds of back-off per write
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    SERVER = MlflowServer(tmp_path / "server")
    SERVER.workdir.mkdir()
    SERVER.start()
    yield SERVER
    SERVER.stop()


def test_server_down_for_an_epoch_loses_nothing(server, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    fit_with_switch(tiny_model_dir, tmp_path, server.url, up_after=1)
    err = capsys.readouterr().err
    assert err.count("unreachable at") == 1 and err.count("is back:") == 1, err[-3000:]
    client, run = server_run(server.url)
    assert run.info.status == "FINISHED"
    for key in ("train/loss", "train/episode/success_rate", "val/episode/success_rate", "val/wm/nll"):
        assert steps(client, run, key) == [0, 1, 2], key  # epoch 1's values were kept and sent
    assert "metric values kept and sent" in run.data.tags["paw.tracking_outage"]
    (last,) = tmp_path.glob("runs/**/last.ckpt")
    assert torch.load(last, weights_only=True)["epoch"] == 2


def test_server_gone_for_good_leaves_the_metrics_in_a_file(server, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    fit_with_switch(tiny_model_dir, tmp_path, server.url, up_after=None)
    err = capsys.readouterr().err
    assert err.count("unreachable at") == 1 and err.count("still unreachable") == 1, err[-3000:]
    (unsent,) = tmp_path.glob("unsent_mlflow_*.jsonl")
    (last,) = tmp_path.glob("runs/**/last.ckpt")
    assert torch.load(last, weights_only=True)["epoch"] == 2  # checkpoints never needed the server
    server.start()
    sent = subprocess.run([sys.executable, "-m", "paw_lightning.tracking.resend", str(unsent), server.url], capture_output=True, text=True, check=True)
    assert "sent " in sent.stdout and "Warning" not in sent.stderr
    client, run = server_run(server.url)
    assert steps(client, run, "train/loss") == [0, 1, 2] and steps(client, run, "val/episode/success_rate") == [0, 1, 2]
    assert "paw.tracking_outage" in run.data.tags and run.info.status == "FINISHED"


def test_unreachable_server_at_the_start_is_one_line(tiny_model_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *tiny_args(tiny_model_dir, tmp_path, f"--trainer.logger.init_args.tracking_uri={url}")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "unreachable" in lines[0] and url in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("runs/**/*.ckpt"))

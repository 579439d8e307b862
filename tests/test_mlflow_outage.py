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
from mlflow.entities import Metric, Param, RunTag

from paw_lightning.cli import main
from paw_lightning.tracking.outage import OutageTolerantClient
from paw_lightning.tracking.resend import resend

from helpers import MlflowServer, empty_store, free_port, tiny_args

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


@pytest.mark.slow  # an MLflow server process and a fit
def test_server_down_for_an_epoch_loses_nothing(server, tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
    fit_with_switch(tiny_model_dir, tmp_path, server.url, up_after=1)
    err = capsys.readouterr().err
    assert err.count("unreachable at") == 1 and err.count("is back:") == 1, err[-3000:]
    client, run = server_run(server.url)
    assert run.info.status == "FINISHED"
    for key in ("train/loss", "train/episode/success_rate", "val/episode/success_rate", "val/wm_onpolicy/nll"):
        assert steps(client, run, key) == [0, 1, 2], key  # epoch 1's values were kept and sent
    assert "metric values kept and sent" in run.data.tags["paw.tracking_outage"]
    (last,) = tmp_path.glob("runs/**/last.ckpt")
    assert torch.load(last, weights_only=True)["epoch"] == 2


@pytest.mark.slow  # an MLflow server process and a fit
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


@pytest.mark.slow  # the CLI in a subprocess
def test_unreachable_server_at_the_start_is_one_line(tiny_model_dir, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *tiny_args(tiny_model_dir, tmp_path, f"--trainer.logger.init_args.tracking_uri={url}")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "unreachable" in lines[0] and url in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert not list(tmp_path.glob("runs/**/*.ckpt"))


class Unreachable:
    """An ``MlflowClient`` whose server never answers."""

    def log_batch(self, *args, **kwargs):
        raise OSError("Connection refused")


def test_batches_kept_in_an_outage_go_to_a_file_that_resend_logs_into_the_run(tmp_path, capsys):
    """Without a server: two batches are kept, written at the end with the run's status, and
    ``resend`` logs them into that run of another store (values, steps, param, tags, status)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    empty_store(tmp_path / "mlflow.db")
    store = mlflow.MlflowClient(tracking_uri=uri)
    run_id = store.create_run(store.create_experiment("frozenlake")).info.run_id
    client = OutageTolerantClient(Unreachable(), "http://127.0.0.1:9", retry_every=0, unsent_dir=tmp_path)
    client.log_batch(run_id, metrics=[Metric("train/loss", 0.5, 1000, 0)], params=[Param("seed", "0")], tags=[RunTag("env", "frozenlake")])
    client.log_batch(run_id=run_id, metrics=[Metric("train/loss", 0.25, 2000, 1)])
    path = client.close(run_id, "FINISHED")
    err = capsys.readouterr().err
    assert err.count("unreachable at") == 1 and "2 metric values of run" in err and f"paw_lightning.tracking.resend {path}" in err
    assert path == tmp_path / f"unsent_mlflow_{run_id}.jsonl" and len(path.read_text().splitlines()) == 3  # two batches, the status

    assert resend(path, uri) == 2
    run = store.get_run(run_id)
    assert [(m.step, m.value) for m in sorted(store.get_metric_history(run_id, "train/loss"), key=lambda m: m.step)] == [(0, 0.5), (1, 0.25)]
    assert run.data.params == {"seed": "0"} and run.data.tags["env"] == "frozenlake" and run.info.status == "FINISHED"
    assert run.data.tags["paw.tracking_outage"] == f"metrics sent after the run from {path.name}"

"""One MLflow SQLite store shared by three concurrent fits while one of them is killed with
``kill -9`` mid-epoch and resumed (what the learning benchmark's ``--jobs`` does to its store,
plus a crash): every run's metrics and tags equal those of the same fit run alone in its own
store, the store passes SQLite's integrity check, and no metric step is written more often than
alone except the killed epoch's redo, whose values agree."""
from __future__ import annotations

import sqlite3
import subprocess
import threading
from collections import Counter

import pytest

from paw_lightning.testing.kill import comparable_keys, differences, fit_command, kill_and_resume

from helpers import empty_store, tiny_args

pytestmark = pytest.mark.slow  # four fits in subprocesses, three of them at once

EPOCHS = 3
KILLED = "b"
VOLATILE_TAGS = ("mlflow.runName", "mlflow.user", "mlflow.source.name", "mlflow.source.type", "mlflow.log-model.history", "resume.changed")


def run_state(uri: str, name: str) -> tuple[dict, dict[str, list[tuple[int, float]]], str]:
    """The run called ``name`` in the store: its tags, every metric's full history (step, value) in
    the order written, and its status."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("frozenlake").experiment_id], filter_string=f"attributes.run_name = '{name}'")
    history = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.timestamp, m.step))]
               for key in run.data.metrics}
    return dict(run.data.tags), history, run.info.status


def last_values(history: dict[str, list[tuple[int, float]]]) -> dict[str, dict[int, float]]:
    return {key: dict(points) for key, points in history.items()}


def writes(points: list[tuple[int, float]]) -> Counter:
    """How many times each step was written."""
    return Counter(step for step, _ in points)


def comparable_tags(tags: dict) -> dict:
    return {k: v for k, v in tags.items() if k not in VOLATILE_TAGS}


def test_three_fits_share_one_store_through_a_kill(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # three fits on two cores: one thread each, the reference too
    extra = (f"--trainer.max_epochs={EPOCHS}", "--trainer.check_val_every_n_epoch=1")
    alone = tmp_path / "alone"
    alone.mkdir()
    subprocess.run(fit_command(tiny_args(tiny_model_dir, alone, *extra, "--trainer.logger.init_args.run_name=alone")), cwd=alone, check=True, capture_output=True)
    ref_tags, ref_history, _ = run_state(f"sqlite:///{alone / 'mlflow.db'}", "alone")
    reference = last_values(ref_history)
    assert len(comparable_keys(reference)) > 20

    store = tmp_path / "shared.db"
    empty_store(store)
    uri = f"sqlite:///{store}"

    def args(name: str) -> list[str]:
        workdir = tmp_path / name
        workdir.mkdir()
        return tiny_args(tiny_model_dir, workdir, *extra, f"--trainer.logger.init_args.tracking_uri={uri}", f"--trainer.logger.init_args.run_name={name}")

    killed: dict = {}
    victim = threading.Thread(target=lambda: killed.update(result=kill_and_resume(args(KILLED), tmp_path / KILLED, uri, "frozenlake", "update", 1, 0.0)))
    others = {name: subprocess.Popen(fit_command(args(name)), cwd=tmp_path / name, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for name in ("a", "c")}
    victim.start()
    for name, process in others.items():
        _, stderr = process.communicate(timeout=900)
        assert process.returncode == 0, f"fit {name}: {stderr[-2000:]}"
    victim.join(timeout=1800)
    result = killed["result"]
    assert result.killed and result.resumed, result.error

    with sqlite3.connect(store) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    for name in ("a", KILLED, "c"):
        tags, history, status = run_state(uri, name)
        assert status == "FINISHED", name
        assert differences(reference, last_values(history), comparable_keys(reference)) == [], name
        assert comparable_tags(tags) == comparable_tags(ref_tags), name
        for key, points in history.items():
            surplus = writes(points) - writes(ref_history.get(key, []))  # Lightning itself logs `epoch` twice a step
            if name != KILLED:
                assert not surplus, f"{name}: {key} written more often than alone at steps {sorted(surplus)}"
            else:  # only the killed epoch's steps, written again by the resume, with the same values
                values = {}
                for step, value in points:
                    values.setdefault(step, []).append(value)
                assert all(max(values[s]) - min(values[s]) <= 1e-5 * max(1.0, abs(values[s][0])) for s in surplus), (key, surplus)

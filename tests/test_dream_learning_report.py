"""The learning benchmark's report adds the dream table when the runs logged ``val/dream/*``
(experiments/learning.py), and leaves it out when they did not."""
from __future__ import annotations

import sys

import mlflow

from helpers import ROOT, empty_store

sys.path.insert(0, str(ROOT / "experiments"))
import learning  # noqa: E402

DREAM = {  # (objective, seed) -> metric -> {epoch: value}; epoch -1 is the validation before the first update
    ("vanilla", 0): {"exact_at_1": {-1: 0.5, 3: 0.6}, "success": {-1: 0.0, 3: 0.5}, "replay_success": {-1: 0.25, 3: 0.5}, "first_divergence": {-1: 1.0, 3: 2.0}},
    ("vanilla", 1): {"exact_at_1": {-1: 0.5, 3: 0.8}, "success": {-1: 0.0, 3: 0.25}, "replay_success": {-1: 0.25, 3: 0.5}, "first_divergence": {-1: 1.0, 3: 3.0}},
    ("paw", 0): {"exact_at_1": {-1: 0.5, 3: 1.0}, "success": {-1: 0.0, 3: 1.0}, "replay_success": {-1: 0.25, 3: 1.0}, "first_divergence": {-1: 1.0, 3: 5.0}},
}


def _store(tmp_path, dream: bool) -> str:
    empty_store(tmp_path / "mlflow.db")  # no schema migrations
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("learning")
    for (objective, seed), metrics in DREAM.items():
        run = client.create_run(exp, run_name=f"gigpo+{objective}/seed{seed}", tags={"objective_overlay": objective, "algorithm_overlay": "gigpo", "seed": str(seed)})
        rid = run.info.run_id
        for epoch in (-1, 3):
            client.log_metric(rid, "val/episode/success_rate", 0.5, step=epoch)
            client.log_metric(rid, "val/episode/invalid_rate", 0.0, step=epoch)
        for epoch in range(4):
            client.log_metric(rid, "train/episode/success_rate", 0.1, step=epoch)
            client.log_metric(rid, "train/episode/invalid_rate", 0.0, step=epoch)
        if dream:
            for key, values in metrics.items():
                for epoch, value in values.items():
                    client.log_metric(rid, f"val/dream/{key}", value, step=epoch)
        client.set_terminated(rid)
    return uri


def test_the_report_adds_the_dream_table_when_runs_logged_it_and_only_then(tmp_path):
    (tmp_path / "with").mkdir()
    text = learning.write_report(_store(tmp_path / "with", dream=True), "learning", tmp_path / "with", ["gigpo"], ["vanilla", "paw"])
    table = text.split("The world model as a simulator")[1]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines() if line.startswith("| ") and "exact@1" not in line}
    # columns: exact@1..4 %, success in the model %, replay success %, first divergence, seeds
    assert rows["gigpo + vanilla, before RL (warm-up)"] == ["50.0 ± 0.0", "–", "–", "–", "0.0 ± 0.0", "25.0 ± 0.0", "1.000 ± 0.000", "2"]
    assert rows["gigpo + vanilla, after the last update"] == ["70.0 ± 14.1", "–", "–", "–", "37.5 ± 17.7", "50.0 ± 0.0", "2.500 ± 0.707", "2"]
    assert rows["gigpo + paw, after the last update"] == ["100.0", "–", "–", "–", "100.0", "100.0", "5.000", "1"]
    (tmp_path / "without").mkdir()
    text = learning.write_report(_store(tmp_path / "without", dream=False), "learning", tmp_path / "without", ["gigpo"], ["vanilla", "paw"])
    assert "The world model as a simulator" not in text

"""A tiny fit and test with ``data.evaluation.dream`` on: ``val/dream/*`` and ``test/dream/*`` in
MLflow and in the evaluation reports, beside ``val/wm/*``."""
from __future__ import annotations

import contextlib
import json

import pytest

from helpers import mlflow_runs, tiny_args

from paw_lightning.cli import main

pytestmark = pytest.mark.slow  # fits

DREAM = ["--data.evaluation.dream.tasks=2", "--data.evaluation.dream.horizon=2", "--trainer.max_epochs=1"]
KEYS = ("exact_at_1", "cer_at_1", "state_match_at_1", "success", "judged", "replay_success", "first_divergence", "never_diverged", "episodes")


def test_fit_and_test_log_the_dream_measures(tiny_model_dir, tmp_path):
    with contextlib.chdir(tmp_path):
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, *DREAM)])
        (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
        main(["test", *tiny_args(tiny_model_dir, tmp_path, *DREAM, "--data.evaluation.test_groups=2"), f"--ckpt_path={ckpt}"])
    client, (fitted, tested) = mlflow_runs(tmp_path)
    for run, split in ((fitted, "val"), (tested, "test")):
        metrics = run.data.metrics
        assert f"{split}/wm/exact_match" in metrics
        for key in KEYS:
            assert f"{split}/dream/{key}" in metrics, (split, key, sorted(metrics))
        assert metrics[f"{split}/dream/episodes"] == 2.0 and metrics[f"{split}/dream/judged"] == 1.0
        assert 0.0 <= metrics[f"{split}/dream/exact_at_1"] <= 1.0 and 1.0 <= metrics[f"{split}/dream/first_divergence"] <= 3.0
        (path,) = tmp_path.glob(f"runs/*/{run.info.run_id}/eval/{split}_*.json")
        report = json.loads(path.read_text())
        assert report["metrics"][f"{split}/dream/replay_success"] == pytest.approx(metrics[f"{split}/dream/replay_success"])
        assert report["eval"]["dream"] == {"horizon": 2, "tasks": 2}

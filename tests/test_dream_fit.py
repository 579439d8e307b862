"""A tiny fit and test with ``data.evaluation.dream`` on: ``val/dream/*`` and ``test/dream/*`` in
MLflow and in the evaluation reports, beside ``val/wm_onpolicy/*``."""
from __future__ import annotations

import contextlib
import json

import pytest

from helpers import ROOT, mlflow_runs, tiny_args

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
        assert f"{split}/wm_onpolicy/exact_match" in metrics
        for key in KEYS:
            assert f"{split}/dream/{key}" in metrics, (split, key, sorted(metrics))
        assert metrics[f"{split}/dream/episodes"] == 2.0 and metrics[f"{split}/dream/judged"] == 1.0
        assert 0.0 <= metrics[f"{split}/dream/exact_at_1"] <= 1.0 and 1.0 <= metrics[f"{split}/dream/first_divergence"] <= 3.0
        (path,) = tmp_path.glob(f"runs/*/{run.info.run_id}/eval/{split}_*.json")
        report = json.loads(path.read_text())
        assert report["metrics"][f"{split}/dream/replay_success"] == pytest.approx(metrics[f"{split}/dream/replay_success"])
        assert report["eval"]["dream"] == {"horizon": 2, "tasks": 2}


def test_the_dream_evaluation_leaves_training_as_it_was(tiny_model_dir, tmp_path):
    """The tiny config validates after every epoch: the validation after the first update dreams,
    and the second update after it is the one of a run without the dream (its generation forks
    the RNG), so every ``train/`` metric (the latest: the second update's) is the same."""
    logged = []
    for name, extra in (("plain", []), ("dream", DREAM[:2])):
        directory = tmp_path / name
        directory.mkdir()
        with contextlib.chdir(directory):
            main(["fit", *tiny_args(tiny_model_dir, directory, "--trainer.max_epochs=2", *extra)])
        client, (run,) = mlflow_runs(directory)
        assert ("val/dream/episodes" in run.data.metrics) == bool(extra)
        logged.append({k: v for k, v in run.data.metrics.items() if k.startswith("train/") and not k.startswith(("train/perf/", "train/memory/"))})
    plain, dream = logged
    assert plain and plain.keys() == dream.keys()
    assert dream == pytest.approx(plain, abs=0.0), {k: (plain[k], dream[k]) for k in plain if plain[k] != dream[k]}


@pytest.mark.parametrize("config, extra", [
    ("configs/alfworld.yaml", []),
    ("configs/webshop.yaml", ["--data.env_kwargs.cache_dir={cache}", "--data.evaluation.env_kwargs.cache_dir={cache}"]),
    ("configs/search_qa.yaml", ["--data.env_kwargs.cache_dir={cache}", "--data.evaluation.env_kwargs.cache_dir={cache}"]),
    ("configs/frozenlake.yaml", ["-c", "configs/sokoban.yaml"]),
    ("configs/frozenlake.yaml", ["-c", "configs/sudoku.yaml"]),
])
def test_every_environment_config_dreams(tiny_model_dir, tmp_path, monkeypatch, config, extra):
    """``data.evaluation.dream`` on in each environment's config: a validation logs the dream's
    replay and divergence (fidelity too where the tiny model's held-out episodes have world-model
    targets: its search-QA actions are all invalid, and an invalid action has none); success
    inside the model only where the environment judges (not ALFWorld, WebShop or search QA)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WEBSHOP_DATA", raising=False)
    extra = [str(ROOT / a) if a.startswith("configs/") else a.format(cache=tmp_path / "cache") for a in extra]
    main(["validate", *tiny_args(tiny_model_dir, tmp_path, *extra, "--data.evaluation.dream.tasks=1", "--data.evaluation.dream.horizon=2",
                                 "--data.evaluation.groups=1", "--trainer.logger.init_args.experiment_name=dream", config=config)])
    _, (run,) = mlflow_runs(tmp_path, experiment="dream")
    metrics = run.data.metrics
    for key in ("replay_success", "first_divergence", "never_diverged", "episodes", "judged", "length"):
        assert f"val/dream/{key}" in metrics, (config, extra, key, sorted(metrics))
    if "search_qa" not in config:
        assert "val/dream/exact_at_1" in metrics and "val/dream/cer_at_1" in metrics, (config, extra)
    judged = metrics["val/dream/judged"] == 1.0
    assert judged == ("sokoban" in str(extra) or "sudoku" in str(extra)) and (("val/dream/success" in metrics) == judged)

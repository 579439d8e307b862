"""notebooks/compare_runs.ipynb runs top to bottom against the MLflow store of a real tiny
fit (2 epochs) and saves its figures."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from paw_lightning.cli import main

from helpers import ROOT, tiny_args

FIGURES = ["val_episode_success_rate", "train_episode_success_rate", "val_episode_return_mean", "train_episode_return_mean",
           "train_wm_loss", "train_wm_lambda_mean", "train_wm_clipped_ratio"]


@pytest.mark.slow
def test_compare_runs_notebook_saves_its_figures(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.logger.init_args.experiment_name=nb",
                           "--trainer.logger.init_args.run_name=grpo+paw/seed0")])
    monkeypatch.setenv("PAW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("PAW_EXPERIMENT", "nb")
    monkeypatch.setenv("PAW_FIGURES_DIR", str(tmp_path / "figures"))
    notebook = nbformat.read(ROOT / "notebooks/compare_runs.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()

    for name in FIGURES:
        path = tmp_path / "figures" / f"{name}.png"
        assert path.is_file() and path.stat().st_size > 1000, path
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    outputs = "".join(out.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "1 finished runs in 'nb'" in outputs and "| grpo+paw |" in outputs, outputs
    images = [out for cell in notebook.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert len(images) == len(FIGURES)  # every figure is also shown

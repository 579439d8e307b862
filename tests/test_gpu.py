"""GPU runs of the real embedded model (marked ``gpu``: skipped on machines without CUDA)."""
from __future__ import annotations

import os

import pytest

from paw_lightning.cli import main

from helpers import ROOT, metric_history, mlflow_runs

pytestmark = pytest.mark.slow  # fits of the embedded model (and gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("overlay", [[], ["-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--trainer.devices=1"]])
def test_embedded_model_fits_on_gpu(tmp_path, monkeypatch, overlay):
    monkeypatch.chdir(tmp_path)
    main([
        "fit", "-c", str(ROOT / "configs/frozenlake.yaml"), *overlay,
        "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed", "--trainer.max_epochs=2",
        "--trainer.check_val_every_n_epoch=2", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"--trainer.default_root_dir={tmp_path / 'runs'}", "--data.progress=false",
    ])
    client, (run,) = mlflow_runs(tmp_path)
    assert len(metric_history(client, run, "train/loss")) == 2
    assert len(metric_history(client, run, "val/episode/success_rate")) == 2  # before the first update, after epoch 1
    assert metric_history(client, run, "system/gpu_memory_allocated_gib")[-1] > 0.1  # the model lived on the GPU


@pytest.mark.gpu
def test_vllm_engine_fits_and_matches_the_trainer(tmp_path, monkeypatch):
    """Never run on this project's machines (no GPU): the vLLM engine end to end, with its
    engine/trainer gap small enough for TIS to be a correction, not a rewrite."""
    pytest.importorskip("vllm")
    monkeypatch.chdir(tmp_path)
    llm_kwargs = os.environ.get("PAW_TEST_VLLM_KWARGS", '{"enforce_eager": true}')  # e.g. an attention backend the machine has
    main([
        "fit", "-c", str(ROOT / "configs/frozenlake.yaml"), "--model.engine=paw_lightning.rollout.vllm_engine.VLLMEngine",
        f"--model.engine.llm_kwargs={llm_kwargs}",
        "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed", "--trainer.max_epochs=2",
        "--trainer.check_val_every_n_epoch=2", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"--trainer.default_root_dir={tmp_path / 'runs'}", "--data.progress=false",
    ])
    client, (run,) = mlflow_runs(tmp_path)
    assert len(metric_history(client, run, "train/loss")) == 2
    assert max(metric_history(client, run, "train/rollout/engine_kl")) < 0.1

"""Resuming from a checkpoint continues exactly where an uninterrupted run would be."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.cli import main

from helpers import metric_history, mlflow_runs, tiny_args

pytestmark = pytest.mark.slow  # every test runs fits


def test_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch):
    keys = ["train/loss", "train/policy/loss", "train/wm/loss", "train/episode/return_mean"]
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    for d in (full_dir, cut_dir):
        d.mkdir()
    monkeypatch.chdir(tmp_path)
    common = ["--trainer.check_val_every_n_epoch=10", "--data.ppo_epochs=2", "--model.optimizer.init_args.lr=0.01"]
    main(["fit", *tiny_args(tiny_model_dir, full_dir, "--trainer.max_epochs=3", *common)])
    main(["fit", *tiny_args(tiny_model_dir, cut_dir, "--trainer.max_epochs=2", *common)])
    (ckpt,) = cut_dir.glob("runs/**/last.ckpt")
    checkpoint = torch.load(ckpt, weights_only=False)
    assert "rng_states" in checkpoint and checkpoint["optimizer_states"]
    assert checkpoint["nonfinite_steps"] == {"skipped": 0, "consecutive": 0}  # a resumed run counts skipped steps on from these
    assert checkpoint["state_dict"] and all("lora_" in k for k in checkpoint["state_dict"]), "only LoRA weights are saved"
    main(["fit", *tiny_args(tiny_model_dir, cut_dir, "--trainer.max_epochs=3", *common), f"--ckpt_path={ckpt}"])

    client, (full,) = mlflow_runs(full_dir)
    client_cut, (resumed,) = mlflow_runs(cut_dir)  # the resumed fit continues its checkpoint's MLflow run
    for key in keys:
        uninterrupted = metric_history(client, full, key)
        continued = metric_history(client_cut, resumed, key)
        assert len(uninterrupted) == len(continued) == 3, key
        assert all(abs(a - b) < 1e-5 for a, b in zip(uninterrupted, continued)), (key, uninterrupted, continued)


def test_a_resume_trains_at_the_configs_learning_rate(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """The advice for a run stopped by non-finite steps: resume with a lower learning rate. The
    checkpoint's optimizer state would bring the old one back; the config's is used, and said."""
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--model.optimizer.init_args.lr=0.01")])
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    capsys.readouterr()
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2", "--model.optimizer.init_args.lr=0.001"), f"--ckpt_path={ckpt}"])
    err = capsys.readouterr().err
    assert "optimizer: the config's settings replace the checkpoint's: lr 0.01 → 0.001" in err
    (group,) = torch.load(ckpt, weights_only=False)["optimizer_states"][0]["param_groups"]
    assert group["lr"] == 0.001  # the epoch after the resume trained, and was saved, at the new rate
    # the resume names what it changed against the run's logged config (not the run's length), and tags the run with it
    (warning,) = [line for line in err.splitlines() if line.startswith("warning: resuming MLflow run")]
    assert warning.endswith("with 1 setting changed from its config: model.optimizer.init_args.lr: 0.01 → 0.001"), warning
    _, (run,) = mlflow_runs(tmp_path)
    assert run.data.tags["resume.changed"] == "model.optimizer.init_args.lr: 0.01 → 0.001"


def test_validate_base_model_and_test_a_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["validate", *tiny_args(tiny_model_dir, tmp_path)])  # no checkpoint: the base model's row
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1")])
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    main(["test", *tiny_args(tiny_model_dir, tmp_path, "--data.evaluation.test_groups=2"), f"--ckpt_path={ckpt}"])
    client, (validated, _, tested) = mlflow_runs(tmp_path)
    assert validated.data.metrics["val/episode/episode_length"] == 2.0  # max_steps of the tiny overlay
    assert {"test/episode/success_rate", "test/episode/invalid_rate", "test/wm_onpolicy/nll"} <= set(tested.data.metrics)


def test_a_fresh_fit_starts_from_an_earlier_runs_weights(tiny_model_dir, tmp_path, monkeypatch):
    """--model.init_weights: the new fit's LoRA weights start as the checkpoint's (its own
    epoch 0, optimizer and MLflow run), e.g. policy RL after a world-model stage."""
    from paw_lightning.cli import PawCLI

    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", "--model.optimizer.init_args.lr=0.01")])
    (ckpt,) = tmp_path.glob("runs/**/last.ckpt")
    saved = torch.load(ckpt, weights_only=True)["state_dict"]
    cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path, f"--model.init_weights={ckpt}"), run=False)
    cli.model.configure_model()
    weights = dict(cli.model.named_parameters())
    assert saved and all(torch.equal(weights[name], value) for name, value in saved.items())
    assert any(value.abs().max() > 0 for name, value in saved.items() if "lora_B" in name)  # trained, not the zero init
    other_rank = PawCLI(args=tiny_args(tiny_model_dir, tmp_path, f"--model.init_weights={ckpt}", "--model.lm.lora_r=4"), run=False)
    with pytest.raises(ValueError, match="LoRA rank"):
        other_rank.model.configure_model()
    with pytest.raises(FileNotFoundError, match="init_weights"):
        PawCLI(args=tiny_args(tiny_model_dir, tmp_path, "--model.init_weights=nowhere.ckpt"), run=False)

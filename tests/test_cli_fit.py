"""End to end through the CLI entry point on FrozenLake with the tiny model."""
from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from paw_lightning.cli import PawCLI, main

from helpers import ROOT, metric_history, mlflow_runs, tiny_args

pytestmark = pytest.mark.slow  # every test runs a fit


class ProgressBarMetrics(Callback):
    """Keeps what the progress bar would show at the end of the last validation."""

    metrics: dict = {}

    def on_validation_end(self, trainer, pl_module):
        self.metrics = dict(trainer.progress_bar_metrics)


def test_fit_trains_lora_only_and_logs_to_mlflow(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = PawCLI(args=[*tiny_args(tiny_model_dir, tmp_path)], run=False)
    seen = ProgressBarMetrics()
    cli.trainer.callbacks.append(seen)
    cli.trainer.fit(cli.model, cli.datamodule)  # what `main(["fit", …])` runs, keeping the objects
    before_cli = PawCLI(args=[*tiny_args(tiny_model_dir, tmp_path)], run=False)
    before_cli.model.configure_model()
    before = dict(before_cli.model.lm.named_parameters())
    after = dict(cli.model.lm.named_parameters())
    lora = [n for n, p in after.items() if p.requires_grad]
    frozen = [n for n, p in after.items() if not p.requires_grad]
    assert lora and all("lora_" in n for n in lora)
    assert any(not torch.equal(after[n], before[n]) for n in lora), "LoRA weights did not change"
    assert all(torch.equal(after[n], before[n]) for n in frozen), "a frozen base weight changed"

    client, runs = mlflow_runs(tmp_path)
    run = runs[0]
    for key in ("train/loss", "train/policy/loss", "train/policy/kl", "train/policy/clip_frac", "train/wm/loss",
                "train/wm/lambda_mean", "train/wm/clipped_ratio", "train/wm/selected_fraction", "train/wm/entropy_p50",
                "train/episode/success_rate", "train/episode/invalid_rate",
                "val/episode/success_rate", "val/episode/return_mean", "val/episode/episode_length",
                "val/episode/invalid_rate", "val/wm_onpolicy/nll", "val/wm_onpolicy/token_acc", "val/wm_onpolicy/exact_match", "val/wm_onpolicy/cer"):
        assert len(metric_history(client, run, key)) == 2, key  # one value per epoch
    # where the last iteration's time went: seconds per phase, tokens/s = this rollout's tokens / seconds
    perf = {key: metric_history(client, run, f"train/perf/{key}") for key in ("rollout_s", "scoring_s", "update_s", "rollout_tokens_per_s", "update_tokens_per_s")}
    assert all(len(values) == 2 and min(values) > 0 for values in perf.values()), perf
    buffer = cli.datamodule.played["train"].samples  # the last update's samples, as trained (unselected transitions cut after the response)
    generated = sum(int(mask.sum()) for mask in buffer.action_mask)
    trained = sum(ids.numel() for ids in buffer.input_ids) * cli.datamodule.ppo_epochs
    assert abs(perf["rollout_tokens_per_s"][-1] * perf["rollout_s"][-1] - generated) < 1e-6 * generated
    assert abs(perf["update_tokens_per_s"][-1] * perf["update_s"][-1] - trained) < 1e-6 * trained
    artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
    assert "config.yaml" in artifacts
    config = client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))
    assert "paw_lightning.objectives.ClippedMAE" in open(config).read()
    assert run.data.params["seed"] == "0"
    assert run.data.tags["env"] == "frozenlake" and run.data.tags["git_sha"]
    # what the config leaves to the machine: the tiny model in float32, on a CPU with this process's threads
    assert run.data.tags["runtime.base_dtype"] == "float32" and run.data.tags["runtime.precision"] == "32-true"
    assert run.data.tags["runtime.world_size"] == "1"
    assert run.data.tags["runtime.versions"].startswith(f"torch {torch.__version__}, transformers ")
    if cli.trainer.strategy.root_device.type == "cpu":
        assert run.data.tags["runtime.torch_threads"] == str(torch.get_num_threads())
        assert run.data.tags["runtime.device"].endswith(" logical CPUs)")
    # the progress bar shows the latest success and return of training and validation; not in MLflow twice
    bar = seen.metrics
    assert {"train_success", "train_return", "val_success", "val_return"} <= set(bar), bar
    assert bar["val_success"] == run.data.metrics["val/episode/success_rate"]
    assert "train_success" not in run.data.metrics


def test_world_model_loss_falls_when_trained_alone(tiny_model_dir, tmp_path, monkeypatch):
    """With the RL term switched off, the next-observation CE must go down epoch after epoch."""
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/objectives/echo.yaml"), "--trainer.max_epochs=4", "--trainer.check_val_every_n_epoch=10",
                           "--data.ppo_epochs=2", "--model.policy_objective.init_args.kl_coef=0",
                           "--model.optimizer.init_args.lr=0.01", "--data.rollout.temperature=0")])
    client, runs = mlflow_runs(tmp_path)
    losses = metric_history(client, runs[0], "train/wm/loss")
    assert len(losses) == 4 and losses[-1] < losses[0] * 0.95, losses


def test_vanilla_rl_without_world_model(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.world_model_objective=null", "--trainer.max_epochs=1")])
    client, runs = mlflow_runs(tmp_path)
    metrics = runs[0].data.metrics
    assert "train/policy/loss" in metrics and not any(k.startswith("train/wm/") for k in metrics)
    assert runs[0].data.tags["world_model_objective"] == "none"


def test_a_fit_without_updates_plays_no_rollout(tiny_model_dir, tmp_path, monkeypatch):
    """``fit --trainer.max_epochs=0`` (the warm-up alone, SPA's stages alone): Lightning still
    asks for the training data, and no episode is played for it."""
    from paw_lightning.data import RolloutDataModule

    played = []
    original = RolloutDataModule._episodes
    monkeypatch.setattr(RolloutDataModule, "_episodes", lambda self, split, *a: played.append(split) or original(self, split, *a))
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=0", "--summary.enabled=false")])
    assert "train" not in played
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1")])
    assert played.count("train") == 1  # the one update's rollout

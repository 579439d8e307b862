"""A checkpoint written by 2 FSDP2 processes (gloo, CPU) resumes in 1 plain process, and the reverse.

Greedy rollouts, no KL term: then 1 and 2 processes train identically (see
test_fsdp_fit.py), so every checkpoint and every resumed epoch is compared with one
uninterrupted single-process run. The 2-process fits also turn on activation checkpointing
of the decoder layers and token-budget micro-batches (numerically no-ops): with samples of
≈ 1100–1460 tokens, a 2900-token budget gives rank 0 (group 0) three micro-batches and
rank 1 two, so rank 1 runs a zero-weight pass to stay in step with rank 0's collectives.
"""
from __future__ import annotations

import subprocess
import sys

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from paw_lightning.cli import main
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule

from helpers import ROOT, metric_history, mlflow_runs, tiny_args

COMMON = ["--trainer.accelerator=cpu", "--data.rollout.temperature=0", "--data.evaluation.temperature=0", "--trainer.check_val_every_n_epoch=10",
          "--model.optimizer.init_args.lr=0.01", "--data.mini_batch_size=8", "--model.policy_objective.init_args.kl_coef=0"]
# rollouts with the weights gathered per forward (fsdp2.yaml gathers once per rollout, as test_fsdp_fit.py runs it)
FSDP2 = ["-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--model.lm.gradient_checkpointing=true", "--model.micro_batch_tokens=2900", "--model.gather_weights_for_generation=false"]


def fit_one(model_dir, workdir, *extra):
    workdir.mkdir()
    main(["fit", *tiny_args(model_dir, workdir, *COMMON, *extra)])


def fit_two(model_dir, workdir, *extra):
    workdir.mkdir()
    args = tiny_args(model_dir, workdir, *COMMON, *FSDP2, *extra)
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]


def checkpoint(workdir, pattern="last.ckpt"):
    (path,) = workdir.glob(f"runs/**/{pattern}")
    return path, torch.load(path, map_location="cpu", weights_only=False)


def assert_same_training_state(actual: dict, expected: dict):
    assert actual["state_dict"].keys() == expected["state_dict"].keys() and all("lora_" in k for k in actual["state_dict"])
    for name, tensor in expected["state_dict"].items():
        assert actual["state_dict"][name].shape == tensor.shape, name  # full tensors, not one rank's shard
        torch.testing.assert_close(actual["state_dict"][name], tensor, atol=1e-5, rtol=0, msg=name)
    (optimizer,), (expected_optimizer,) = actual["optimizer_states"], expected["optimizer_states"]
    assert optimizer["state"].keys() == expected_optimizer["state"].keys()
    for name, state in expected_optimizer["state"].items():
        torch.testing.assert_close(optimizer["state"][name]["exp_avg"], state["exp_avg"], atol=1e-5, rtol=0, msg=name)


def last_loss(workdir):
    client, runs = mlflow_runs(workdir)
    return metric_history(client, runs[-1], "train/loss")[-1]


@pytest.mark.slow
def test_checkpoints_resume_across_world_sizes(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    single = tmp_path / "single"  # the reference: 1 process, 2 epochs, a checkpoint after each
    fit_one(tiny_model_dir, single, "--trainer.max_epochs=2", "--checkpoint.save_top_k=-1")
    first_path, first = checkpoint(single, "epoch=0-*.ckpt")
    _, final = checkpoint(single)

    two = tmp_path / "two"  # 2 processes, epoch 1: the same state as the reference's after epoch 1
    fit_two(tiny_model_dir, two, "--trainer.max_epochs=1")
    two_path, two_first = checkpoint(two)
    assert_same_training_state(two_first, first)

    two_to_one = tmp_path / "two_to_one"  # its epoch 2 in 1 process
    fit_one(tiny_model_dir, two_to_one, "--trainer.max_epochs=2", f"--ckpt_path={two_path}")
    assert_same_training_state(checkpoint(two_to_one)[1], final)

    one_to_two = tmp_path / "one_to_two"  # the reference's epoch 1 continued by 2 processes
    fit_two(tiny_model_dir, one_to_two, "--trainer.max_epochs=2", f"--ckpt_path={first_path}")
    assert_same_training_state(checkpoint(one_to_two)[1], final)

    for resumed in (two_to_one, one_to_two):
        assert abs(last_loss(resumed) - last_loss(single)) < 1e-4


def test_sharded_checkpoint_folders_are_refused(tiny_model_dir):
    """Plain ModelParallelStrategy saves a folder of shards by default: refused before training starts."""
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)))
    module._trainer = SimpleNamespace(reload_dataloaders_every_n_epochs=1, strategy=ModelParallelStrategy(), callbacks=[])
    with pytest.raises(ValueError, match="one full checkpoint file.*FSDP2Strategy"):
        module.on_fit_start()

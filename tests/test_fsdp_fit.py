"""FSDP2 (ModelParallelStrategy) and DDP, 2 CPU processes (gloo), train like one process on the same data.

Greedy rollouts make the episodes independent of how groups are spread over ranks: with
2 ranks each rank plays one of the 2 groups, one process plays both. The world-model loss
is a mean over groups and FSDP averages gradients over ranks, so the per-epoch losses must
agree (the policy term is 0: greedy episodes of one group are identical, and the KL term is
off because its token-mean would weigh the ranks' tokens differently).
"""
from __future__ import annotations

import subprocess
import sys

from helpers import ROOT, metric_history, mlflow_runs, tiny_args


def fit(model_dir, workdir, *extra):
    workdir.mkdir()
    args = tiny_args(model_dir, workdir, "--trainer.accelerator=cpu", "--data.temperature=0", "--data.val_temperature=0",
                     "--trainer.max_epochs=2", "--model.optimizer.init_args.lr=0.01", "--data.mini_batch_size=8",
                     "--model.policy_objective.init_args.kl_coef=0", *extra)
    result = subprocess.run([sys.executable, "-m", "paw_lightning", "fit", *args], cwd=workdir, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return mlflow_runs(workdir)


def test_fsdp2_and_ddp_two_processes_match_one(tiny_model_dir, tmp_path):
    client1, (single,) = fit(tiny_model_dir, tmp_path / "single")
    for name, extra in {"fsdp2": ["-c", str(ROOT / "configs/scale/fsdp2.yaml")], "ddp": ["--trainer.strategy=ddp", "--trainer.devices=2"]}.items():
        client2, (parallel,) = fit(tiny_model_dir, tmp_path / name, *extra)
        for key in ("train/wm/weighted_loss", "train/loss", "train/episode/return_mean", "val/episode/return_mean"):
            one, two = metric_history(client1, single, key), metric_history(client2, parallel, key)
            assert len(one) == len(two) == 2, (name, key)
            assert all(abs(a - b) < 1e-4 for a, b in zip(one, two)), (name, key, one, two)
    losses = metric_history(client1, single, "train/loss")
    assert losses[1] != losses[0]

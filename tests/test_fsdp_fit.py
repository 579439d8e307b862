"""FSDP2 (ModelParallelStrategy) and DDP, 2 CPU processes (gloo), train like one process on the same data.

Greedy rollouts make the episodes independent of how groups are spread over ranks: with
2 ranks each rank plays one of the 2 groups, one process plays both. The world-model loss
is a mean over groups and FSDP averages gradients over ranks, so the per-epoch losses must
agree (the policy term is 0: greedy episodes of one group are identical, and the KL term is
off because its token-mean would weigh the ranks' tokens differently). The FSDP2 fit rolls out
with its weights gathered once per rollout (``fsdp2.yaml``); test_checkpoint_world_size.py
fits FSDP2 with them gathered per forward.
"""
from __future__ import annotations

import math

import pytest
import torch

from helpers import ROOT, fit_in_process, fit_in_subprocess, metric_history

pytestmark = pytest.mark.slow  # fits in 2-process subprocesses


def tokens(client, run, phase: str) -> list[float]:
    """Tokens of a ``train/perf`` phase per epoch: tokens/s × seconds."""
    rates, seconds = (metric_history(client, run, f"train/perf/{phase}{suffix}") for suffix in ("_tokens_per_s", "_s"))
    return [r * s for r, s in zip(rates, seconds)]


def test_fsdp2_and_ddp_two_processes_match_one(tiny_model_dir, tmp_path):
    client1, (single,) = fit_in_process(tiny_model_dir, tmp_path / "single")
    for name, extra in {"fsdp2": ["-c", str(ROOT / "configs/scale/fsdp2.yaml")], "ddp": ["--trainer.strategy=ddp", "--trainer.devices=2"]}.items():
        # with Lightning's progress bar, as users run: on rank 0 it syncs the epoch's metrics at epoch end (a hang if
        # a collective ran in on_train_epoch_end before the other ranks' matching syncs)
        client2, (parallel,) = fit_in_subprocess(tiny_model_dir, tmp_path / name, *extra, "--trainer.enable_progress_bar=true")
        for key in ("train/wm/weighted_loss", "train/loss", "train/episode/return_mean", "val/episode/return_mean"):
            one, two = metric_history(client1, single, key), metric_history(client2, parallel, key)
            assert len(one) == len(two) == 2, (name, key)
            assert all(abs(a - b) < 1e-4 for a, b in zip(one, two)), (name, key, one, two)
        for phase in ("rollout", "update"):  # tokens summed over the ranks: the same episodes and samples as one process
            one, two = (tokens(client, run, phase) for client, run in ((client1, single), (client2, parallel)))
            assert len(one) == len(two) == 2 and all(abs(a - b) < 1e-6 * a for a, b in zip(one, two)), (name, phase, one, two)
        peaks = [metric_history(client2, parallel, f"train/memory/peak_gib/rank_{r}") for r in (0, 1)]
        assert all(len(p) == 2 and 0.05 < p[-1] < 64 for p in peaks), (name, peaks)  # each rank's peak RSS in GiB
        assert metric_history(client2, parallel, "train/memory/peak_gib") == [max(a, b) for a, b in zip(*peaks)]
    assert not any(key.startswith("train/memory/peak_gib/") for key in single.data.metrics)  # one process: no per-rank keys
    losses = metric_history(client1, single, "train/loss")
    assert losses[1] != losses[0]


def test_fsdp2_bf16_precisions_keep_the_documented_dtypes(tiny_model_dir, tmp_path):
    """``bf16-mixed`` computes in bf16 but keeps float32 LoRA weights and Adam state (what the
    checkpoint holds); ``bf16-true`` holds them in bf16. Both train, with finite losses."""
    for precision, extra, dtype in (("bf16-mixed", [], torch.float32), ("bf16-true", ["--model.lm.dtype=bfloat16"], torch.bfloat16)):
        workdir = tmp_path / precision
        client, (run,) = fit_in_subprocess(tiny_model_dir, workdir, "-c", str(ROOT / "configs/scale/fsdp2.yaml"), f"--trainer.precision={precision}", *extra)
        losses = metric_history(client, run, "train/loss")
        assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and losses[0] != losses[1], (precision, losses)
        (last,) = workdir.glob("runs/**/last.ckpt")
        checkpoint = torch.load(last, map_location="cpu", weights_only=False)
        weights = checkpoint["state_dict"]
        adam = [s for state in checkpoint["optimizer_states"] for s in state["state"].values()]
        assert weights and all("lora_" in name and w.dtype == dtype for name, w in weights.items()), precision
        assert adam and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == dtype for s in adam), precision
        assert any(w.abs().sum() > 0 for name, w in weights.items() if "lora_B" in name)  # B starts at 0: it trained

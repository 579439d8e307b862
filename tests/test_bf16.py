"""A bfloat16 base model (``model.lm.dtype: bfloat16`` or ``auto``): what the hardware decides,
what trains, and how far the sampler's log-probs are from a recomputed forward."""
from __future__ import annotations

import math

import pytest
import torch
from helpers import make_module, metric_history, mlflow_runs, sampled_buffer, tiny_args

from paw_lightning import model as model_lib
from paw_lightning.cli import PawCLI
from paw_lightning.model import LMConfig, weights_dtype
from paw_lightning.module import PaWModule
from paw_lightning.update import score


def test_auto_is_bfloat16_only_where_the_hardware_multiplies_it(monkeypatch):
    for amx, avx512_bf16, expected in ((False, False, torch.float32), (True, False, torch.bfloat16), (False, True, torch.bfloat16)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        assert weights_dtype("auto") == expected
        assert weights_dtype("auto", torch.device("cpu")) == expected
    for supported, expected in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda s=supported: s)
        assert weights_dtype("auto", torch.device("cuda", 0)) == expected
    assert weights_dtype("float32") == torch.float32 and weights_dtype("bfloat16") == torch.bfloat16


@pytest.mark.slow
def test_bfloat16_base_stays_frozen_while_float32_lora_trains_under_bf16_mixed(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(model_lib, "native_bf16", lambda device: True)  # whatever CPU runs the test
    args = tiny_args(tiny_model_dir, tmp_path, "--model.lm.dtype=auto", "--trainer.max_epochs=2")
    cli = PawCLI(args=args, run=False)
    assert cli.trainer.precision == "bf16-mixed"  # chosen for the bfloat16 base: the LoRA branch computes in bfloat16
    cli.trainer.fit(cli.model, cli.datamodule)
    before = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir), dtype="bfloat16"))
    before.configure_model()
    start, after = dict(before.lm.named_parameters()), dict(cli.model.lm.named_parameters())
    lora = [n for n, p in after.items() if p.requires_grad]
    frozen = [n for n, p in after.items() if not p.requires_grad]
    assert lora and all(after[n].dtype == torch.float32 for n in lora)  # LoRA weights and Adam's state in float32
    assert frozen and all(after[n].dtype == torch.bfloat16 for n in frozen)
    assert any(not torch.equal(after[n], start[n]) for n in lora), "LoRA weights did not change"
    assert all(torch.equal(after[n], start[n]) for n in frozen), "a frozen base weight changed"
    client, runs = mlflow_runs(tmp_path)
    losses = metric_history(client, runs[0], "train/loss")
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)


def test_bfloat16_sampler_logprobs_are_close_to_the_scoring_forward(tiny_model_dir):
    """π_old read from the sampler (KV-cached, left-padded decoding) and from a scoring forward
    (the whole sequence at once) round differently in bfloat16: close, not equal as in float32."""
    module = make_module(tiny_model_dir, dtype="bfloat16")  # a non-zero adapter, as the float32 test's
    buffer = sampled_buffer(module)
    sampler_old = list(buffer.sampler_logprobs)
    score(module.update_inputs(), buffer)
    gaps = torch.cat([(a - b)[m[: a.numel()]].abs() for a, b, m in zip(sampler_old, buffer.old_logprobs, buffer.action_mask)])
    assert gaps.numel() > 10
    print(f"bfloat16 |log π_sampler − log π_scoring|: mean {gaps.mean():.4f}, max {gaps.max():.4f}")
    assert gaps.mean() < 5e-3 and gaps.max() < 5e-2  # measured: mean 3e-4, max 2e-3 (float32: < 1e-4 everywhere)

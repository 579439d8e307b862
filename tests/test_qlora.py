"""QLoRA (model.lm.quantization=nf4): the 4-bit config FSDP-QLoRA needs, the documented
refusals, and a CPU fit (bitsandbytes >= 0.47), alone and under FSDP2 with 2 processes. The
GPU fit is in test_gpu_qlora.py."""
from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest
import torch

from paw_lightning import model as model_lib
from paw_lightning.cli import PawCLI, main
from paw_lightning.model import LMConfig, load_model, quantization_config
from paw_lightning.scale.fsdp import fsdp_mixed_precision

from helpers import RANK_INDEPENDENT, ROOT, fit_in_subprocess, metric_history, mlflow_runs, tiny_args

CUDA = torch.device("cuda", 0)  # a device object only: nothing touches CUDA


def _bitsandbytes_installed(monkeypatch, installed: bool, version: str = "0.50.2"):
    real_spec, real_version = importlib.util.find_spec, importlib.metadata.version
    monkeypatch.setattr(model_lib.importlib.util, "find_spec", lambda name, *a: (object() if installed else None) if name == "bitsandbytes" else real_spec(name, *a))
    monkeypatch.setattr(model_lib.importlib.metadata, "version", lambda name: version if name == "bitsandbytes" else real_version(name))


def test_nf4_on_a_cpu_with_an_old_bitsandbytes_says_how_to_upgrade(monkeypatch):
    _bitsandbytes_installed(monkeypatch, True, version="0.46.1")
    with pytest.raises(ValueError, match=r"QLoRA on a CPU needs bitsandbytes>=0.47 \(installed: 0.46.1\): pip install -U"):
        quantization_config(LMConfig(quantization="nf4"), torch.device("cpu"))
    assert quantization_config(LMConfig(quantization="nf4"), CUDA).load_in_4bit  # a GPU does not need the CPU backend


def test_nf4_on_other_devices_is_refused(monkeypatch):
    _bitsandbytes_installed(monkeypatch, True)
    with pytest.raises(ValueError, match="runs on CUDA GPUs and CPUs, not on mps"):
        quantization_config(LMConfig(quantization="nf4"), torch.device("mps"))


def test_nf4_without_bitsandbytes_says_how_to_install(monkeypatch):
    _bitsandbytes_installed(monkeypatch, False)
    with pytest.raises(ValueError, match=r"needs bitsandbytes.*pip install 'paw_lightning\[qlora\]'"):
        quantization_config(LMConfig(quantization="nf4"), CUDA)


def test_nf4_config_stores_in_the_compute_dtype(monkeypatch):
    _bitsandbytes_installed(monkeypatch, True)
    config = quantization_config(LMConfig(quantization="nf4", dtype="bfloat16"), CUDA)
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == config.bnb_4bit_quant_storage == torch.bfloat16  # FSDP-QLoRA
    assert quantization_config(LMConfig(), CUDA) is None


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="must be null or 'nf4'"):
        LMConfig(quantization="int8")


@pytest.mark.slow
def test_cli_refuses_nf4_with_an_old_bitsandbytes_on_cpu_in_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _bitsandbytes_installed(monkeypatch, True, version="0.45.0")
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.lm.quantization=nf4", "--trainer.accelerator=cpu")])
    assert exit_info.value.code == 2
    assert "error: 4-bit QLoRA on a CPU needs bitsandbytes>=0.47 (installed: 0.45.0)" in capsys.readouterr().err


def test_fsdp_mixed_precision_follows_the_trainer_precision():
    mixed = fsdp_mixed_precision("bf16-mixed")
    assert mixed.param_dtype == torch.bfloat16 and mixed.reduce_dtype == torch.float32
    assert fsdp_mixed_precision("16-mixed").param_dtype == torch.float16
    for precision in ("32-true", "bf16-true"):
        assert fsdp_mixed_precision(precision).param_dtype is None  # the weights' own dtype


@pytest.mark.slow
def test_qlora_fit_on_cpu_trains_lora_over_a_frozen_4bit_base_and_fsdp2_matches_one_process(tiny_model_dir, tmp_path, monkeypatch):
    """One in-process fit: the base linears are bitsandbytes NF4 (storage dtype = model dtype),
    they keep their packed weights, LoRA trains and the loss moves. The same fit with 2 FSDP2
    processes (4-bit weights replicated, the rest sharded) logs the same losses."""
    bnb = pytest.importorskip("bitsandbytes")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one").mkdir()
    cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path / "one", *RANK_INDEPENDENT, "--model.lm.quantization=nf4"), run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    lm = cli.model.lm
    quantized = {name: m for name, m in lm.named_modules() if isinstance(m, bnb.nn.Linear4bit)}
    assert quantized and all(m.weight.quant_state is not None and m.weight.dtype == torch.float32 for m in quantized.values())
    fresh = load_model(cli.model.lm_config, device=torch.device("cpu"))  # quantisation is deterministic
    fresh_modules = dict(fresh.named_modules())
    assert all(torch.equal(m.weight.view(torch.uint8), fresh_modules[name].weight.view(torch.uint8)) for name, m in quantized.items()), "a frozen 4-bit weight changed"  # packed bytes (as float32 some are NaN)
    lora_b = {n: p for n, p in lm.named_parameters() if "lora_B" in n}
    assert all(not p.any() for n, p in fresh.named_parameters() if "lora_B" in n)  # B starts at 0 …
    assert lora_b and any(p.any() for p in lora_b.values())  # … and trained

    client1, (single,) = mlflow_runs(tmp_path / "one")
    client2, (sharded,) = fit_in_subprocess(tiny_model_dir, tmp_path / "fsdp2", "--model.lm.quantization=nf4", "-c", str(ROOT / "configs/scale/fsdp2.yaml"))
    for key in ("train/wm/weighted_loss", "train/loss", "val/episode/return_mean"):
        one, two = metric_history(client1, single, key), metric_history(client2, sharded, key)
        assert len(one) == len(two) == 2 and all(abs(a - b) < 1e-4 for a, b in zip(one, two)), (key, one, two)
    losses = metric_history(client1, single, "train/loss")
    assert losses[1] < losses[0]

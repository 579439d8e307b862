"""QLoRA options (model.lm.quantization=nf4): the documented refusals on a CPU and without
bitsandbytes, and the 4-bit config FSDP-QLoRA needs. The GPU fit is in test_gpu_qlora.py."""
from __future__ import annotations

import importlib.util

import pytest
import torch

from paw_lightning import model as model_lib
from paw_lightning.cli import main
from paw_lightning.model import LMConfig, fsdp_mixed_precision, load_model, quantization_config, shard_model

from helpers import tiny_args

CUDA = torch.device("cuda", 0)  # a device object only: nothing touches CUDA


def _bitsandbytes_installed(monkeypatch, installed: bool):
    real = importlib.util.find_spec
    monkeypatch.setattr(model_lib.importlib.util, "find_spec", lambda name, *a: (object() if installed else None) if name == "bitsandbytes" else real(name, *a))


def test_nf4_on_cpu_is_refused_with_a_clear_message(tiny_model_dir):
    with pytest.raises(ValueError, match=r"4-bit QLoRA \(model.lm.quantization=nf4\) needs a CUDA GPU.*trainer.accelerator=gpu"):
        load_model(LMConfig(name_or_path=str(tiny_model_dir), quantization="nf4"), device=torch.device("cpu"))


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


def test_cli_refuses_nf4_on_cpu_in_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.lm.quantization=nf4", "--trainer.accelerator=cpu")])
    assert exit_info.value.code == 2
    assert "error: 4-bit QLoRA (model.lm.quantization=nf4) needs a CUDA GPU" in capsys.readouterr().err


def test_fsdp_mixed_precision_follows_the_trainer_precision():
    mixed = fsdp_mixed_precision("bf16-mixed")
    assert mixed.param_dtype == torch.bfloat16 and mixed.reduce_dtype == torch.float32
    assert fsdp_mixed_precision("16-mixed").param_dtype == torch.float16
    for precision in ("32-true", "bf16-true"):
        assert fsdp_mixed_precision(precision).param_dtype is None  # the weights' own dtype


class Params4bit(torch.nn.Parameter):
    """Stands in for bitsandbytes' 4-bit parameter (matched by class name), which FSDP2 cannot shard."""


def _shard_worker(rank: int, port: int, model_dir: str, results) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=1)
    try:
        model = load_model(LMConfig(name_or_path=model_dir, lora_r=4))
        proj = model.get_base_model().model.layers[0].mlp.down_proj.base_layer
        proj.weight = Params4bit(proj.weight.data, requires_grad=False)
        shard_model(model, init_device_mesh("cpu", (1,)))
        params = dict(model.named_parameters())
        quantized = [n for n, p in params.items() if type(p).__name__ == "Params4bit"]
        sharded = [n for n, p in params.items() if isinstance(p, DTensor)]
        model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
        results["quantized"], results["sharded"], results["total"] = quantized, len(sharded), len(params)
    finally:
        dist.destroy_process_group()


def test_shard_model_replicates_4bit_weights(tiny_model_dir):
    """FSDP2 keeps bitsandbytes' Params4bit (and its quant_state) out of its units; the rest is sharded."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_shard_worker, args=(port, str(tiny_model_dir), results), nprocs=1, join=True)
    assert results["quantized"] == ["base_model.model.model.layers.0.mlp.down_proj.base_layer.weight"]
    assert results["sharded"] == results["total"] - 1

"""QLoRA fit of the embedded model on a GPU, alone and under FSDP2 (marked ``gpu``: skipped
without CUDA; also skipped without the optional bitsandbytes, ``pip install 'paw_lightning[qlora]'``)."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.cli import PawCLI

from helpers import ROOT, metric_history, mlflow_runs

pytestmark = pytest.mark.slow  # fits of the embedded model (and gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("overlay", [[], ["-c", str(ROOT / "configs/scale/fsdp2.yaml"), "--trainer.devices=1"]], ids=["one-gpu", "fsdp2"])
def test_qlora_fit_of_the_embedded_model(tmp_path, monkeypatch, overlay):
    bnb = pytest.importorskip("bitsandbytes")
    monkeypatch.chdir(tmp_path)
    args = [
        "-c", str(ROOT / "configs/frozenlake.yaml"), *overlay,
        "--model.lm.quantization=nf4", "--model.lm.dtype=bfloat16", "--model.micro_batch_tokens=1024",
        "--trainer.accelerator=gpu", "--trainer.precision=bf16-mixed", "--trainer.max_epochs=1",
        "--trainer.check_val_every_n_epoch=10", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
        f"--trainer.default_root_dir={tmp_path / 'runs'}", "--data.progress=false",
    ]  # fmt: skip
    cli = PawCLI(args=args, run=False)
    cli.trainer.fit(cli.model, cli.datamodule)
    lm = cli.model.lm
    quantized = [m for m in lm.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert quantized and all(m.weight.quant_state is not None and m.weight.dtype == torch.bfloat16 for m in quantized)
    lora = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in lm.parameters() if p.requires_grad]  # DTensors under FSDP2
    assert lora and all(torch.isfinite(p).all() for p in lora)
    client, (run,) = mlflow_runs(tmp_path)
    assert len(metric_history(client, run, "train/loss")) == 1
    assert metric_history(client, run, "train/memory/peak_gib")[0] > 0

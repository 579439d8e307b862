"""Every scale preset composes with the ALFWorld recipe (parse only, ``--print_config``) and
names its exact command in its header comment."""
from __future__ import annotations

import pytest
import yaml

from paw_lightning.cli import main

from helpers import ROOT

PRESETS = ["cpu", "gpu1", "paper", "multinode", "fsdp2"]


def resolved(capsys, *overlays: str) -> dict:
    args = ["fit", "-c", str(ROOT / "configs/alfworld.yaml")]
    for name in overlays:
        args += ["-c", str(ROOT / f"configs/scale/{name}.yaml")]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


@pytest.mark.parametrize("name", PRESETS)
def test_preset_composes_and_documents_its_command(name, capsys):
    path = ROOT / f"configs/scale/{name}.yaml"
    header = [line for line in path.read_text().splitlines() if line.startswith("#")]
    assert any(f"configs/scale/{name}.yaml" in line and "paw_lightning fit" in line for line in header), "no command in the header"
    keys = set(yaml.safe_load(path.read_text()))
    assert keys <= ({"trainer", "model", "data", "stages"} if name == "paper" else {"trainer", "model"}), keys
    config = resolved(capsys, *(["paper", name] if name == "multinode" else [name]))
    assert config["data"]["env"] == "alfworld"  # the recipe is still there
    trainer, lm = config["trainer"], config["model"]["lm"]
    if name in ("paper", "multinode", "fsdp2"):
        assert trainer["strategy"]["class_path"] == "paw_lightning.scale.strategy.FSDP2Strategy"
        assert config["model"]["gather_weights_for_generation"] is True
        assert config["model"]["engine"]["init_args"]["merge_lora"] is False  # alfworld.yaml's merged copy needs one process
    if name in ("gpu1", "paper", "multinode"):
        assert trainer["precision"] == "bf16-mixed" and lm["dtype"] == "bfloat16" and lm["gradient_checkpointing"] is True


def test_paper_preset_is_the_papers_batch(capsys):
    config = resolved(capsys, "paper")
    data, model = config["data"], config["model"]
    rollout = data["rollout"]
    assert (rollout["groups"], rollout["group_size"], rollout["max_steps"], rollout["max_new_tokens"], data["mini_batch_size"]) == (16, 8, 50, 512, 256)
    assert model["lm"]["name_or_path"] == "Qwen/Qwen2.5-1.5B-Instruct" and model["lm"]["lora_r"] == 64
    assert config["trainer"]["devices"] == 8 and config["trainer"]["max_epochs"] == 150
    assert model["policy_objective"]["init_args"]["advantage"]["class_path"].endswith("GiGPO")  # the recipe's algorithm is kept
    assert model["world_model_objective"]["class_path"].endswith("ClippedMAE")


def test_fsdp2_strategy_spans_every_process_and_saves_one_file(monkeypatch):
    from lightning.pytorch.strategies import ModelParallelStrategy

    from paw_lightning.scale.strategy import FSDP2Strategy

    strategy = FSDP2Strategy()
    assert isinstance(strategy, ModelParallelStrategy) and strategy._save_distributed_checkpoint is False
    strategy.num_nodes, strategy.parallel_devices = 2, ["gpu"] * 8
    sizes = {}  # what ModelParallelStrategy would build its device mesh from (no process group here)
    monkeypatch.setattr(ModelParallelStrategy, "setup_environment", lambda self: sizes.update(dp=self._data_parallel_size, tp=self._tensor_parallel_size))
    strategy.setup_environment()
    assert sizes == {"dp": 16, "tp": 1}

"""The stages before RL show their progress in a log file: plain lines through one helper
(``paw_lightning.callbacks.warmup.progress_line``), flushed, rank 0 only, and nothing on a
terminal (where the rich bar shows it)."""
from __future__ import annotations

import re

import pytest
import torch

from paw_lightning.callbacks import warmup as warmup_module
from paw_lightning.callbacks.warmup import BehaviourCloningWarmup, progress_line


def test_a_progress_line_is_the_stage_then_its_parts(capsys):
    progress_line("behaviour-cloning warm-up", "epoch 1/2", "loss 1.234", "", "181.0 s")  # an empty part is left out
    assert capsys.readouterr().out == "behaviour-cloning warm-up · epoch 1/2 · loss 1.234 · 181.0 s\n"


def test_no_line_on_a_terminal_when_progress_is_off_or_on_other_ranks(capsys, monkeypatch):
    progress_line("behaviour-cloning warm-up", "epoch 1/2", enabled=False)
    monkeypatch.setattr(warmup_module.distributed, "rank", lambda: 1)
    progress_line("behaviour-cloning warm-up", "epoch 1/2")
    monkeypatch.setattr(warmup_module.distributed, "rank", lambda: 0)
    monkeypatch.setattr(warmup_module, "interactive", lambda: True)  # a terminal: the rich bar shows progress
    progress_line("behaviour-cloning warm-up", "epoch 1/2")
    assert capsys.readouterr().out == ""


@pytest.mark.slow
def test_a_warm_up_prints_its_demonstrations_and_every_epoch_then_loads_from_its_cache(tiny_model_dir, tmp_path, capsys):
    from paw_lightning.data import RolloutDataModule, RolloutSettings
    from paw_lightning.model import LMConfig
    from paw_lightning.module import PaWModule

    torch.manual_seed(0)
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)))
    module.configure_model()
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1))
    warmup = BehaviourCloningWarmup(demonstrations=2, epochs=2, lr=1e-2, batch_size=2, cache_dir=str(tmp_path))
    warmup.warm_up_or_load(module, datamodule)
    lines = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"behaviour-cloning warm-up · \d+ expert steps from 2 episodes \(rank 0: \d of \d won\) · 2 epochs of \d+ batches · collected in [\d.]+ s", lines[0]), lines
    for k in (1, 2):
        assert re.fullmatch(rf"behaviour-cloning warm-up · epoch {k}/2 · loss \d+\.\d{{3}} · [\d.]+ s", lines[k]), lines
    assert lines[3].startswith("behaviour-cloning warm-up: ") and lines[4].startswith("behaviour-cloning warm-up saved to ")

    BehaviourCloningWarmup(demonstrations=2, epochs=2, lr=1e-2, batch_size=2, cache_dir=str(tmp_path)).warm_up_or_load(module, datamodule)
    assert capsys.readouterr().out.startswith("behaviour-cloning warm-up loaded from ")

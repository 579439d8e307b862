"""The trainer's precision: ``bf16-mixed`` chosen for an unset ``trainer.precision`` when
``model.lm.dtype: auto`` loads a bfloat16 base, and the scoring pass computing in the update's
precision, so that π_old is the first optimizer step's π_θ."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from helpers import make_module, sampled_buffer

from paw_lightning import model as model_lib
from paw_lightning.training.precision import auto_precision, run_device
from paw_lightning.update import score, score_chunks


@pytest.mark.parametrize("native", [True, False])
def test_unset_precision_becomes_bf16_mixed_only_for_a_bfloat16_auto_base(monkeypatch, native):
    monkeypatch.setattr(model_lib, "native_bf16", lambda device: native)
    precision, line = auto_precision(None, "auto", "cpu")
    if native:
        assert precision == "bf16-mixed" and "bf16-mixed" in line and "trainer.precision" in line
    else:  # dtype auto loaded float32: bfloat16 autocast would be emulated, slower than float32
        assert precision is None and line is None
    assert auto_precision("32-true", "auto", "cpu") == ("32-true", None)  # the user's choice is kept
    assert auto_precision(None, "bfloat16", "cpu") == (None, None)  # only auto decides by itself
    assert auto_precision(None, "float32", "cpu") == (None, None)


def test_the_run_device_follows_the_accelerator(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_device("auto") == torch.device("cpu") and run_device("cpu") == torch.device("cpu")
    assert run_device("gpu") == torch.device("cuda") and run_device("cuda") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_device("auto") == torch.device("cuda")
    assert run_device("mps") is None and run_device(SimpleNamespace()) is None  # not ours to decide


def first_step_logprobs(module, buffer) -> list[torch.Tensor]:
    """π_θ of each sample as the first optimizer step reads it: a forward under the trainer's
    precision (Lightning wraps ``training_step`` in it), in the scoring pass's chunks."""
    view, out = buffer.policy_view(), [None] * len(buffer)
    module.lm.eval()
    with torch.no_grad(), module.forward_context():
        for rows in score_chunks([ids.numel() for ids in view.input_ids], module.score_batch_size):
            logprobs = module.token_outputs(view.collate(rows))["logprobs"]
            for k, i in enumerate(rows):
                out[i] = logprobs[k, : view.input_ids[i].numel()]
    return out


def action_gap(buffer, a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y)[m[: x.numel()]].abs().max()) for x, y, m in zip(a, b, buffer.action_mask))


def test_under_bf16_mixed_the_scoring_pass_gives_the_first_steps_logprobs(tiny_model_dir):
    module = make_module(tiny_model_dir, dtype="bfloat16")  # float32 LoRA (non-zero) on a bfloat16 base
    module._trainer = SimpleNamespace(precision_plugin=MixedPrecision("bf16-mixed", "cpu"))
    buffer = sampled_buffer(module)
    score(module.update_inputs(), buffer)
    assert action_gap(buffer, buffer.old_logprobs, first_step_logprobs(module, buffer)) == 0.0  # PPO's ratio is exactly 1
    # the scoring pass without the trainer's precision (as before): the LoRA branch in float32, the update in bfloat16
    module._trainer = SimpleNamespace(precision_plugin=Precision())
    score(module.update_inputs(), buffer)
    module._trainer = SimpleNamespace(precision_plugin=MixedPrecision("bf16-mixed", "cpu"))
    assert action_gap(buffer, buffer.old_logprobs, first_step_logprobs(module, buffer)) > 0.0

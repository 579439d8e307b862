"""Token-budget micro-batches: the split, and an update identical whatever the split."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.cli import main
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule
from paw_lightning.objectives import GRPO, ClippedMAE, PolicyObjective
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.samples import build_buffer
from paw_lightning.training.microbatch import micro_batches, split_by_tokens, take_rows
from paw_lightning.update import prepare_update

from helpers import metric_history, mlflow_runs, tiny_args


def test_split_sorts_by_length_and_packs_within_the_budget():
    lengths = [5, 9, 3, 9, 2]
    # longest first: 9, 9 (2 × 9 = 18 fits), then 5, 3, 2 (3 × 5 = 15 fits)
    assert split_by_tokens(lengths, 18) == [[1, 3], [0, 2, 4]]
    assert split_by_tokens(lengths, 17) == [[1], [3], [0, 2, 4]]
    assert split_by_tokens(lengths, 4) == [[1], [3], [0], [2], [4]]  # longer than the budget: alone
    assert split_by_tokens(lengths, None) == [[0, 1, 2, 3, 4]]
    with pytest.raises(ValueError, match="at least 1"):
        split_by_tokens(lengths, 0)


def test_a_row_cap_splits_within_the_budget_and_alone():
    lengths = [5, 9, 3, 9, 2]
    assert split_by_tokens(lengths, 18, max_rows=2) == [[1, 3], [0, 2], [4]]  # 5, 3, 2 fit 18 but only 2 rows
    assert split_by_tokens(lengths, None, max_rows=2) == [[1, 3], [0, 2], [4]]  # no token budget: rows only
    assert split_by_tokens(lengths, 18, max_rows=1) == [[1], [3], [0], [2], [4]]  # each sample unpadded
    with pytest.raises(ValueError, match="micro_batch_rows must be at least 1"):
        split_by_tokens(lengths, 18, max_rows=0)


def test_take_rows_trims_padding_and_recomputes_keep_from():
    batch = {
        "input_ids": torch.tensor([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0], [8, 9, 1, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]).bool(),
        "advantages": torch.tensor([0.1, 0.2, 0.3]),
        "prompt_lengths": torch.tensor([1, 2, 2]),
        "keep_from": torch.tensor([1]),
    }
    part = take_rows(batch, [2, 1])
    assert part["input_ids"].tolist() == [[8, 9, 1], [6, 7, 0]]
    assert part["advantages"].tolist() == pytest.approx([0.3, 0.2])
    assert part["keep_from"].tolist() == [2]
    assert [len(m["input_ids"]) for m in micro_batches(batch, 6)] == [1, 2]  # 5 alone; 3 and 2 → 2 × 3 = 6


def _module(model_dir, aggregation: str) -> PaWModule:
    norm = 16 if aggregation == "seq-mean-token-sum-norm" else None
    policy = PolicyObjective(advantage=GRPO(), kl_coef=0.05, entropy_coef=0.01, aggregation=aggregation, loss_norm_tokens=norm)
    module = PaWModule(lm=LMConfig(name_or_path=str(model_dir), lora_r=4), policy_objective=policy, world_model_objective=ClippedMAE(rho=0.9, alpha=0.75), score_batch_size=16)
    torch.manual_seed(0)  # LoRA A is drawn in configure_model
    module.configure_model()
    with torch.no_grad():  # a non-zero adapter: π_θ differs from the reference
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    return module


def _buffer(module):
    """3 groups × 2 episodes × 2 steps with responses and observations of varied lengths."""
    tok = module.tokenizer
    trajectories = []
    for g in range(3):
        for e in range(2):
            traj = Trajectory(g, 2 * g + e, g)
            for t in range(2):
                response = tok.encode(f"<think>{'ab' * (1 + 3 * t + e + g)}</think><action>Up</action>", add_special_tokens=False)
                observation = f"obs {g}{t}" + " _P_" * (1 + e + 2 * t)
                traj.steps.append(Step(f"o{t}", chat_prompt_ids(tok, f"task {g} step {t}" + "." * (3 * g)), response, "", "Up", float(e + g), observation, t == 1))
            trajectories.append(traj)
    return build_buffer(trajectories, tok)


def _accumulate(module, batch, budget, max_rows=None):
    """What training_step does before the optimizer step: gradients and metric shares summed over the micro-batches."""
    module.zero_grad(set_to_none=True)
    totals = module.loss_totals(batch)
    parts = micro_batches(batch, budget, max_rows)
    metrics = {}
    for micro in parts:
        out = module.compute_loss(micro, totals)
        out.loss.backward()
        for key, value in out.metrics.items():
            metrics[key] = metrics.get(key, 0.0) + value
    grads = {n: p.grad.clone() for n, p in module.named_parameters() if p.requires_grad}
    return len(parts), grads, metrics


def _budget_for(lengths: list[int], n_parts: int) -> int:
    for budget in range(max(lengths) * len(lengths), 0, -1):
        if len(split_by_tokens(lengths, budget)) == n_parts:
            return budget
    raise AssertionError(f"no budget splits {lengths} into {n_parts}")


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "sequence-mean"])
def test_gradients_and_losses_do_not_depend_on_the_split(tiny_model_dir, aggregation):
    module = _module(tiny_model_dir, aggregation)
    buffer = _buffer(module)
    prepare_update(module.update_inputs(), buffer, max_return=1.0)
    assert 0 < buffer.wm_selected.sum() < len(buffer)  # the selection leaves transitions out
    buffer.wm_lambda = torch.tensor([{0: 0.25, 1: 1.0, 2: 0.5}[int(g)] for g in buffer.info.group_ids])
    batch = buffer.collate(list(range(len(buffer))))
    lengths = batch["attention_mask"].sum(-1).tolist()
    assert len(set(lengths)) > 4  # varied lengths: the split and the trimming matter

    n, expected_grads, expected = _accumulate(module, batch, None)
    assert n == 1 and all(g.abs().max() > 0 for g in expected_grads.values())
    for budget, max_rows, n_parts in ((_budget_for(lengths, 2), None, 2), (_budget_for(lengths, 4), None, 4), (None, 1, len(lengths))):
        n, grads, metrics = _accumulate(module, batch, budget, max_rows)
        assert n == n_parts
        for name, grad in grads.items():
            torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)  # float32 sums in another order; gradients are ~0.1
        assert metrics.keys() == expected.keys()
        for key in ("loss", "policy/loss", "policy/kl", "policy/entropy", "wm/loss", "wm/weighted_loss", "wm/clipped_ratio",
                    "wm/selected_fraction", "wm/lambda_mean", "policy/advantage_mean", "policy/advantage_std", "policy/clip_frac"):
            torch.testing.assert_close(metrics[key], expected[key], rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.slow
def test_fit_with_micro_batches_logs_the_same_losses(tiny_model_dir, tmp_path, monkeypatch):
    """Through the CLI: one epoch with whole mini-batches and one with one sample per micro-batch."""
    monkeypatch.chdir(tmp_path)
    histories = []
    for name, extra in {"whole": [], "micro": ["--model.micro_batch_tokens=2048", "--model.micro_batch_rows=1"]}.items():
        workdir = tmp_path / name
        workdir.mkdir()
        main(["fit", *tiny_args(tiny_model_dir, workdir, "--trainer.max_epochs=1", "--trainer.check_val_every_n_epoch=10", *extra)])
        client, (run,) = mlflow_runs(workdir)
        histories.append({key: metric_history(client, run, key) for key in ("train/loss", "train/policy/loss", "train/wm/loss", "train/memory/peak_gib")})
    whole, micro = histories
    for key in ("train/loss", "train/policy/loss", "train/wm/loss"):
        assert len(whole[key]) == len(micro[key]) == 1
        assert micro[key][0] == pytest.approx(whole[key][0], rel=1e-4, abs=1e-6), key
    assert 0.05 < micro["train/memory/peak_gib"][0] < 64  # peak RSS of this process, in GiB


@pytest.mark.slow
def test_trainer_gradient_clipping_points_to_max_grad_norm(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Manual optimisation: Lightning cannot clip; the module's max_grad_norm does."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.gradient_clip_val=0.5")])
    assert exit_info.value.code == 2
    assert "set model.max_grad_norm=0.5 instead" in capsys.readouterr().err

"""A NaN/inf loss or gradient skips that optimizer step (weights and optimizer state unchanged),
is counted in ``train/nonfinite_steps``, and too many in a row stop the run with one line."""
from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Callback

from paw_lightning.cli import PawCLI, main
from paw_lightning.module import PaWModule
from paw_lightning.training.nonfinite import NonFiniteGuard, NonFiniteTrainingError, all_finite

from helpers import metric_history, mlflow_runs, tiny_args


def test_all_finite_checks_the_loss_and_every_gradient():
    a, b = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    a.grad, b.grad = torch.ones(2), torch.tensor([1.0, float("inf")])
    assert all_finite(torch.tensor(1.0), [a])
    assert not all_finite(torch.tensor(1.0), [a, b])
    assert not all_finite(torch.tensor(float("nan")), [a])


def test_guard_counts_skips_and_stops_after_max_in_a_row():
    guard = NonFiniteGuard(max_consecutive=2)
    assert guard.step_ok(True, str) and not guard.step_ok(False, lambda: "step 1")
    assert guard.step_ok(True, str) and guard.consecutive == 0  # a good step resets the streak
    assert not guard.step_ok(False, lambda: "step 3")
    with pytest.raises(NonFiniteTrainingError, match="in 2 optimizer steps in a row.*step 4"):
        guard.step_ok(False, lambda: "step 4")
    assert guard.skipped == 3
    with pytest.raises(ValueError, match="max_nonfinite_steps"):
        NonFiniteGuard(0)


def nan_logprobs_in(epochs: set[int] | None, monkeypatch):
    """Make the training forward's log-probs NaN in these epochs (``None``: always)."""
    original = PaWModule.token_outputs

    def patched(self, batch, *args, **kwargs):
        out = original(self, batch, *args, **kwargs)
        if torch.is_grad_enabled() and (epochs is None or self.current_epoch in epochs):
            out["logprobs"] = out["logprobs"] * float("nan")
        return out

    monkeypatch.setattr(PaWModule, "token_outputs", patched)


class LoraSnapshots(Callback):
    def __init__(self):
        self.start, self.after_epoch = None, []

    def on_train_start(self, trainer, pl_module):
        self.start = {n: p.detach().clone() for n, p in pl_module.named_parameters() if p.requires_grad}

    def on_train_epoch_end(self, trainer, pl_module):
        self.after_epoch.append({n: p.detach().clone() for n, p in pl_module.named_parameters() if p.requires_grad})


@pytest.mark.slow
def test_nan_steps_are_skipped_and_training_goes_on(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nan_logprobs_in({0}, monkeypatch)
    cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=2"), run=False)
    snapshots = LoraSnapshots()
    cli.trainer.callbacks.append(snapshots)
    with pytest.warns(UserWarning, match="skipped an optimizer step with a non-finite loss"):
        cli.trainer.fit(cli.model, cli.datamodule)
    first, last = snapshots.after_epoch
    assert all(torch.equal(first[n], snapshots.start[n]) for n in first), "a skipped step changed the weights"
    assert any(not torch.equal(last[n], first[n]) for n in last), "the next epoch did not train"
    assert all(torch.isfinite(p).all() for p in last.values())
    client, (run,) = mlflow_runs(tmp_path)
    skipped = metric_history(client, run, "train/nonfinite_steps")
    assert skipped[0] >= 1 and skipped[1] == skipped[0]  # all of epoch 0's steps, none of epoch 1's
    assert run.info.status == "FINISHED"


@pytest.mark.slow
def test_too_many_in_a_row_stop_the_run_with_one_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    nan_logprobs_in(None, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--model.max_nonfinite_steps=1")])
    assert exit_info.value.code == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "non-finite loss or gradient in 1 optimizer step in a row" in err[0] and "last.ckpt" in err[0]
    client, (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FAILED"

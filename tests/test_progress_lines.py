"""The plain progress lines' seconds: a validation outside an epoch counts its own episodes
(played when Lightning fetches the first batch, before ``on_validation_start``), and the epoch
line does not count them again. The hooks run in Lightning's order on a fake clock."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paw_lightning import progress as progress_module
from paw_lightning.progress import PlainProgressBar


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(progress_module.time, "perf_counter", fake)
    return fake


def fake_trainer():
    metrics = {"val/episode/success_rate": 0.25, "val/episode/return_mean": 0.5}
    return SimpleNamespace(sanity_checking=False, state=SimpleNamespace(fn="fit"), current_epoch=-1, max_epochs=2, logged_metrics=metrics)


def fake_module():
    """A module whose evaluations say when their held-out episodes began playing."""
    return SimpleNamespace(evaluations={})


def played_at(module, seconds: float, split: str = "val") -> None:
    module.evaluations[split] = SimpleNamespace(played=SimpleNamespace(started=seconds))


def seconds_of(line: str) -> float:
    return float(line.rsplit(" · ", 1)[1].removesuffix(" s"))


def test_validation_before_the_first_update_owns_its_episodes(clock, capsys):
    bar, trainer, module = PlainProgressBar(), fake_trainer(), fake_module()
    bar.get_metrics = lambda trainer, module: {"train_success": 0.0, "train_return": 0.1}
    bar.on_fit_start(trainer, module)  # t = 0
    clock.now = 10.0  # epoch 0's rollout (train_dataloader) took 10 s; then on_train_start validates:
    played_at(module, clock.now)  # the held-out episodes play while the first batch is fetched
    clock.now = 30.0
    bar.on_validation_start(trainer, module)
    clock.now = 40.0
    bar.on_validation_end(trainer, module)
    trainer.current_epoch = 0
    bar.on_train_epoch_start(trainer, module)
    clock.now = 60.0  # 20 s of update
    bar.on_train_epoch_end(trainer, module)
    validation, epoch = capsys.readouterr().out.splitlines()
    assert validation.startswith("validation before the first update · val success 0.25")
    assert seconds_of(validation) == 30.0  # episodes 20 s + the rest 10 s
    assert epoch.startswith("epoch 0/1 · train success 0.00")
    assert seconds_of(epoch) == 30.0  # rollout 10 s + update 20 s, without the validation's 30 s
    trainer.state.fn = "validate"
    clock.now = 70.0
    bar.on_validation_start(trainer, module)  # an evaluation that played nothing new: the old start is not read again
    clock.now = 72.0
    bar.on_validation_end(trainer, module)
    (again,) = capsys.readouterr().out.splitlines()
    assert seconds_of(again) == 2.0


def test_an_evaluation_without_episodes_of_its_own_counts_from_its_start(clock, capsys):
    """A module without evaluations (a loader that is not the data module's) changes nothing."""
    bar, trainer = PlainProgressBar(), fake_trainer()
    trainer.state.fn = "validate"
    clock.now = 5.0
    bar.on_validation_start(trainer, None)
    clock.now = 7.5
    bar.on_validation_end(trainer, None)
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("validation · val success 0.25") and seconds_of(line) == 2.5


def test_sanity_check_consumes_its_start(clock, capsys):
    """A sanity check's episodes do not leak into the next validation's time."""
    bar, trainer, module = PlainProgressBar(), fake_trainer(), fake_module()
    trainer.sanity_checking = True
    played_at(module, 0.0)
    clock.now = 1.0
    bar.on_validation_start(trainer, module)
    bar.on_validation_end(trainer, module)
    trainer.sanity_checking, trainer.state.fn = False, "validate"
    clock.now = 50.0
    bar.on_validation_start(trainer, module)
    clock.now = 52.0
    bar.on_validation_end(trainer, module)
    (line,) = capsys.readouterr().out.splitlines()
    assert seconds_of(line) == 2.0

"""Progress output: rich bars on a terminal, plain lines elsewhere.

- :func:`progress_bar`: a small rich progress bar for long loops outside Lightning's own bar
  (rollouts, warm-up); only when stdout is a terminal (or a Jupyter notebook): in a log file
  or CI it prints nothing.
- :class:`PlainProgressBar`: Lightning's progress bar for output that is not a terminal, one
  line per epoch and per validation outside an epoch, no animation; the CLI uses it instead of
  Lightning's rich bar when stdout is not a TTY (:func:`interactive`).
- :func:`describe_epoch`: how a validation is named by the epoch of its weights ("after epoch
  3"), here and in the run summary's table (:mod:`paw_lightning.callbacks.summary`).
"""
from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterator

from lightning.pytorch.callbacks import ProgressBar
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def interactive() -> bool:
    """Whether stdout shows animations: a terminal, or a Jupyter notebook (rich renders widgets)."""
    try:
        if sys.stdout.isatty():
            return True
    except (AttributeError, ValueError):  # a replaced or closed stdout
        return False
    return "ipykernel" in sys.modules and type(sys.stdout).__module__.startswith("ipykernel")


class _Bar:
    def __init__(self, progress: Progress | None, task=None):
        self.progress, self.task = progress, task

    def advance(self, n: int = 1) -> None:
        if self.progress is not None:
            self.progress.advance(self.task, n)


@contextmanager
def progress_bar(description: str, total: int, unit: str, enabled: bool = True) -> Iterator[_Bar]:
    """``with progress_bar("rollout 3", 16, "episodes") as bar: … bar.advance()``; a no-op when
    not ``enabled`` (e.g. on ranks other than 0) or when stdout is not :func:`interactive`. The
    bar disappears when the loop ends."""
    if not enabled or not interactive():
        yield _Bar(None)
        return
    columns = (TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit), TimeElapsedColumn())
    with Progress(*columns, transient=True) as progress:
        yield _Bar(progress, progress.add_task(description, total=total))


def _fmt(value) -> str:
    return f"{float(value):.2f}"


def describe_epoch(epoch: int | None) -> str:
    """How a validation is named (progress lines, the run summary's table): by the epoch of its weights."""
    if epoch is None:
        return "of the base model"
    return "before the first update" if epoch < 0 else f"after epoch {epoch}"


class PlainProgressBar(ProgressBar):
    """Lightning's progress bar as plain lines (rank 0), for a log file or CI: no animation,
    no carriage returns, each line flushed. Inside ``fit`` one line per epoch::

        epoch 2/9 · train success 0.25 · return 0.31 · val success 0.50 · return 0.62 · 42.1 s

    (epochs counted from 0, as the MLflow steps and evaluation reports count them; the
    ``val`` part only when the epoch validated; the time is the epoch's wall time: rollout,
    update and its validation), and one line per validation outside an epoch (the validation
    before the first update, one after the last, ``validate``) or test, its time counting its
    held-out episodes (and the epoch's line then not)::

        validation before the first update · val success 0.00 · return -0.20 · invalid 1.00 · 3.2 s

    Train numbers are the progress-bar metrics the module logs (``train_success``,
    ``train_return``), read at epoch end like Lightning's own bars do; validation numbers the
    logged ``val/episode/*`` metrics."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._epoch_mark = time.perf_counter()  # when the current epoch's time began
        self._outside = 0.0  # seconds since _epoch_mark spent in validations outside an epoch
        self._eval_start = 0.0
        self._last_eval_end = float("-inf")  # perf_counter() when the previous evaluation ended
        self._in_epoch = False
        self._epoch_val: dict[str, float] | None = None

    # --------------------------------------------------- ProgressBar API
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    @property
    def is_disabled(self) -> bool:
        return not self._enabled

    def print(self, *args, **kwargs) -> None:
        if self._enabled:
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    # ------------------------------------------------------------- lines
    def _line(self, *parts: str) -> None:
        if self._enabled:
            print(" · ".join(p for p in parts if p), file=sys.stdout, flush=True)

    @staticmethod
    def _eval_parts(trainer, split: str) -> list[str]:
        metrics = trainer.logged_metrics
        parts = []
        for name, key in (("success", "success_rate"), ("return", "return_mean"), ("invalid", "invalid_rate")):
            value = metrics.get(f"{split}/episode/{key}")
            if value is not None:
                parts.append(f"{name} {_fmt(value)}")
        if parts:
            parts[0] = f"{split} {parts[0]}"
        return parts

    def on_fit_start(self, trainer, pl_module) -> None:
        self._epoch_mark, self._outside, self._in_epoch = time.perf_counter(), 0.0, False

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._in_epoch, self._epoch_val = True, None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._in_epoch = False
        now = time.perf_counter()
        seconds, self._epoch_mark, self._outside = now - self._epoch_mark - self._outside, now, 0.0
        if not self._enabled:
            return
        metrics = self.get_metrics(trainer, pl_module)  # rank 0, like Lightning's bars: syncs the epoch's bar metrics
        last = trainer.max_epochs - 1 if trainer.max_epochs is not None and trainer.max_epochs > 0 else None
        parts = [f"epoch {trainer.current_epoch}" + (f"/{last}" if last is not None else "")]
        if "train_success" in metrics:
            parts.append(f"train success {_fmt(metrics['train_success'])}")
        if "train_return" in metrics:
            parts.append(f"return {_fmt(metrics['train_return'])}")
        parts += self._epoch_val or []
        self._line(*parts, f"{seconds:.1f} s")

    def _eval_start_hook(self, trainer, *_) -> None:
        self._eval_start = time.perf_counter()

    on_validation_start = on_test_start = _eval_start_hook

    def _eval_seconds(self, pl_module, split: str) -> float:
        """An evaluation's wall time, its episodes included. Lightning fetches the first batch,
        and so plays the held-out episodes (``_EvalEpisodes``), before ``on_validation_start``;
        the clock therefore starts when the module's latest evaluation of ``split`` began
        playing, if that came first and after the previous evaluation ended (an older
        evaluation's start is never read)."""
        start, now = self._eval_start, time.perf_counter()
        evaluation = getattr(pl_module, "evaluations", {}).get(split)  # a module other than PaWModule has none
        if evaluation is not None and evaluation.played.started > self._last_eval_end:
            start = min(start, evaluation.played.started)
        self._last_eval_end = now
        return now - start

    def on_validation_end(self, trainer, pl_module) -> None:
        seconds = self._eval_seconds(pl_module, "val")
        if trainer.sanity_checking:
            return
        if self._in_epoch:  # part of the epoch's line
            self._epoch_val = self._eval_parts(trainer, "val")[:2] if self._enabled else None
            return
        self._outside += seconds
        if trainer.state.fn == "fit":
            label = f"validation {describe_epoch(trainer.current_epoch)}"
        else:
            label = "validation"
        self._line(label, *self._eval_parts(trainer, "val"), f"{seconds:.1f} s")

    def on_test_end(self, trainer, pl_module) -> None:
        self._line("test", *self._eval_parts(trainer, "test"), f"{self._eval_seconds(pl_module, 'test'):.1f} s")

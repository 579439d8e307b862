"""The story of a ``fit`` in one table: held-out validation before the first update → after the last.

:class:`RunSummary` (always on through the CLI's ``summary:`` section) runs a validation with
the starting weights at ``on_train_start`` (logged as epoch −1: ``eval/val_start.json``), one
more at ``on_train_end`` if the last epoch did not validate, and at ``on_fit_end`` rank 0
prints a before → after table (success overall and per task type, invalid actions, return,
the world model on the fixed held-out transitions, ``val/wm_fixed/*``, and on the episodes
played, ``val/wm_onpolicy/*``), also written as ``summary.md``/``summary.json`` and
logged to MLflow. Every rank runs the validations (collectives); ``--summary.enabled=false``
turns it off.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass

from lightning.pytorch import Callback

from paw_lightning.progress import describe_epoch
from paw_lightning.tracking.artifacts import evaluated_epoch, mlflow_logger, run_directory
from paw_lightning.tracking.evaluation import _number
from paw_lightning.tracking.logger import PawMLFlowLogger
from paw_lightning.metrics import TASK_TYPE_NAMES
from paw_lightning.fixed_set import SOURCES as FIXED_SOURCES

START_EPOCH = -1  # trainer.current_epoch (and MLflow step) of the validation before the first update
RATES = ("success_rate", "invalid_rate", "exact_match")  # shown in %, changes in percentage points


def validate_now(trainer, epoch: int) -> bool:
    """Run the fit's validation loop now, outside Lightning's schedule (from ``on_train_start`` or
    ``on_train_end``), as the validation of the weights of ``epoch`` (``-1``: before the first
    update): every callback and module hook runs, and logging and progress bars work, as in a
    scheduled validation; ``trainer.current_epoch`` reads ``epoch`` meanwhile (so the logged
    ``epoch`` metric, the MLflow step and the evaluation reports name it). False if the trainer
    has no validation (no ``validation_step``, no loader, ``limit_val_batches=0``).

    Lightning forbids ``trainer.validate`` inside ``fit``; this does what its training loop does
    when an epoch validates (``_TrainingEpochLoop.on_advance_end``): run ``val_loop`` with the
    stage set to validating, then restore the stage and the logger connector's loop flag. Under
    DDP/FSDP2 it is a collective: every rank must call it at the same point."""
    if not trainer.enable_validation:
        return False
    progress = trainer.fit_loop.epoch_progress.current
    connector = trainer._logger_connector
    completed, stage, first_loop_iter = progress.completed, trainer.state.stage, connector._first_loop_iter
    progress.completed = epoch  # trainer.current_epoch
    trainer.validating = True
    try:
        trainer.fit_loop.epoch_loop.val_loop.run()
    finally:
        progress.completed = completed
        trainer.state.stage = stage
        connector._first_loop_iter = first_loop_iter
    return True


# ------------------------------------------------------------------ the table
@dataclass
class SummaryRow:
    label: str
    key: str
    before: float | None
    after: float | None

    @property
    def change(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def is_rate(self) -> bool:
        return any(part in RATES for part in self.key.split("/"))


def _value(metrics: dict, key: str) -> float | None:
    value = metrics.get(key)
    return None if value is None or math.isnan(value) else float(value)


# RWML's world-model task (env world_model): an "episode" is one predicted next observation
WORLD_MODEL_TASK_LABELS = {"success rate": "reward rate (1 − cos < τ_d)", "score (%)": "sampled predictions exact (%)"}


def summary_rows(before: dict[str, float], after: dict[str, float], split: str = "val", env: str | None = None) -> list[SummaryRow]:
    """The rows present in ``before`` or ``after`` (metric key → value): success rate, then per
    task type (ALFWorld's order, then any other type alphabetically), invalid-action rate, mean
    return, the environment's score (when it reports one), then the world model: NLL per token
    (teacher-forced) on the fixed held-out transitions, all sources together and per source, and
    their free-running exact match; below them the same two on the episodes just played
    (on-policy: they move with the policy). ``env="world_model"`` names the first and the score row as what they are there."""
    success = f"{split}/episode/success_rate"
    typed = {k[len(success) + 1:] for k in (*before, *after) if k.startswith(success + "/")}
    order = list(TASK_TYPE_NAMES.values())
    types = [t for t in order if t in typed] + sorted(typed - set(order))
    wanted = [("success rate", success)] + [(f"  {t}", f"{success}/{t}") for t in types]
    wanted += [("invalid-action rate", f"{split}/episode/invalid_rate"), ("return", f"{split}/episode/return_mean"),
               ("score (%)", f"{split}/episode/score"),  # WebShop's Score; the world-model task's exact-match rate
               ("world-model NLL, fixed set", f"{split}/wm_fixed/all/nll")]
    wanted += [(f"  {source.replace('_', ' ')}", f"{split}/wm_fixed/{source}/nll") for source in FIXED_SOURCES]
    wanted += [("world-model exact match, fixed set", f"{split}/wm_fixed/all/exact_match"),
               ("world-model NLL, on-policy", f"{split}/wm_onpolicy/nll"), ("world-model exact match, on-policy", f"{split}/wm_onpolicy/exact_match")]
    labels = WORLD_MODEL_TASK_LABELS if env == "world_model" else {}
    rows = [SummaryRow(labels.get(label, label), key, _value(before, key), _value(after, key)) for label, key in wanted]
    return [row for row in rows if row.before is not None or row.after is not None]


def _cell(row: SummaryRow, value: float | None, change: bool = False) -> str:
    if value is None:
        return "–"
    if row.is_rate:
        return f"{100 * value:+.1f} pp" if change else f"{100 * value:.1f}%"
    return f"{value:+.3f}" if change else f"{value:.3f}"


def format_summary(rows: list[SummaryRow], before_label: str, after_label: str, title: str = "") -> str:
    """The terminal table: one line per row (label, before, after, change, metric key)."""
    head = ("", "before", "after", "change", "metric")
    cells = [(r.label, _cell(r, r.before), _cell(r, r.after), _cell(r, r.change, change=True), r.key) for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(4)]

    def line(c):
        return f"{c[0]:<{widths[0]}}  {c[1]:>{widths[1]}}  {c[2]:>{widths[2]}}  {c[3]:>{widths[3]}}  {c[4]}".rstrip()

    first = [f"Summary: held-out validation {before_label} → {after_label}"] + ([title] if title else [])
    return "\n".join([*first, line(head), *(line(c) for c in cells)])


def format_markdown(rows: list[SummaryRow], before_label: str, after_label: str, title: str = "") -> str:
    lines = [f"# Held-out validation {before_label} → {after_label}", ""]
    if title:
        lines += [title, ""]
    lines += ["| | before | after | change | metric |", "|---|---:|---:|---:|---|"]
    lines += [f"| {r.label.strip()} | {_cell(r, r.before)} | {_cell(r, r.after)} | {_cell(r, r.change, change=True)} | `{r.key}` |" for r in rows]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ the callback
class RunSummary(Callback):
    """Args:
    enabled: print and log the before → after table at the end of ``fit`` (false: this
        callback does nothing, no extra validation either).
    validate_at_start: validate once before the first update of a fresh fit (one validation's time).
    validate_at_end: validate once after the last update if the last epoch did not.
    split: the metric prefix the table reads (the fit's validation: ``val``).
    """

    def __init__(self, enabled: bool = True, validate_at_start: bool = True, validate_at_end: bool = True, split: str = "val"):
        self.enabled, self.validate_at_start, self.validate_at_end, self.split = enabled, validate_at_start, validate_at_end, split
        self.snapshots: dict[int, dict[str, float | None]] = {}  # evaluated epoch → logged val/ metrics, NaN as None (rank 0)
        self.summary: dict | None = None  # the last table, as written to summary.json (rank 0)
        self._validated_step: int | None = None  # global step of this fit's latest validation (every rank)

    def on_fit_start(self, trainer, pl_module) -> None:
        self.snapshots, self.summary, self._validated_step = {}, None, None

    def on_train_start(self, trainer, pl_module) -> None:
        fresh = trainer.ckpt_path is None and trainer.current_epoch == 0 and trainer.global_step == 0
        if self.enabled and self.validate_at_start and fresh:
            validate_now(trainer, START_EPOCH)

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self.enabled or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self._validated_step = trainer.global_step
        if trainer.is_global_zero:
            prefix = f"{self.split}/"
            self.snapshots[evaluated_epoch(trainer, pl_module)] = {k: _number(v) for k, v in sorted(trainer.logged_metrics.items()) if k.startswith(prefix)}

    def on_train_end(self, trainer, pl_module) -> None:
        if self.enabled and self.validate_at_end and trainer.global_step > 0 and self._validated_step != trainer.global_step:
            validate_now(trainer, trainer.current_epoch - 1)  # current_epoch counts the completed epochs

    def on_fit_end(self, trainer, pl_module) -> None:
        if not self.enabled or not trainer.is_global_zero or not self.snapshots:
            return
        after_epoch = max(self.snapshots)
        before_epoch = min(self.snapshots)
        before = self.snapshots[before_epoch]
        if trainer.ckpt_path is not None:  # a resumed fit: the run's earliest validation is in MLflow
            earlier = self._earliest_logged(trainer, list(self.snapshots[after_epoch]))
            if earlier is not None and earlier[0] < before_epoch:
                before_epoch, before = earlier
        if before_epoch == after_epoch:  # a single validation: nothing to compare it with
            before_epoch, before = None, {}
        evaluation = getattr(pl_module, "evaluations", {}).get(self.split)  # a module other than PaWModule has none
        self.summary = self.build(before_epoch, before, after_epoch, self.snapshots[after_epoch], evaluation.played.plan if evaluation is not None else None)
        logger = mlflow_logger(trainer)
        epochs = " and ".join(str(e) for e in (before_epoch, after_epoch) if e is not None)
        source = f"From the {self.split}/ metrics logged at epoch{'s' if before_epoch is not None else ''} {epochs}"
        if logger is not None:
            source += f"\n(MLflow run {logger.run_id}: summary.md, summary.json)"
        print(f"\n{self.summary['text']}\n{source}", flush=True)
        self._write(trainer, self.summary.pop("markdown"))

    def build(self, before_epoch: int | None, before: dict, after_epoch: int, after: dict, plan: dict | None = None) -> dict:
        """The summary of two validations (``before_epoch=None``: none before): rows, terminal
        text and markdown; ``plan``: what the evaluations played (:func:`paw_lightning.evaluation.eval_plan`)."""
        rows = summary_rows(before, after, self.split, plan["env"] if plan else None)
        title = ""
        if plan:
            episodes = f"{plan['group_size']} episode{'s' if plan['group_size'] != 1 else ''}"
            title = f"{self.split}: {plan['groups']} held-out tasks × {episodes}, temperature {plan['temperature']:g}"
        before_label = describe_epoch(before_epoch) if before_epoch is not None else "(none)"
        after_label = describe_epoch(after_epoch)
        return {
            "split": self.split,
            "plan": title,
            "before": {"epoch": before_epoch, "label": before_label, "metrics": before},
            "after": {"epoch": after_epoch, "label": after_label, "metrics": after},
            "rows": [{**asdict(r), "change": r.change} for r in rows],
            "text": format_summary(rows, before_label, after_label, title),
            "markdown": format_markdown(rows, before_label, after_label, title),
        }

    def _write(self, trainer, markdown: str) -> None:
        directory = run_directory(trainer)
        directory.mkdir(parents=True, exist_ok=True)
        paths = [directory / "summary.md", directory / "summary.json"]
        paths[0].write_text(markdown)
        paths[1].write_text(json.dumps(self.summary, indent=2) + "\n")
        logger = mlflow_logger(trainer)
        if logger is not None:
            for path in paths:
                logger.experiment.log_artifact(logger.run_id, str(path))

    def _earliest_logged(self, trainer, keys: list[str]) -> tuple[int, dict[str, float]] | None:
        """(epoch, values) of the earliest validation logged to this MLflow run, for a resumed fit
        (with :class:`PawMLFlowLogger`, whose steps are epochs)."""
        logger = mlflow_logger(trainer)
        if not isinstance(logger, PawMLFlowLogger) or not keys:
            return None
        client, run_id = logger.experiment, logger.run_id
        history = client.get_metric_history(run_id, f"{self.split}/episode/success_rate") or client.get_metric_history(run_id, keys[0])
        if not history:
            return None
        step = min(m.step for m in history)
        values = {}
        for key in keys:
            at = [m for m in client.get_metric_history(run_id, key) if m.step == step]
            if at:
                values[key] = max(at, key=lambda m: m.timestamp).value
        return step, values



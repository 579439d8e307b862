"""Read an MLflow experiment back: group runs into configurations, aggregate over seeds,
format the results table and draw learning curves (used by ``experiments/report.py``,
``experiments/compare_algorithms.py`` and ``notebooks/compare_runs.ipynb``).

A run's configuration is its ``config`` tag, else its run name without ``/seed<N>`` (further
fallbacks in the design notes); one number per run and metric: its ``last`` value, or every
metric at the ``best`` step of ``<split>/episode/success_rate``; over seeds, mean ± sample
std (n − 1). Metric points belong to the epoch logged at their step (``epoch`` metric).

"""
from __future__ import annotations

import bisect
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import mlflow
import scipy.stats
from mlflow.entities import Run

TASK_TYPES = ("pick", "look", "clean", "heat", "cool", "pick2")  # ALFWorld's column order (metrics.TASK_TYPE_NAMES)
BASE = "base"
RATE_NAMES = ("exact_match", "token_acc", "first_token_acc", "pass_at_1", "invalid_rate", "env_error_rate", "top_action_share")


def default_tracking_uri() -> str:
    """``$MLFLOW_TRACKING_URI`` or ``sqlite:///<cwd>/mlflow.db``, the training runs' default
    (:func:`paw_lightning.tracking.default_tracking_uri`, without importing Lightning)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd().resolve() / 'mlflow.db'}"


def load_runs(tracking_uri: str, experiment: str, statuses: tuple[str, ...] | None = ("FINISHED",)) -> tuple[mlflow.MlflowClient, list[Run]]:
    """The runs of ``experiment`` (oldest first) whose status is in ``statuses`` (None: all)."""
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise ValueError(f"MLflow experiment {experiment!r} not found at {tracking_uri}: choose one of {', '.join(names) or '(none)'}")
    runs, token = [], None
    while True:
        page = client.search_runs([exp.experiment_id], order_by=["attributes.start_time ASC"], max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            break
    if statuses is not None:
        runs = [r for r in runs if r.info.status in statuses]
    return client, runs


def config_label(run: Run, group_by: list[str] | None = None) -> str:
    """The configuration a run belongs to (rules in the module docstring)."""
    tags = run.data.tags
    if group_by:
        return "+".join(tags.get(t, "?") for t in group_by)
    if tags.get("config"):
        return tags["config"]
    name = run.info.run_name or ""
    match = re.match(r"^(.+)/seed[^/]*$", name)
    if match:
        return match.group(1)
    if not any(k.startswith("train/") for k in run.data.metrics):
        return BASE
    if "advantage" in tags:
        return f"{tags['advantage']}+{tags.get('world_model_objective', 'none')}"
    return name or run.info.run_id


def group_runs(runs: list[Run], group_by: list[str] | None = None) -> dict[str, list[Run]]:
    """Runs by configuration: ``base`` first, then in order of each configuration's first run.
    When the runs span several environments (their ``env`` tag) and ``group_by`` is not
    given, every configuration is prefixed with its environment (``sokoban: grpo+paw``),
    environments in order of their first run."""
    ordered = sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_name or ""))
    envs = list(dict.fromkeys(r.data.tags.get("env", "") for r in ordered))
    by_env = group_by is None and len(envs) > 1
    groups: dict[str, tuple[tuple[int, bool], list[Run]]] = {}
    for run in ordered:
        env, label = run.data.tags.get("env", ""), config_label(run, group_by)
        name = f"{env or '?'}: {label}" if by_env else label
        groups.setdefault(name, ((envs.index(env) if by_env else 0, label != BASE), []))[1].append(run)
    return {name: members for name, (_, members) in sorted(groups.items(), key=lambda kv: kv[1][0])}


def run_values(client: mlflow.MlflowClient, run: Run, keys: list[str], select: str = "last", select_key: str = "val/episode/success_rate") -> dict[str, float]:
    """One value per metric of ``keys`` the run has: at its last step (``last``) or at the
    step of the best ``select_key`` (``best``; the last values if the run lacks it)."""
    if select not in ("last", "best"):
        raise ValueError(f"select must be 'last' or 'best', got {select!r}")
    last = {k: run.data.metrics[k] for k in keys if k in run.data.metrics}
    history = [m for m in client.get_metric_history(run.info.run_id, select_key) if m.step >= 0] if select == "best" else []
    if not history:
        return last
    best_step = max(history, key=lambda m: (m.value, -m.step)).step
    values = {}
    for key in last:
        at_step = [m for m in client.get_metric_history(run.info.run_id, key) if m.step == best_step]
        if at_step:
            values[key] = max(at_step, key=lambda m: m.timestamp).value
    return values


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of ``values`` and the two-sided ``level`` confidence interval of that mean from
    Student's t: mean ± t_{n−1, (1+level)/2} · s / √n, s the sample std (n − 1). It assumes
    independent values (one per seed) from a roughly normal distribution. Needs n ≥ 2."""
    if len(values) < 2:
        raise ValueError(f"a confidence interval needs at least 2 values, got {len(values)}")
    mean, std = mean_std(values)
    half = float(scipy.stats.t.ppf((1 + level) / 2, len(values) - 1)) * std / math.sqrt(len(values))
    return mean, mean - half, mean + half


def binomial_variance(rate: float, episodes: int) -> float:
    """The sampling variance of a success rate measured on ``episodes`` independent episodes,
    estimated without bias from the rate p̂ itself: p̂(1 − p̂) / (n − 1). (Var(p̂) = p(1 − p) / n
    and E[p̂(1 − p̂)] = p(1 − p)(n − 1) / n.) It is what the episodes alone make a rate vary
    by, with the policy held fixed. Needs n ≥ 2."""
    if episodes < 2:
        raise ValueError(f"a binomial variance needs at least 2 episodes, got {episodes}")
    return rate * (1.0 - rate) / (episodes - 1)


def is_rate(key: str) -> bool:
    """Metrics shown in percent: success rates and the other fractions in ``RATE_NAMES``."""
    return "success_rate" in key or key.rsplit("/", 1)[-1] in RATE_NAMES


def format_cell(key: str, values: list[float]) -> str:
    if not values:
        return "–"
    scale, digits = (100.0, 1) if is_rate(key) else (1.0, 2)
    mean, std = mean_std([v * scale for v in values])
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"


def table_columns(runs: list[Run], split: str = "val", extra: list[str] = ()) -> list[tuple[str, str]]:
    """(header, metric key) pairs: success per task type (ALFWorld's order, then any other
    type), overall success, mean return, then ``extra`` keys; only metrics some run has."""
    present = set().union(*(r.data.metrics for r in runs)) if runs else set()
    success = f"{split}/episode/success_rate"
    typed = [k[len(success) + 1:] for k in present if k.startswith(success + "/")]
    types = [t for t in TASK_TYPES if t in typed] + sorted(t for t in typed if t not in TASK_TYPES)
    columns = [(t.capitalize(), f"{success}/{t}") for t in types]
    columns += [("All", success), ("Return", f"{split}/episode/return_mean")]
    columns += [(key, key) for key in extra]
    return [(header, key) for header, key in columns if key in present]


def results_table(client: mlflow.MlflowClient, runs: list[Run], split: str = "val", select: str = "last",
                  extra: list[str] = (), group_by: list[str] | None = None) -> str:
    """Markdown table: one row per configuration, one column per metric (mean ± std over
    its runs; success rates in %), and the number of runs."""
    columns = table_columns(runs, split, list(extra))
    keys = [key for _, key in columns]
    lines = ["| Configuration | " + " | ".join(h for h, _ in columns) + " | Runs |", "|---" * (len(columns) + 2) + "|"]
    for label, group in group_runs(runs, group_by).items():
        per_run = [run_values(client, run, keys, select, f"{split}/episode/success_rate") for run in group]
        cells = [format_cell(key, [v[key] for v in per_run if key in v]) for key in keys]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {len(group)} |")
    return "\n".join(lines)


def epoch_series(client: mlflow.MlflowClient, run: Run, key: str) -> list[tuple[int, float]]:
    """(epoch, value) points of one metric of one run (the last value logged in an epoch)."""
    epoch_points = sorted((m.step, int(m.value)) for m in client.get_metric_history(run.info.run_id, "epoch"))
    steps = [s for s, _ in epoch_points]
    points: dict[int, float] = {}
    for m in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: (m.step, m.timestamp)):
        if not epoch_points:
            x = m.step
        else:
            i = bisect.bisect_right(steps, m.step) - 1
            x = epoch_points[max(i, 0)][1]
        points[x] = m.value
    return sorted(points.items())


@dataclass
class Curve:
    """A metric against epochs over a configuration's runs: per epoch the mean, sample std,
    min, max and the number of runs that logged it."""

    epochs: list[int] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)


def curves(client: mlflow.MlflowClient, runs: list[Run], key: str, group_by: list[str] | None = None) -> dict[str, Curve]:
    """One :class:`Curve` of ``key`` per configuration that logged it."""
    out = {}
    for label, group in group_runs(runs, group_by).items():
        by_epoch: dict[int, list[float]] = {}
        for run in group:
            for epoch, value in epoch_series(client, run, key):
                by_epoch.setdefault(epoch, []).append(value)
        if not by_epoch:
            continue
        curve = Curve()
        for epoch in sorted(by_epoch):
            values = by_epoch[epoch]
            mean, std = mean_std(values)
            curve.epochs.append(epoch)
            curve.mean.append(mean)
            curve.std.append(std)
            curve.low.append(min(values))
            curve.high.append(max(values))
            curve.count.append(len(values))
        out[label] = curve
    return out


def plot_curves(ax, curves_by_config: dict[str, Curve], title: str = "", band: str = "std") -> None:
    """Draw one line per configuration on a matplotlib ``ax`` with a shaded seed band:
    mean ± std (``band="std"``) or min..max (``"minmax"``). The ``base`` configuration (a
    validation of the untrained model) is a dashed horizontal line at its mean."""
    if band not in ("std", "minmax"):
        raise ValueError(f"band must be 'std' or 'minmax', got {band!r}")
    for label, c in curves_by_config.items():
        if label == BASE or label.endswith(": " + BASE):
            ax.axhline(statistics.mean(c.mean), linestyle="--", color="gray", label=label)
            continue
        (line,) = ax.plot(c.epochs, c.mean, marker="o", label=f"{label} (n={max(c.count)})")
        low, high = (c.low, c.high) if band == "minmax" else ([m - s for m, s in zip(c.mean, c.std)], [m + s for m, s in zip(c.mean, c.std)])
        ax.fill_between(c.epochs, low, high, color=line.get_color(), alpha=0.2)
    from matplotlib.ticker import MaxNLocator  # matplotlib only where a plot is drawn

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("epoch")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if curves_by_config:
        ax.legend(fontsize="small")

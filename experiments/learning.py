"""The learning benchmark: does RL make the agent better, and what does PaW add?

One command, from a fresh clone, on a 2-core CPU (80 minutes to 2 h 15 min with ``--jobs 2``, depending on
the CPU: docs/results/learning.md#runs-of-the-command)::

    python experiments/learning.py --jobs 2

1. trains the format-only warm-up of ``configs/learning/frozenlake.yaml`` once (random
   admissible actions in the policy's format, cached in the overlay's ``cache_dir``,
   ``runs/warmup-cache`` under the working directory), so every run starts from the same
   policy;
2. runs vanilla RL and PaW (same algorithm, warm-up, tasks and settings; only the
   world-model objective differs) for every seed, ``--jobs`` runs at a time, each
   validating on held-out maps before its first update and every
   ``trainer.check_val_every_n_epoch`` updates (the rollout of every update plays new maps
   too: its success is the on-policy curve);
3. writes ``<out>/results.md`` (the table: held-out success, return, invalid-action rate,
   the world-model NLL on the fixed held-out transitions, ``val/wm_fixed/all/nll``, then
   ``val/wm_onpolicy/nll``, ``val/wm_onpolicy/exact_match`` on the episodes just played, mean ± std over seeds, with the warm-up's own
   row, the lift over it, the PaW − vanilla difference paired by seed with the 95 % confidence
   interval of its mean success difference (Student's t), a bound on the standard error that one
   validation's episodes alone give each row's success, on FrozenLake the scripted reference
   policies' win probability on the same maps (experiments/reference_policies.py), every run on
   its own line, flagged when it ends below its own start, and the RL diagnostics) and
   ``<out>/learning_curves.png`` (validation success, each update's rollout success and the
   validation world-model NLL against updates: mean line, ± std band over seeds; each run's
   rollout invalid-action rate), and prints the table.

``--report-only`` rebuilds the table and the plot from the MLflow store of an earlier
invocation (its runs in ``--experiment``). Arguments after ``--`` go to every run, e.g.
``-- --trainer.max_epochs=30``. Runs are named ``[<method>+]<algorithm>+<objective>/seed<seed>``.
``--algorithms grpo dapo --objectives vanilla`` compares algorithms: every algorithm's runs are
rows of the same table (each with its own lift; PaW − vanilla is paired within an algorithm, and
each algorithm − the first listed within an objective), and the diagnostics include dynamic
sampling's kept share of task groups and its extra rollout rounds. With ``--report-only``,
``--seeds`` selects the runs the report covers (default: every finished seed).
``--methods spa --objectives vanilla`` adds SPA's rows (its SFT stages, then the same RL) to
the same experiment and report. ``-- --data.evaluation.dream.tasks=32 --data.evaluation.dream.horizon=4``
adds the dream evaluation to every validation and a table of its measures to the report
(docs/reference/dream.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
from grid import METHODS, ROOT, GridPoint, env_config, is_method_overlay, kill_running, run_point, summary
from reference_policies import yardstick
from paw_lightning import analysis
from paw_lightning.tracking.logger import EXPERIMENT_KIND

os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per run's summary.json would bury the report


SUCCESS = "val/episode/success_rate"
TRAIN_SUCCESS = "train/episode/success_rate"
TRAIN_INVALID = "train/episode/invalid_rate"
COLUMNS = [  # (header, metric key, shown in %)
    ("Success %", SUCCESS, True),
    ("Return", "val/episode/return_mean", False),
    ("Invalid %", "val/episode/invalid_rate", True),
    ("WM NLL, fixed set", "val/wm_fixed/all/nll", False),  # the fixed held-out transitions: the same data for every run
    ("WM NLL, on-policy", "val/wm_onpolicy/nll", False),  # the episodes just played: moves with the policy
    ("WM exact %, on-policy", "val/wm_onpolicy/exact_match", True),
]
DREAM_COLUMNS = [  # (header, metric key, shown in %): the world model as a simulator (docs/reference/dream.md)
    *((f"exact@{k} %", f"val/dream/exact_at_{k}", True) for k in range(1, 5)),
    ("success in the model %", "val/dream/success", True),
    ("replay success %", "val/dream/replay_success", True),
    ("first divergence (steps)", "val/dream/first_divergence", False),
]
DIAGNOSTICS = [  # (header, ending in % if shown in %; train metric keys (summed) or a per-update series (client, run) -> values; how to reduce a run's values)
    ("response-token entropy (nats), first → last update", ["train/policy/entropy"], "first_last"),
    ("updates with a non-zero advantage %", lambda client, run: nonzero_advantage_updates(client, run), "mean"),  # 0/1 per update: the mean is the share
    ("most frequent action's share of the rollout, first → last update %", ["train/episode/top_action_share"], "first_last"),
    ("clip fraction (mean over updates) %", ["train/policy/clip_frac"], "mean"),
    ("seconds per RL iteration (median)", ["train/perf/rollout_s", "train/perf/scoring_s", "train/perf/update_s"], "median"),  # rollout_s holds dynamic sampling's extra rounds
    ("task groups kept by dynamic sampling (mean over updates) %", ["train/rollout/kept_group_fraction"], "mean"),
    ("extra rollout rounds per update (mean)", ["train/rollout/extra_rounds"], "mean"),
]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="frozenlake", help="environment config (name or path)")
    parser.add_argument("--overlay", default="configs/learning/frozenlake.yaml", help="the benchmark's sizing overlay (last -c)")
    parser.add_argument("--algorithms", "--algorithm", nargs="+", default=["gigpo_verl"], help="overlays of configs/algorithms/")
    parser.add_argument("--objectives", nargs="+", default=["vanilla", "paw"])
    parser.add_argument("--methods", nargs="+", default=["none"], choices=METHODS, help="none (RL alone), spa (SPA's SFT stages before RL), rwml (RWML's stage before RL)")
    parser.add_argument("--seeds", nargs="+", type=int, help="seeds to run (default 0 1 2); with --report-only, the seeds to report (default: every finished one)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (each with cpu_count // jobs torch threads)")
    parser.add_argument("--out", default="runs/learning", help="MLflow store, run folders, warm-up cache, results.md and the PNG")
    parser.add_argument("--experiment", default="learning")
    parser.add_argument("--report-only", action="store_true", help="only rebuild the report from the experiment's finished runs")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{out / 'mlflow.db'}"
    overlay = env_config(args.overlay)  # a clear error for a missing file, before anything runs
    shared = ["-c", str(overlay), *extra]
    if not args.report_only:
        client = mlflow.MlflowClient(uri)  # create the store and the experiment before parallel runs race to
        if client.get_experiment_by_name(args.experiment) is None:
            client.create_experiment(args.experiment, tags={EXPERIMENT_KIND: "custom_model_development"})
        start = time.time()
        for algorithm in dict.fromkeys(args.algorithms):  # alone, with every core; one cached warm-up when they share its settings
            warm_up(args.env, algorithm, shared, out)
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))  # inherited by every run
        points = [GridPoint(env=args.env, algorithm=algorithm, objective=objective, seed=seed, experiment_name=args.experiment, tracking_uri=uri, extra=shared, method=method)
                  for seed in args.seeds or [0, 1, 2] for algorithm in args.algorithms for method in args.methods for objective in args.objectives]  # a seed's runs side by side: the same load
        results = run_points(points, out, args.jobs)
        print("\n" + summary(results) + f"\n\nwall time: {(time.time() - start) / 60:.1f} min\n", flush=True)
        if any(r["status"] != "ok" for r in results):
            print("some runs failed: the report covers the finished ones", file=sys.stderr)
    report = write_report(uri, args.experiment, out, args.algorithms, args.objectives, args.seeds if args.report_only else None)
    print(report)


def warm_up(env: str, algorithm: str, shared: list[str], out: Path) -> None:
    """Train (or find cached) the warm-up once, in a fit of zero epochs, before the runs start
    in parallel (two runs starting together would both train it). A method's ablation overlay
    in ``shared`` (``-c configs/methods/spa_sft1.yaml``) is left out: its stages run in the runs."""
    kept = []
    for arg in shared:
        if kept and kept[-1] == "-c" and is_method_overlay(arg):
            kept.pop()
        else:
            kept.append(arg)
    shared = kept
    cmd = [sys.executable, "-m", "paw_lightning", "fit", "-c", str(env_config(env)), "-c", str(ROOT / "configs/algorithms" / f"{algorithm}.yaml"),
           *shared, "--trainer.max_epochs=0", "--trainer.logger=false", "--summary.enabled=false", "--trainer.enable_progress_bar=false",
           f"--trainer.default_root_dir={out / 'warmup'}", "--data.progress=false"]
    cmd.insert(4, f"--threads={os.cpu_count() or 1}")  # every core, whatever else runs: the cached weights do not depend on the load
    print("warm-up: " + " ".join(cmd[3:]), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    (out / "warmup.log").write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        sys.exit(f"the warm-up failed (exit code {result.returncode}); its log: {out / 'warmup.log'}\n{result.stderr[-2000:]}")
    print("\n".join(line for line in result.stdout.splitlines() if "warm-up" in line), flush=True)


def run_points(points: list[GridPoint], out: Path, jobs: int) -> list[dict]:
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(run_point, p, out / "runs" / p.label / f"seed{p.seed}", num) for num, p in enumerate(points)]
        try:
            return [f.result() for f in futures]
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            kill_running()
            raise


# ------------------------------------------------------------------ report
def validation_series(client, run, key: str) -> dict[int, float]:
    """Updates done → value of ``key`` at that validation (the validation before the first
    update is at 0 updates; the one at the end of epoch e at e + 1)."""
    return {epoch + 1: value for epoch, value in analysis.epoch_series(client, run, key)}


def train_series(client, run, keys: list[str]) -> list[float]:
    """Per update, the sum of ``keys`` (updates that logged all of them)."""
    per_key = [dict(analysis.epoch_series(client, run, key)) for key in keys]
    epochs = sorted(set.intersection(*(set(p) for p in per_key)))
    return [sum(p[e] for p in per_key) for e in epochs]


def nonzero_advantage_updates(client, run) -> list[float]:
    """Per update, 1.0 if any advantage was non-zero (``zero_advantage_fraction`` < 1), else 0.0;
    for a run older than that metric, from ``advantage_std`` > 0 (which misses an update whose
    advantages are all equal and non-zero)."""
    fractions = train_series(client, run, ["train/policy/zero_advantage_fraction"])
    if fractions:
        return [float(f < 1.0) for f in fractions]
    return [float(std > 1e-8) for std in train_series(client, run, ["train/policy/advantage_std"])]


def validation_plan(client, run) -> str | None:
    """What the run's validation played, e.g. ``32 held-out tasks × 1 episode, temperature 1.0``,
    from the ``summary.json`` that RunSummary logged (``None`` for a run without one)."""
    try:
        path = client.download_artifacts(run.info.run_id, "summary.json")
    except mlflow.exceptions.MlflowException:  # no summary logged (e.g. --summary.enabled=false)
        return None
    return json.loads(Path(path).read_text()).get("plan", "").removeprefix("val: ") or None


def held_out_plan(client, runs) -> dict | None:
    """The evaluation plan the runs validated on (``eval`` of the first run's
    ``eval/val_start.json``: environment, maps, episodes per map); ``None`` where no run logged one."""
    for run in runs:
        try:
            path = client.download_artifacts(run.info.run_id, "eval/val_start.json")
        except mlflow.exceptions.MlflowException:
            continue
        return json.loads(Path(path).read_text())["eval"]
    return None


def last(values: dict[int, float]) -> float:
    """The value at the last validation (updates done → value)."""
    return values[max(values)]


def noise_line(label: str, variances: list[float], values: list[float]) -> str:
    """A Markdown bullet: the bound on the standard error that a validation's episodes alone give
    a row's success (√ of the mean over its runs of :func:`~paw_lightning.analysis.binomial_variance`;
    a paired difference adds its two runs' variances), in points, beside the row's std over seeds.

    A bound, not the noise itself: every run plays the same held-out maps, so with a map's win
    probability p_i the draw of the episodes varies a rate by Σ p_i(1 − p_i)/n², and
    p̄(1 − p̄)/n exceeds that by the maps' spread Var(p_i)/n, which is shared by every run, not
    noise; and a seed's two runs share their sampling seeds, which correlates their draws and
    makes their difference vary less than the sum of their variances."""
    if not variances:
        return f"- {label}: no run validated"
    spread = f"its std over seeds {100 * statistics.stdev(values):.1f}" if len(values) > 1 else "1 seed"
    return f"- {label}: at most {100 * math.sqrt(statistics.mean(variances)):.1f} points from the episodes alone; {spread}"


def reduce_diagnostic(values: list[float], how: str) -> float | tuple[float, float] | None:
    if not values:
        return None
    if how == "first_last":
        return values[0], values[-1]
    if how == "median":
        return statistics.median(values)
    return statistics.mean(values)


def cell(values: list[float], percent: bool, signed: bool = False, digits: int | None = None) -> str:
    if not values:
        return "–"
    scale = 100.0 if percent else 1.0
    mean, std = analysis.mean_std([v * scale for v in values])
    digits = digits if digits is not None else 1 if percent else 3
    sign = "+" if signed else ""
    return f"{mean:{sign}.{digits}f}" + (f" ± {std:.{digits}f}" if len(values) > 1 else "")


def interval_line(label: str, diffs: list[float]) -> str:
    """A Markdown bullet: the mean of paired differences (points) and its 95 % confidence
    interval, and whether the interval holds 0."""
    if len(diffs) < 2:
        return f"- {label}: " + (f"{diffs[0]:+.1f} points, 1 seed: no interval" if diffs else "no seed ran both")
    mean, low, high = analysis.mean_interval(diffs)
    verdict = "holds 0: these seeds do not tell the two apart" if low <= 0 <= high else "excludes 0"
    return f"- {label}: {mean:+.1f} points, 95 % CI [{low:+.1f}, {high:+.1f}] over {len(diffs)} seeds; the interval {verdict}"


def run_method(tags: dict) -> str:
    """The method of a run from its ``config`` tag (``[<method>+]<algorithm>+<objective>``):
    ``none`` when it names only the algorithm and the objective."""
    parts = tags.get("config", "").split(",")[0].split("+")
    return parts[0] if len(parts) == 3 and parts[0] in METHODS else "none"


def write_report(uri: str, experiment: str, out: Path, algorithms: list[str], objectives: list[str], seeds: list[int] | None = None) -> str:
    """``results.md`` and ``learning_curves.png`` in ``out`` from the experiment's finished
    runs of ``algorithms`` × ``objectives`` (of ``seeds``; ``None``: every seed); returns the
    Markdown. Differences are paired by seed: PaW − vanilla within an algorithm, and, with
    several algorithms, each algorithm − the first of ``algorithms`` within an objective."""
    client, runs = analysis.load_runs(uri, experiment)
    by_objective: dict[str, dict[int, object]] = {}  # row name → seed → run
    methods: dict[str, tuple[str, str, str]] = {}  # row name → (method, algorithm, objective)
    for run in sorted(runs, key=lambda r: r.info.start_time):  # the latest run of each (row, seed)
        tags = run.data.tags
        algorithm = tags.get("algorithm_overlay")
        if tags.get("objective_overlay") in objectives and algorithm in algorithms and (seeds is None or int(tags["seed"]) in seeds):
            method = run_method(tags)
            name = " + ".join([*([method] if method != "none" else []), algorithm, tags["objective_overlay"]])
            by_objective.setdefault(name, {})[int(tags["seed"])] = run
            methods[name] = (method, algorithm, tags["objective_overlay"])
    if not by_objective:
        of_seeds = f" of seeds {' '.join(map(str, seeds))}" if seeds is not None else ""
        return f"no finished {' or '.join(algorithms)} run of {', '.join(objectives)}{of_seeds} in experiment '{experiment}' ({uri})"
    series = {obj: {seed: {key: validation_series(client, run, key) for _, key, _ in COLUMNS} for seed, run in seed_runs.items()}
              for obj, seed_runs in by_objective.items()}
    header = "| | " + " | ".join(h for h, _, _ in COLUMNS) + " | Lift (points) | Seeds |"
    lines = [header, "|---" * (len(COLUMNS) + 3) + "|"]

    def final(obj, key):
        return [last(s[key]) for s in series[obj].values() if s[key]]

    for method in dict.fromkeys(m for m, _, _ in methods.values()):  # one start row per method: its runs of a seed share it
        starts: dict[int, dict] = {}  # seed → the series of its first row's run (every algorithm starts from the same weights)
        for name in (name for name, (m, _, _) in methods.items() if m == method):
            for seed, s in series[name].items():
                starts.setdefault(seed, s)
        start_success = [v for v in (s[SUCCESS].get(0) for s in starts.values()) if v is not None]
        warm = [cell([s[key][0] for s in starts.values() if 0 in s[key]], pct) for _, key, pct in COLUMNS]
        label = "warm-up" if method == "none" else f"{method}'s stages"
        lines.append(f"| {label} (before RL) | " + " | ".join(warm) + f" | | {len(start_success)} |")
    for obj in series:
        lifts = [last(s[SUCCESS]) - s[SUCCESS].get(0, float("nan"))
                 for s in series[obj].values() if s[SUCCESS]]
        cells = [cell(final(obj, key), pct) for _, key, pct in COLUMNS]
        lines.append(f"| {obj} | " + " | ".join(cells) + f" | {cell(lifts, True, signed=True)} | {len(series[obj])} |")

    intervals: list[str] = []  # a line per paired row: its success difference's confidence interval
    plan = held_out_plan(client, [run for seed_runs in by_objective.values() for run in seed_runs.values()])
    episodes = len(plan.get("task_seeds", [])) * plan.get("group_size", 1) if plan else 0  # one validation's episodes (the runs of one experiment share the plan)
    noise = [noise_line(obj, [analysis.binomial_variance(v, episodes) for v in finals], finals)
             for obj in series for finals in [final(obj, SUCCESS)]] if episodes > 1 else []  # a line per row, then per paired row: the success's measurement noise

    def paired(a: str, b: str, label: str) -> str:  # the row of b − a, over the seeds both ran
        both = sorted(set(series[a]) & set(series[b]))
        finals = {key: [(last(series[a][s][key]), last(series[b][s][key])) for s in both if series[a][s][key] and series[b][s][key]]
                  for _, key, _ in COLUMNS}  # (a, b) at the last validation, per seed
        diffs = {key: [y - x for x, y in pairs] for key, pairs in finals.items()}
        intervals.append(interval_line(label, [100 * d for d in diffs[SUCCESS]]))
        if episodes > 1:
            variances = [analysis.binomial_variance(x, episodes) + analysis.binomial_variance(y, episodes) for x, y in finals[SUCCESS]]
            noise.append(noise_line(label, variances, diffs[SUCCESS]))
        return f"| {label} (paired by seed) | " + " | ".join(cell(diffs[key], pct, signed=True) for _, key, pct in COLUMNS) + f" | | {len(both)} |"

    several = len({a for _, a, _ in methods.values()}) > 1
    for method, algorithm in dict.fromkeys((m, a) for m, a, _ in methods.values()):  # PaW − vanilla within a method and an algorithm
        rows = [name for name, (m, a, _) in methods.items() if (m, a) == (method, algorithm)]
        if len(rows) != 2:
            continue
        a, b = sorted(rows, key=lambda name: methods[name][2] != "vanilla")  # b − a: the other objective minus vanilla, whatever the store's order
        prefix = " + ".join([*([method] if method != "none" else []), *([algorithm] if several else [])])
        lines.append(paired(a, b, f"{prefix + ': ' if prefix else ''}{methods[b][2]} − {methods[a][2]}"))
    for method, objective in dict.fromkeys((m, o) for m, _, o in methods.values()):  # each algorithm − the first listed, within a method and an objective
        rows = sorted((name for name, (m, _, o) in methods.items() if (m, o) == (method, objective)), key=lambda name: algorithms.index(methods[name][1]))
        for b in rows[1:]:
            prefix = f"{method} + " if method != "none" else ""
            lines.append(paired(rows[0], b, f"{prefix}{objective}: {methods[b][1]} − {methods[rows[0]][1]}"))
    updates = max(max(s[SUCCESS] or [0]) for obj in series for s in series[obj].values())
    if intervals:
        lines += ["", f"Held-out success after {updates} updates, difference paired by seed, with the 95 % "
                  "confidence interval of its mean (Student's t over seeds):", "", *intervals]
    if noise:
        lines += ["", f"Measurement noise: a validation plays {episodes} episodes, so its success rate varies with the draw of "
                  "its episodes even with the policy held fixed, by at most the binomial standard error √(p̂(1 − p̂)/(n − 1)) "
                  "per run (every run plays the same maps, so which maps are hard is not noise). Where the bound is well below "
                  "the std over seeds, the runs differ by more than the draw of their episodes:", "", *noise]
    reference = yardstick(plan) if plan else None
    if reference is not None:
        lines += ["", "Scripted policies on the same held-out maps, exact win probability (experiments/reference_policies.py): "
                  f"uniformly random moves {100 * reference['uniform']:.1f} %, random Down-or-Right moves "
                  f"{100 * reference['down_or_right']:.1f} %, a shortest hole-free path {100 * reference['shortest_path']:.1f} %."]
    rollouts = {obj: {seed: dict(analysis.epoch_series(client, run, TRAIN_SUCCESS)) for seed, run in seed_runs.items()}
                for obj, seed_runs in by_objective.items()}  # the rollout of epoch e is played after e updates
    lines += ["", "Success of the updates' own rollouts (new maps every update, training temperature), in %:", "",
              "| | first rollout | mean of the last 3 | change (points) | seeds |", "|---|---|---|---|---|"]
    for obj, seeds in rollouts.items():
        first = [v[min(v)] for v in seeds.values() if v]
        last_three = [statistics.mean(v[e] for e in sorted(v)[-3:]) for v in seeds.values() if v]
        lines.append(f"| {obj} | {cell(first, True)} | {cell(last_three, True)} | {cell([b - a for a, b in zip(first, last_three)], True, signed=True)} | {len(seeds)} |")
    invalid = {obj: {seed: dict(analysis.epoch_series(client, run, TRAIN_INVALID)) for seed, run in seed_runs.items()}
               for obj, seed_runs in by_objective.items()}
    lines += ["", *per_run_table(series, invalid)]
    diag_rows = {}
    for obj, seed_runs in by_objective.items():
        cells = diag_rows[obj] = []
        for header, keys, how in DIAGNOSTICS:
            values = [reduce_diagnostic(keys(client, run) if callable(keys) else train_series(client, run, keys), how) for run in seed_runs.values()]
            values = [v for v in values if v is not None]
            percent = header.endswith("%")
            if how == "first_last":
                cells.append(f"{cell([v[0] for v in values], percent)} → {cell([v[1] for v in values], percent)}" if values else "–")
            else:
                cells.append(cell(values, percent, digits=1 if how == "median" else None))
            if values and len(values) < len(seed_runs):  # a metric that older runs did not log
                cells[-1] += f" ({len(values)} of {len(seed_runs)} runs)"
    shown = [i for i in range(len(DIAGNOSTICS)) if any(cells[i] != "–" for cells in diag_rows.values())]  # a column no run logged is left out
    diag = ["", "RL diagnostics over each run's updates (mean ± std over seeds):", "",
            "| | " + " | ".join(DIAGNOSTICS[i][0] for i in shown) + " |", "|---" * (len(shown) + 1) + "|",
            *(f"| {obj} | " + " | ".join(cells[i] for i in shown) + " |" for obj, cells in diag_rows.items())]
    plans = sorted({validation_plan(client, run) for seed_runs in by_objective.values() for run in seed_runs.values()} - {None})
    described = f" ({'; '.join(plans)})" if plans else ""
    text = "\n".join([f"Held-out validation{described} after {updates} updates (warm-up row: before the first update); "
                      "success, invalid and exact match in %, mean ± std over seeds.", "", *lines, *diag, *dream_table(client, by_objective), ""])
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({obj: {str(seed): s for seed, s in v.items()} for obj, v in series.items()}, indent=1))
    plot(series, rollouts, invalid, out / "learning_curves.png", reference)
    return text + f"\nwritten: {out / 'results.md'}, {out / 'learning_curves.png'}\n"


def dream_table(client, by_objective: dict) -> list[str]:
    """The dream measures (``val/dream/*``, when the runs logged them) per objective, mean ± std
    over seeds: at the validation before the first update (the warm-up's weights) and at the
    last one. Empty when no run logged them."""
    series = {obj: [{key: validation_series(client, run, key) for _, key, _ in DREAM_COLUMNS} for run in seed_runs.values()]
              for obj, seed_runs in by_objective.items()}
    if not any(values for runs in series.values() for s in runs for values in s.values()):
        return []
    lines = ["", "The world model as a simulator (held-out dreams, docs/reference/dream.md): k-step fidelity, success of imagined "
             "episodes inside the model, their actions replayed in the real environment; mean ± std over seeds:", "",
             "| | " + " | ".join(h for h, _, _ in DREAM_COLUMNS) + " | seeds |", "|---" * (len(DREAM_COLUMNS) + 2) + "|"]
    for obj, runs in series.items():
        for label, at in (("before RL (warm-up)", lambda v: v.get(0)), ("after the last update", lambda v: v[max(v)] if v else None)):
            cells = [cell([x for x in (at(s[key]) for s in runs) if x is not None], pct) for _, key, pct in DREAM_COLUMNS]
            lines.append(f"| {obj}, {label} | " + " | ".join(cells) + f" | {len(runs)} |")
    return lines


def per_run_table(series: dict, invalid: dict) -> list[str]:
    """Every run on its own line: held-out success and invalid-action rate at each validation,
    the invalid rate of its first and last update's rollout, and a flag on a run whose held-out
    success ends below its own start (before the first update)."""
    def path(values: dict[int, float]) -> str:
        return " → ".join(f"{100 * values[u]:.1f}" for u in sorted(values)) or "–"

    lines = ["Every run (held-out success and invalid-action rate in % at each validation; the rollouts' invalid rate "
             "at the first and the last update):", "",
             "| run | held-out success | held-out invalid | rollout invalid, first → last | |", "|---|---|---|---|---|"]
    below = []
    for obj, seeds in series.items():
        for seed in sorted(seeds):
            success = seeds[seed][SUCCESS]
            rollout = invalid[obj].get(seed, {})
            ends_below = bool(success) and 0 in success and success[max(success)] < success[0]
            if ends_below:
                below.append(f"{obj}, seed {seed}")
            first_last = f"{100 * rollout[min(rollout)]:.1f} → {100 * rollout[max(rollout)]:.1f}" if rollout else "–"
            lines.append(f"| {obj}, seed {seed} | {path(success)} | {path(seeds[seed]['val/episode/invalid_rate'])} | {first_last} | "
                         f"{'**ends below its start**' if ends_below else ''} |")
    lines += ["", f"Runs that end below their own start: {', '.join(below)}." if below else "No run ends below its own start."]
    return lines


def plot(series: dict, rollouts: dict, invalid: dict, path: Path, reference: dict[str, float] | None = None) -> None:
    """Validation success, the success of every update's rollout (new maps each time, at the
    training temperature) and the validation WM NLL against updates: mean over seeds, ± std band,
    with random Down-or-Right moves' win probability on the held-out maps as a dashed line where
    ``reference`` has it; and each run's rollout invalid-action rate per update, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4))
    panels = [
        (series, SUCCESS, "held-out success (%), validation", 100.0),
        ({obj: {seed: {TRAIN_SUCCESS: v} for seed, v in seeds.items()} for obj, seeds in rollouts.items()}, TRAIN_SUCCESS, "success of each update's rollout (%), new maps", 100.0),
        (series, "val/wm_onpolicy/nll", "held-out world-model NLL (nats/token)", 1.0),
    ]
    for ax, (data, key, title, scale) in zip(axes[:3], panels):
        for obj, seeds in data.items():
            xs = sorted(set().union(*(s[key] for s in seeds.values())))
            values = [[s[key][x] * scale for s in seeds.values() if x in s[key]] for x in xs]
            mean = [statistics.mean(v) for v in values]
            std = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in values]
            (line,) = ax.plot(xs, mean, marker="o", label=f"{obj} (n={len(seeds)})")
            ax.fill_between(xs, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], color=line.get_color(), alpha=0.2)
        if reference is not None and ax is axes[0]:
            ax.axhline(100 * reference["down_or_right"], color="gray", linestyle="--", label=f"random Down-or-Right moves ({100 * reference['down_or_right']:.1f})")
        ax.set_xlabel("updates (0: after the warm-up)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes[3]
    for color, (obj, seeds) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], invalid.items()):
        for n, (seed, values) in enumerate(sorted(seeds.items())):
            xs = sorted(values)
            ax.plot(xs, [100 * values[x] for x in xs], color=color, alpha=0.6, linewidth=1, label=obj if n == 0 else None)
    ax.set_xlabel("updates (0: after the warm-up)")
    ax.set_title("invalid actions in each update's rollout (%), one line per run")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()

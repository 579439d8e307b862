"""Compare RL algorithms over seeds without Hydra: one `python -m paw_lightning fit` process
per (algorithm, seed), all in one MLflow experiment, then the results table of
``report.py`` (validation success in %, mean ± std over seeds, plus the last training
success). A thin wrapper over ``grid.py``, the machinery of ``sweep.py``.

    python experiments/compare_algorithms.py                                  # GRPO, GiGPO, RLOO × seeds 0, 1, 2
    python experiments/compare_algorithms.py --algorithms grpo gigpo --seeds 0 1 --epochs 4 \\
        --objective paw -- --data.rollout.groups=4                                    # after "--": extra CLI arguments
    python experiments/compare_algorithms.py --jobs 2 --epochs 4 -- -c configs/warmup.yaml   # the measured comparison (docs/results/learning.md)

``--jobs N`` runs N points at a time, each with ``cpu_count // N`` torch threads (unless
``OMP_NUM_THREADS`` is set): on a small shared CPU two 1-thread runs beat one 2-thread run.
Every run uses the same environment config, number of epochs and seeds and validates once,
after its last epoch; a failed run is reported and does not stop the others (exit code 1
if any failed). Runs are named ``<algorithm>+<objective>/seed<seed>`` and write their logs
and checkpoints under ``runs/<experiment>/``. The general tool is ``sweep.py``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlflow
from grid import ROOT, GridPoint, kill_running, run_point, summary
from paw_lightning import analysis
from paw_lightning.tracking.logger import EXPERIMENT_KIND


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/frozenlake.yaml"), help="environment config (name or path)")
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "gigpo", "rloo"])
    parser.add_argument("--objective", default="vanilla", help="an overlay of configs/objectives/ (vanilla, paw, …)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--experiment", default="compare-algorithms")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db")
    parser.add_argument("--jobs", type=int, default=1, help="runs at a time")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if args.jobs > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))  # inherited by every run
    uri = args.tracking_uri or analysis.default_tracking_uri()
    print(f"{len(args.algorithms) * len(args.seeds)} runs of {args.epochs} epochs into MLflow experiment '{args.experiment}'", flush=True)
    start_ms = int(time.time() * 1000)
    client = mlflow.MlflowClient(uri)  # create the store and the experiment once, before parallel runs race to
    if client.get_experiment_by_name(args.experiment) is None:
        client.create_experiment(args.experiment, tags={EXPERIMENT_KIND: "custom_model_development"})
    points = [GridPoint(env=args.config, algorithm=algorithm, objective=args.objective, seed=seed, experiment_name=args.experiment,
                        tracking_uri=uri, epochs=args.epochs, extra=[f"--trainer.check_val_every_n_epoch={args.epochs}", *extra])
              for algorithm in args.algorithms for seed in args.seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_point, p, Path("runs", args.experiment, p.label, f"seed{p.seed}"), num) for num, p in enumerate(points)]
        try:
            results = [f.result() for f in futures]
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            kill_running()
            raise
    print("\n" + summary(results) + "\n")
    client, runs = analysis.load_runs(uri, args.experiment)
    names = {r["run_name"] for r in results}
    runs = [run for run in runs if run.info.run_name in names and run.info.start_time >= start_ms]  # this invocation's runs
    print("Validation at the last epoch, mean ± std over seeds (success in %):\n")
    print(analysis.results_table(client, runs, extra=["train/episode/success_rate"]) if runs else "(no finished run)")
    sys.exit(1 if any(r["status"] != "ok" for r in results) else 0)


if __name__ == "__main__":
    main()

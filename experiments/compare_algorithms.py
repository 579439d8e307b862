"""Compare RL algorithms over seeds without Hydra: one `python -m paw_lightning fit` process
per (algorithm, seed), all in one MLflow experiment, then the results table of
``report.py`` (validation success in %, mean ± std over seeds, plus the last training
success). A thin wrapper over ``grid.py``, the machinery of ``sweep.py``.

    python experiments/compare_algorithms.py                                  # GRPO, GiGPO, RLOO × seeds 0, 1, 2
    python experiments/compare_algorithms.py --algorithms grpo gigpo --seeds 0 1 --epochs 4 \\
        --objective paw -- --data.groups=4                                    # after "--": extra CLI arguments

Every run uses the same environment config, number of epochs and seeds and validates once,
after its last epoch; a failed run is reported and does not stop the others (exit code 1
if any failed). Runs are named ``<algorithm>+<objective>/seed<seed>`` and write their logs
and checkpoints under ``runs/<experiment>/``. The general tool is ``sweep.py``.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from grid import ROOT, GridPoint, run_point, summary
from paw_lightning import analysis


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs/frozenlake.yaml"), help="environment config (name or path)")
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "gigpo", "rloo"])
    parser.add_argument("--objective", default="vanilla", help="an overlay of configs/objectives/ (vanilla, paw, …)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--experiment", default="compare-algorithms")
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///<cwd>/mlflow.db")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    uri = args.tracking_uri or analysis.default_tracking_uri()
    print(f"{len(args.algorithms) * len(args.seeds)} runs of {args.epochs} epochs into MLflow experiment '{args.experiment}'", flush=True)
    results, start_ms = [], int(time.time() * 1000)
    for algorithm in args.algorithms:
        for seed in args.seeds:
            point = GridPoint(env=args.config, algorithm=algorithm, objective=args.objective, seed=seed, experiment_name=args.experiment,
                              tracking_uri=uri, epochs=args.epochs, extra=[f"--trainer.check_val_every_n_epoch={args.epochs}", *extra])
            results.append(run_point(point, Path("runs", args.experiment, point.label, f"seed{seed}"), num=len(results)))
    print("\n" + summary(results) + "\n")
    client, runs = analysis.load_runs(uri, args.experiment)
    names = {r["run_name"] for r in results}
    runs = [run for run in runs if run.info.run_name in names and run.info.start_time >= start_ms]  # this invocation's runs
    print("Validation at the last epoch, mean ± std over seeds (success in %):\n")
    print(analysis.results_table(client, runs, extra=["train/episode/success_rate"]) if runs else "(no finished run)")
    sys.exit(1 if any(r["status"] != "ok" for r in results) else 0)


if __name__ == "__main__":
    main()

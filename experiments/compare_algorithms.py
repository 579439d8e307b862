"""Compare RL algorithms over seeds: one `python -m paw_lightning fit` process per (algorithm, seed),
all in one MLflow experiment, then a Markdown table of success rate mean ± std over seeds.

    python experiments/compare_algorithms.py                                  # GRPO, GiGPO, RLOO × seeds 0, 1, 2
    python experiments/compare_algorithms.py --algorithms grpo gigpo --seeds 0 1 --epochs 4 \\
        --objective paw -- --data.groups=4                                    # after "--": extra CLI overrides

Every run uses the same environment config, number of epochs and seeds; a failed run is
reported and does not stop the others. Results read back from MLflow: the last
``train/episode/success_rate`` and ``val/episode/success_rate`` of each run.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlflow

ROOT = Path(__file__).resolve().parents[1]


def run_one(config: Path, algorithm: str, objective: str, seed: int, epochs: int, experiment: str, tracking_uri: str, extra: list[str]) -> bool:
    cmd = [
        sys.executable, "-m", "paw_lightning", "fit", "-c", str(config),
        "-c", str(ROOT / f"configs/algorithms/{algorithm}.yaml"), "-c", str(ROOT / f"configs/objectives/{objective}.yaml"),
        f"--seed_everything={seed}", f"--trainer.max_epochs={epochs}", f"--trainer.check_val_every_n_epoch={epochs}",
        f"--trainer.logger.init_args.experiment_name={experiment}", f"--trainer.logger.init_args.tracking_uri={tracking_uri}",
        f"--trainer.logger.init_args.run_name={algorithm}-{objective}-seed{seed}", "--trainer.enable_progress_bar=false",
        "--data.progress=false", f"--trainer.default_root_dir=runs/{experiment}/{algorithm}-{objective}-seed{seed}", *extra,
    ]
    start = time.time()
    result = subprocess.run(cmd, capture_output=True, text=True)
    status = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode}): {result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''}"
    print(f"  {algorithm:<10} seed {seed}: {status} ({time.time() - start:.0f} s)", flush=True)
    return result.returncode == 0


def table(experiment: str, tracking_uri: str, keys: list[str]) -> str:
    client = mlflow.MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    rows: dict[str, dict[str, list[float]]] = {}
    for run in client.search_runs([exp.experiment_id]):
        name = run.data.tags.get("mlflow.runName", "").rsplit("-seed", 1)[0]
        for key in keys:
            if key in run.data.metrics:
                rows.setdefault(name, {}).setdefault(key, []).append(run.data.metrics[key])
    lines = ["| algorithm-objective | " + " | ".join(keys) + " | seeds |", "|---" * (len(keys) + 2) + "|"]
    for name in sorted(rows):
        cells = []
        for key in keys:
            values = rows[name].get(key, [])
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{100 * statistics.mean(values):.1f} ± {100 * std:.1f}" if values else "–")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {max(len(v) for v in rows[name].values())} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=ROOT / "configs/frozenlake.yaml")
    parser.add_argument("--algorithms", nargs="+", default=["grpo", "gigpo", "rloo"])
    parser.add_argument("--objective", default="vanilla", help="an overlay of configs/objectives/ (vanilla, paw, …)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--experiment", default="compare-algorithms")
    parser.add_argument("--tracking-uri", default=f"sqlite:///{Path.cwd() / 'mlflow.db'}")
    args, extra = parser.parse_known_args()
    extra = [a for a in extra if a != "--"]
    print(f"{len(args.algorithms) * len(args.seeds)} runs of {args.epochs} epochs into MLflow experiment '{args.experiment}'")
    for algorithm in args.algorithms:
        for seed in args.seeds:
            run_one(args.config, algorithm, args.objective, seed, args.epochs, args.experiment, args.tracking_uri, extra)
    print("\nSuccess rate (%) at the last epoch, mean ± std over seeds:\n")
    print(table(args.experiment, args.tracking_uri, ["train/episode/success_rate", "val/episode/success_rate"]))


if __name__ == "__main__":
    main()

"""Seconds per RL iteration, variants side by side in one run: the learning benchmark's prompt
and observation settings before and after the compact ones (``--suite learning``), or the
main job's epoch before and after its speed-ups (``--suite main_job``).

Each variant is a real ``python -m paw_lightning fit`` of one epoch (one RL iteration: rollout,
scoring pass, update) of the suite's config files (``learning``: ``configs/frozenlake.yaml`` +
the algorithm + the objective + the learning overlay ``configs/learning/frozenlake.yaml``;
``main_job``: ``configs/alfworld.yaml``), without validation, that differs only in the
arguments of the variant; the iteration's ``train/perf/rollout_s``, ``scoring_s`` and
``update_s`` (:mod:`paw_lightning.training.perf`) are read back from a throw-away MLflow store.
Variants run alternately, ``--reps`` times each; the table gives the median and the range,
and the ratio of the medians to the first variant. The format warm-up is trained once
per variant (its cache in the temporary directory) before the timed repetitions, so both
variants start from a policy that answers in the format.

    python benchmarks/iteration_time.py                      # the learning suite: before vs after, 3 repetitions
    python benchmarks/iteration_time.py --reps 5 --threads 1
    python benchmarks/iteration_time.py --suite main_job --threads 2
    python benchmarks/iteration_time.py -- --model.lm.name_or_path=DIR   # after "--": CLI arguments of every fit

Variants (``SUITES``). ``learning``: ``before``: verl-agent's prompt with K = 2 history, SPA's
grid + coordinates observation and π_old recomputed by a scoring forward; ``after``: the
learning overlay's settings: the compact prompt, K = 0, coordinates only, π_old from the
sampler (``model.old_logprobs: rollout``). ``main_job``: ``before``: float32 weights and
π_old recomputed by scoring forwards of 8 samples (the main job when issue 16 was filed, but
its forwards now grouped by length); ``float32``:
π_old from the sampler; ``bfloat16``: also ``model.lm.dtype: auto`` (bfloat16 on a CPU with
AMX or AVX-512 BF16), computing in float32 where the LoRA branch is (``trainer.precision:
32-true``); ``merged``: also rollouts from a merged copy (``HFEngine(merge_lora=True)``);
``batched``: also ``bf16-mixed`` (autocast), which ``dtype: auto`` now picks for a bfloat16
base; these five train micro-batches of up to 2048 padded tokens (several samples each,
``model.micro_batch_rows: null``); ``after``: also one unpadded sample per micro-batch: the
main job now; ``ct2``: rollouts from the CTranslate2 int8 engine instead (2 workers), which
needs π_old recomputed (``model.old_logprobs: recompute``; its scoring pass one sample per
forward, as the recipe's ``score_batch_size: 1`` sets).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
from machine import machine_load

ROOT = Path(__file__).resolve().parents[1]
SUITES = {
    "learning": {
        "configs": lambda args: ["configs/frozenlake.yaml", f"configs/algorithms/{args.algorithm}.yaml", f"configs/objectives/{args.objective}.yaml", "configs/learning/frozenlake.yaml"],
        "variants": {
            "before": ["--data.rollout.prompt_style=verl", "--data.rollout.history_length=2",
                       "--data.env_kwargs={size: 3, hole_prob: 0.2, layout: corners, observation: full}", "--model.old_logprobs=recompute"],
            "after": [],
        },
    },
    "main_job": {
        "configs": lambda args: ["configs/alfworld.yaml"],
        "variants": {
            "before": ["--model.lm.dtype=float32", "--model.old_logprobs=recompute", "--model.score_batch_size=8", "--model.engine.init_args.merge_lora=false",
                       "--model.micro_batch_rows=null"],
            "float32": ["--model.lm.dtype=float32", "--model.engine.init_args.merge_lora=false", "--model.micro_batch_rows=null"],
            "bfloat16": ["--model.engine.init_args.merge_lora=false", "--trainer.precision=32-true", "--model.micro_batch_rows=null"],
            "merged": ["--trainer.precision=32-true", "--model.micro_batch_rows=null"],
            "batched": ["--model.micro_batch_rows=null"],
            "after": [],
            "ct2": ["--model.engine=paw_lightning.rollout.ct2.CT2Engine", "--model.old_logprobs=recompute"],
        },
    },
}
PHASES = ("rollout_s", "scoring_s", "update_s")


def run_iteration(name: str, workdir: Path, args, warm_up_only: bool = False) -> dict[str, float]:
    """One fit of one epoch (or of none: only the warm-up, to fill its cache); its perf metrics."""
    suite = SUITES[args.suite]
    cmd = [
        sys.executable, "-m", "paw_lightning", "fit",
        *[arg for config in suite["configs"](args) for arg in ("-c", str(ROOT / config))],
        *suite["variants"][name],
        f"--trainer.max_epochs={0 if warm_up_only else 1}", "--trainer.limit_val_batches=0", "--summary.enabled=false",
        "--trainer.enable_progress_bar=false", "--data.progress=false", "--checkpoint.save_last=false", "--checkpoint.every_n_epochs=0",
        f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}", f"--trainer.logger.init_args.experiment_name={name}",
        f"--trainer.default_root_dir={workdir / 'runs'}", f"--seed_everything={args.seed}", *args.extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    result = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{name}: the fit failed (exit code {result.returncode}):\n{result.stderr[-3000:]}")
    if warm_up_only:
        return {}
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run = client.search_runs([client.get_experiment_by_name(name).experiment_id], order_by=["attributes.start_time DESC"])[0]
    return {phase: run.data.metrics[f"train/perf/{phase}"] for phase in PHASES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=sorted(SUITES), default="learning", help="which variants (default: learning)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per fit (OMP_NUM_THREADS)")
    parser.add_argument("--algorithm", default="gigpo_verl")
    parser.add_argument("--objective", default="paw")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--variants", nargs="+", help="a subset of the suite's variants, in this order (default: all)")
    args, extra = parser.parse_known_args()
    args.extra = [a for a in extra if a != "--"]
    variants = args.variants or list(SUITES[args.suite]["variants"])
    unknown = set(variants) - set(SUITES[args.suite]["variants"])
    if unknown:
        parser.error(f"--variants: {', '.join(sorted(unknown))} not in suite {args.suite} ({', '.join(SUITES[args.suite]['variants'])})")
    times: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="iteration_time-") as tmp:
        workdir = Path(tmp)
        for name in variants:
            print(f"{name}: warm-up (trained once, cached)", file=sys.stderr, flush=True)
            run_iteration(name, workdir, args, warm_up_only=True)
        for rep in range(args.reps):
            for name in variants:
                times[name].append(run_iteration(name, workdir, args))
                total = sum(times[name][-1].values())
                print(f"rep {rep + 1}/{args.reps} {name}: {total:.1f} s ({machine_load()})", file=sys.stderr, flush=True)
    what = f"{args.algorithm} + {args.objective}" if args.suite == "learning" else "configs/alfworld.yaml"
    print(f"seconds per RL iteration ({args.suite}: {what}), {args.threads} torch thread(s), "
          f"median [min, max] of {args.reps} alternated repetitions; {machine_load()} at the end\n")
    header = f"{'variant':8s} " + " ".join(f"{p[:-2]:>22s}" for p in (*PHASES, "total_s")) + "   total vs first"
    print(header + "\n" + "-" * len(header))
    first = None
    for name, reps in times.items():
        cols = [[r[p] for r in reps] for p in PHASES] + [[sum(r.values()) for r in reps]]
        total = statistics.median(cols[-1])
        first = first or total
        cells = " ".join(f"{statistics.median(c):8.1f} [{min(c):5.1f}, {max(c):5.1f}]" for c in cols)
        print(f"{name:8s} {cells}   {total / first:.3f}x")


if __name__ == "__main__":
    main()

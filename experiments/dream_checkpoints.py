"""The world model as a simulator, measured on a learning benchmark's weights (docs/reference/dream.md).

For every seed, ``validate`` runs with the dream evaluation on the warm-up's weights (before RL:
the same weights for every objective and seed, so ``--warmup-once`` validates them with the
first seed only) and on each objective's ``last.ckpt`` (after the last update), on the
benchmark's held-out maps with the run's own seed. Then ``<out>/dream/results.md``: k-step fidelity (exact, CER and state match for
k = 1 … horizon), success inside the model, replay success and first divergence, with the
teacher-forced ``val/wm_onpolicy/*`` beside them, mean ± std over seeds. A validation whose report is
already there with the same dream settings is not run again::

    python experiments/learning.py --seeds 4 5 6 --out runs/learning-guard -- --model.lm.dtype=float32
    python experiments/dream_checkpoints.py --out runs/learning-guard --seeds 4 5 6 -- --model.lm.dtype=float32

The runs must have finished (``last.ckpt`` beside a ``summary.json``); the warm-up's weights are
the file ``<out>/warmup.log`` names (run this where the benchmark ran). Arguments after ``--``
go to every ``validate`` (the benchmark's own, e.g. ``--model.lm.dtype=float32``). One
validation at a time, ``--threads`` torch threads.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from grid import ROOT, env_config
from learning import cell

WHOLE = (("success in the model %", "success", True), ("replay success %", "replay_success", True),
         ("first divergence (steps)", "first_divergence", False), ("length", "length", False))
ONE_STEP = (("wm NLL", "val/wm_onpolicy/nll", False), ("wm token acc %", "val/wm_onpolicy/token_acc", True),
            ("first-token NLL", "val/wm_onpolicy/first_token_nll", False), ("first-token acc %", "val/wm_onpolicy/first_token_acc", True))


def benchmark_parser(description: str) -> argparse.ArgumentParser:
    """The options naming a learning benchmark's runs (shared with ``fixed_checkpoints.py``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default="runs/learning", help="the learning benchmark's --out")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--objectives", nargs="+", default=["vanilla", "paw"])
    parser.add_argument("--algorithm", default="gigpo_verl")
    parser.add_argument("--env", default="frozenlake")
    parser.add_argument("--overlay", default=str(ROOT / "configs/learning/frozenlake.yaml"))
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    shared = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = benchmark_parser(__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=32, help="data.evaluation.dream.tasks")
    parser.add_argument("--horizon", type=int, default=4, help="data.evaluation.dream.horizon")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads of each validate")
    parser.add_argument("--warmup-once", action="store_true", help="validate the warm-up's weights (the same for every seed) with the first seed only")
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    out = Path(args.out)
    warmup = warmup_weights(out / "warmup.log")
    results: dict[str, list[dict]] = {"warm-up (before RL)": []}
    for seed in args.seeds:
        if seed == args.seeds[0] or not args.warmup_once:
            results["warm-up (before RL)"].append(validate(args, shared, "warm-up", seed, [f"--model.init_weights={warmup}"], args.objectives[0], out))
        for objective in args.objectives:
            ckpt = last_checkpoint(out / "runs" / f"{args.algorithm}+{objective}" / f"seed{seed}")
            results.setdefault(f"{args.algorithm}+{objective}, after the last update", []).append(
                validate(args, shared, objective, seed, [f"--ckpt_path={ckpt}"], objective, out))
    text = table(results, args)
    (out / "dream").mkdir(parents=True, exist_ok=True)
    (out / "dream" / "results.md").write_text(text)
    print(text + f"\nwritten: {out / 'dream' / 'results.md'}")


def warmup_weights(log: Path) -> str:
    """The cached warm-up file the benchmark's warm-up step saved or loaded (its log names it)."""
    found = re.search(r"warm-up (?:saved to|loaded from) (\S+\.pt)", log.read_text()) if log.is_file() else None
    if found is None:
        sys.exit(f"{log}: no cached warm-up named (run experiments/learning.py with this --out first)")
    if not Path(found.group(1)).is_file():  # the benchmark's cache_dir is relative to its working directory
        sys.exit(f"{log} names {found.group(1)}, not found here: run this from the directory experiments/learning.py ran in")
    return found.group(1)


def last_checkpoint(seed_dir: Path) -> Path:
    """The ``last.ckpt`` of the run that finished (it wrote ``summary.json``) in a seed's folder."""
    done = sorted((p for p in seed_dir.glob("*/*/checkpoints/last.ckpt") if (p.parent.parent / "summary.json").is_file()), key=os.path.getmtime)
    if not done:
        sys.exit(f"{seed_dir}: no finished run (a last.ckpt beside a summary.json)")
    return done[-1]


def validate(args, shared: list[str], name: str, seed: int, weights: list[str], objective: str, out: Path) -> dict[str, float]:
    """One ``validate`` with the dream evaluation; its metrics (the evaluation report's). A report
    left by an earlier invocation with the same dream settings is read instead (resumable)."""
    root = out / "dream" / name / f"seed{seed}"
    earlier = report(root)
    if earlier is not None and earlier["eval"].get("dream") == {"horizon": args.horizon, "tasks": args.tasks}:
        print(f"{name}, seed {seed}: the earlier validation in {root}", flush=True)
        return earlier["metrics"]
    cmd = [sys.executable, "-m", "paw_lightning", "validate", f"--threads={args.threads}",
           "-c", str(env_config(args.env)), "-c", str(ROOT / "configs/algorithms" / f"{args.algorithm}.yaml"),
           "-c", str(ROOT / "configs/objectives" / f"{objective}.yaml"), "-c", args.overlay, *shared, *weights,
           f"--seed_everything={seed}", f"--data.evaluation.dream.tasks={args.tasks}", f"--data.evaluation.dream.horizon={args.horizon}",
           "--trainer.logger=false", f"--trainer.default_root_dir={root}", "--trainer.enable_progress_bar=false", "--data.progress=false"]
    print(f"{name}, seed {seed}: " + " ".join(cmd[3:]), flush=True)
    result = subprocess.run(cmd, capture_output=True, text=True)
    root.mkdir(parents=True, exist_ok=True)
    (root / "validate.log").write_text(result.stdout + result.stderr)
    written = report(root)
    if result.returncode != 0 or written is None:
        sys.exit(f"{name}, seed {seed}: validate failed (exit code {result.returncode}); its log: {root / 'validate.log'}\n{result.stderr[-2000:]}")
    return written["metrics"]


def report(root: Path) -> dict | None:
    """The newest evaluation report under ``root`` (``None``: none)."""
    reports = sorted((root / "eval").glob("val_*.json"), key=os.path.getmtime)
    return json.loads(reports[-1].read_text()) if reports else None


def table(results: dict[str, list[dict]], args) -> str:
    """Markdown: fidelity per k, then the whole-episode measures, then ``val/wm_onpolicy/*``; mean ± std over seeds."""
    ks = range(1, args.horizon + 1)
    fidelity = [(f"{short}@{k}{' %' if pct else ''}", f"val/dream/{key}_{k}", pct)
                for key, short, pct in (("exact_at", "exact", True), ("cer_at", "CER", False), ("state_match_at", "state", True)) for k in ks]
    columns = [*fidelity, *((h, f"val/dream/{k}", p) for h, k, p in WHOLE), *ONE_STEP]
    lines = [f"Dream evaluation ({args.tasks} held-out tasks, horizon {args.horizon}) of {args.env}'s learning benchmark weights, "
             f"seeds {', '.join(map(str, args.seeds))}; mean ± std over seeds.", "",
             "| weights | " + " | ".join(h for h, _, _ in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, runs in results.items():
        lines.append(f"| {name} | " + " | ".join(cell([r[key] for r in runs if key in r], pct) for _, key, pct in columns) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()

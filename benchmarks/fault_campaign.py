"""The reliability campaign in one command: kill -9 at random moments, then every fault test.

    python benchmarks/fault_campaign.py --kills 12

1. Trains the tiny in-code model for ``--epochs`` epochs uninterrupted (the reference), then
   ``--kills`` times: the same fit killed with SIGKILL in a random epoch ≥ 1 at a random phase
   (rollout, scoring, update, right after an optimizer step, half-way through writing
   ``last.ckpt``) and a random delay into it, then ``fit --ckpt_path=last.ckpt``
   (:mod:`paw_lightning.testing.kill`). For each phase it prints how often the kill landed,
   how many runs resumed and finished in the same MLflow run, the epochs lost and whether every
   logged metric (but time and memory) equals the reference's.
2. Runs the fault tests (``--no-tests`` skips them): environment faults through the pool and
   ALFWorld, NaN steps, full or read-only disks, the tracking server going away, a killed or
   hung rank of a 2-process run, and the CLI fuzz of bad invocations.

One heavy process at a time runs (1 torch thread each); about 20 s per kill on an idle 2-core CPU.
"""
from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from machine import machine_load

from paw_lightning.testing import build_tiny_model_dir
from paw_lightning.testing.kill import PHASES, comparable_keys, differences, fit_command, kill_and_resume, run_metrics

ROOT = Path(__file__).resolve().parents[1]
FAULT_TESTS = ["tests/test_env_pool.py", "tests/test_alfworld.py", "tests/test_nonfinite.py", "tests/test_checkpoint_io.py", "tests/test_kill_resume.py",
               "tests/test_mlflow_outage.py", "tests/test_killed_rank.py", "tests/test_cli_fuzz.py", "tests/test_cli_errors.py"]


def fit_args(model_dir: Path, workdir: Path, epochs: int) -> list[str]:
    return ["-c", str(ROOT / "configs/frozenlake.yaml"), "-c", str(ROOT / "tests/configs/tiny.yaml"), f"--model.lm.name_or_path={model_dir}",
            f"--trainer.logger.init_args.tracking_uri=sqlite:///{workdir / 'mlflow.db'}", f"--trainer.default_root_dir={workdir / 'runs'}",
            f"--trainer.max_epochs={epochs}"]


def kill_campaign(kills: int, epochs: int, seed: int, root: Path) -> bool:
    model_dir = build_tiny_model_dir(root / "tiny")
    reference_dir = root / "reference"
    reference_dir.mkdir()
    subprocess.run(fit_command(fit_args(model_dir, reference_dir, epochs)), cwd=reference_dir, check=True, capture_output=True)
    _, reference = run_metrics(f"sqlite:///{reference_dir / 'mlflow.db'}", "frozenlake")
    keys = comparable_keys(reference)
    rng = random.Random(seed)
    rows: dict[str, list] = defaultdict(list)
    for k in range(kills):
        phase, epoch, delay = rng.choice(PHASES), rng.randint(1, epochs - 1), round(rng.uniform(0.0, 0.5), 2)
        workdir = root / f"kill{k}"
        workdir.mkdir()
        result = kill_and_resume(fit_args(model_dir, workdir, epochs), workdir, f"sqlite:///{workdir / 'mlflow.db'}", "frozenlake", phase, epoch, delay)
        equal = result.resumed and not differences(reference, result.metrics, keys)
        rows[phase].append((result, equal))
        print(f"kill {k + 1}/{kills}: {phase} of epoch {epoch} after {delay} s: killed={result.killed} checkpoint epoch={result.checkpoint_epoch} "
              f"resumed={result.resumed} runs={result.runs} ({result.status}) metrics equal={equal} resume {result.resume_seconds:.0f} s"
              + (f"\n  {result.error[-500:]}" if result.error else ""), flush=True)
    print(f"\n{kills} kills of `fit` ({epochs} epochs of the tiny model), seed {seed}; {len(keys)} metrics compared with an uninterrupted run")
    print("| killed during | tried | killed | resumed, same MLflow run, FINISHED | epochs lost (max) | metrics equal |")
    print("|---|---|---|---|---|---|")
    ok = True
    for phase in PHASES:
        results = rows.get(phase, [])
        if not results:
            continue
        killed = sum(r.killed for r, _ in results)
        resumed = sum(r.resumed and r.runs == 1 and r.status == "FINISHED" for r, _ in results)
        lost = max((r.epochs_lost for r, _ in results if r.killed), default=0)
        equal = sum(e for _, e in results)
        ok &= killed == resumed == equal == len(results) and lost <= 1
        print(f"| {phase} | {len(results)} | {killed} | {resumed} | {lost} | {equal} |")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=12, help="random kill points (≥ 10 for the campaign)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-tests", action="store_true", help="only the kill campaign")
    args = parser.parse_args()
    start = time.time()
    print(f"machine: {machine_load()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="fault_campaign_") as tmp:
        ok = kill_campaign(args.kills, args.epochs, args.seed, Path(tmp))
    if not args.no_tests:
        tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FAULT_TESTS], cwd=ROOT)
        ok &= tests.returncode == 0
    print(f"campaign {'passed' if ok else 'FAILED'} in {(time.time() - start) / 60:.1f} min ({machine_load()})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

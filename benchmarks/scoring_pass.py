"""The scoring pass (π_old, π_ref, action entropies) on one real rollout, chunked three ways, side by side.

The config's module and data are built as ``fit`` builds them (``configured.build``), one
training rollout of its groups is collected with its engine (``configured.collect``) and
turned into the update's samples (``build_buffer``). ``update.score`` then runs on those
samples, each way in turn:

- ``neighbours``: ``--batch`` consecutive samples of the buffer per forward (the scoring pass
  before it grouped by length): the steps of one episode, of every length;
- ``by_length``: ``--batch`` samples per forward, sorted by length (``update.score_chunks``,
  the scoring pass now with ``model.score_batch_size`` > 1);
- ``one``: one sample per forward (``score_batch_size: 1``): no padding, the LM head from the
  sample's own prompt on.

The scoring pass runs where π_old is recomputed (``model.old_logprobs: recompute``, which the
CT2 engine needs; the default here, as the main job's recipe sets ``rollout``) or the KL term
needs π_ref (``kl_coef > 0``: give ``--model.policy_objective.init_args.kl_coef=0.01``).
After one untimed pass of each, the ways alternate ``--reps`` times (the order alternates
too). Printed: each way's median and per-rep seconds, the positions its forwards computed
(rows × the longest row, summed), the largest gap of its action log-probs from ``one``'s,
and the medians of the per-pair ratios.

    python benchmarks/scoring_pass.py --threads 2                 # the main job's rollout (configs/alfworld.yaml)
    python benchmarks/scoring_pass.py --config configs/frozenlake.yaml --threads 2   # with the KL term's π_ref forward
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import torch
from configured import add_run_arguments, build, collect
from machine import machine_load

import paw_lightning.update as update
from paw_lightning.rollout.samples import build_buffer

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("neighbours", "by_length", "one")
GROUPED = update.score_chunks


def neighbours(lengths: list[int], size: int) -> list[list[int]]:
    """``size`` consecutive samples per forward, in the buffer's order."""
    return [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]


def run(module, buffer, way: str, size: int) -> tuple[float, int]:
    """One scoring pass of ``buffer`` the ``way`` given (``size`` samples per forward but in
    ``one``): seconds and the positions its forwards computed."""
    update.score_chunks = neighbours if way == "neighbours" else GROUPED
    module.score_batch_size = 1 if way == "one" else size
    positions = []
    hook = module.lm.register_forward_pre_hook(lambda _, args, kwargs: positions.append(kwargs["input_ids"].numel()), with_kwargs=True)
    began = time.perf_counter()
    try:
        update.score(module.update_inputs(), buffer)
    finally:
        hook.remove()
        update.score_chunks = GROUPED
    return time.perf_counter() - began, sum(positions)


def action_gap(buffer, reference: list[torch.Tensor]) -> float:
    """The largest |log π_old − reference| over every action token."""
    gaps = [(old - ref)[mask[: len(old)]].abs().max() for old, ref, mask in zip(buffer.old_logprobs, reference, buffer.action_mask) if mask.any()]
    return float(max(gaps)) if gaps else 0.0


def main(argv: list[str] | None = None) -> tuple[dict[str, list[float]], dict[str, int], dict[str, float]]:
    """Runs the comparison; each way's seconds per rep, positions computed and gap from ``one``."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, ROOT / "configs" / "alfworld.yaml")
    p.add_argument("--batch", type=int, default=8, help="samples per forward of neighbours and by_length (default: 8, base.yaml's score_batch_size)")
    p.add_argument("--reps", type=int, default=3, help="timed alternations (default: 3)")
    args, args.extra = p.parse_known_args(argv)
    if not any(a.startswith("--model.old_logprobs") for a in args.extra):
        args.extra.append("--model.old_logprobs=recompute")
    with tempfile.TemporaryDirectory() as workdir:
        module, data, _ = build(args, Path(workdir))
        if module.old_logprobs == "rollout" and not module.policy_objective.needs_reference and module.critic is None:
            p.error("no scoring pass to time: π_old comes from the rollout and no π_ref or V(h_t) is needed")
        began = time.perf_counter()
        buffer = build_buffer(collect(module, data), module.tokenizer, data.rollout.max_obs_tokens, world_model=module.world_model_objective is not None)
        print(f"rollout: {len(buffer)} samples in {time.perf_counter() - began:.0f} s", file=sys.stderr, flush=True)
        size = args.batch
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        positions, logprobs = {}, {}
        for way in WAYS:  # untimed: first-call costs, and each way's log-probs
            took, _ = run(module, buffer, way, size)
            logprobs[way] = list(buffer.old_logprobs)
            print(f"untimed {way}: {took:.1f} s", file=sys.stderr, flush=True)
        for rep in range(args.reps):
            for way in WAYS if rep % 2 == 0 else WAYS[::-1]:
                took, positions[way] = run(module, buffer, way, size)
                seconds[way].append(took)
                print(f"rep {rep + 1}/{args.reps} {way}: {took:.1f} s", file=sys.stderr, flush=True)
        gaps = {}
        for way in WAYS:
            buffer.old_logprobs = logprobs[way]
            gaps[way] = action_gap(buffer, logprobs["one"])
    lengths = sorted(ids.numel() for ids in buffer.policy_view().input_ids)
    forwards = 2 if module.policy_objective.needs_reference else 1
    print(f"{args.config.name}: {len(lengths)} samples of {lengths[0]}-{lengths[-1]} tokens ({sum(lengths)} in all), {size} per batched forward, "
          f"{forwards} forward(s) per chunk; {module.lm.dtype}, {torch.get_num_threads()} threads, {machine_load()}")
    for way in WAYS:
        print(f"{way:>10}: {statistics.median(seconds[way]):7.2f} s (per rep {', '.join(f'{t:.2f}' for t in seconds[way])}), "
              f"{positions[way]} positions, max |Δ log π_old| vs one {gaps[way]:.2e}")
    for slow, fast in (("neighbours", "by_length"), ("one", "by_length"), ("neighbours", "one")):
        ratios = [a / b for a, b in zip(seconds[slow], seconds[fast])]
        print(f"{slow} / {fast}: {statistics.median(ratios):.3f}x (per pair {', '.join(f'{r:.3f}' for r in ratios)})")
    return seconds, positions, gaps


if __name__ == "__main__":
    main()

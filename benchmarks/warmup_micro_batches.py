"""The behaviour-cloning warm-up in the update's micro-batches vs whole padded batches, side by side.

The config's module and warm-up callback are built as ``fit`` builds them
(``configured.build``: model dtype, precision, ``model.micro_batch_tokens`` and ``_rows``). The
demonstrations are collected once; both ways then train on them from the same LoRA weights,
each with the callback's fresh AdamW:

- ``split``: each batch in the config's micro-batches (the CPU recipes: ``micro_batch_rows: 1``,
  one unpadded demonstration per forward/backward, the LM head from its own first response
  token on);
- ``whole``: both settings null, one right-padded forward/backward per batch (every warm-up
  ran this way before it followed the micro-batch settings).

The two ways alternate ``--reps`` times (which goes first alternates too). Printed: each
way's median and per-rep seconds, the positions its forwards computed (padding included), the
growth of peak RSS over the RSS before it (Linux's VmHWM; glibc's ``malloc_trim`` first hands
back what the previous run freed), and the median of the per-pair ratios whole / split.

    python benchmarks/warmup_micro_batches.py --threads 2 --epochs 1 --reps 3   # the main job's warm-up (configs/alfworld.yaml)
    python benchmarks/warmup_micro_batches.py --steps 8 --model.lm.dtype=float32   # other args go to the CLI
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "ERROR")
warnings.filterwarnings("ignore")

import torch
from configured import add_run_arguments, build
from machine import machine_load, peak_rss_bytes, release_freed_memory, reset_peak_rss, rss_bytes

from paw_lightning.callbacks import BehaviourCloningWarmup

ROOT = Path(__file__).resolve().parents[1]
WAYS = ("split", "whole")


def train(module, callback: BehaviourCloningWarmup, data, way: str, settings: tuple, start: dict) -> tuple[float, int, int]:
    """One warm-up the ``way`` given, from the ``start`` LoRA weights: seconds, positions its
    forwards computed, peak RSS growth in bytes."""
    module.micro_batch_tokens, module.micro_batch_rows = settings if way == "split" else (None, None)
    module.lm.load_state_dict(start, strict=False)
    positions = []
    hook = module.lm.register_forward_pre_hook(lambda _, args, kwargs: positions.append(kwargs["input_ids"].numel()), with_kwargs=True)
    release_freed_memory()
    reset_peak_rss()
    before = rss_bytes()
    began = time.perf_counter()
    try:
        callback.warm_up(module, data, module.forward_context)
    finally:
        hook.remove()
    return time.perf_counter() - began, sum(positions), max(peak_rss_bytes() - before, 0)


def main(argv: list[str] | None = None) -> tuple[dict[str, list[float]], dict[str, int], list[int]]:
    """Runs the comparison; each way's seconds per rep, the positions its forwards computed in
    one run, and the demonstration steps' lengths."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, ROOT / "configs" / "alfworld.yaml")
    p.add_argument("--epochs", type=int, help="warm-up epochs per run (default: the config's)")
    p.add_argument("--steps", type=int, help="train on the first N demonstration steps only (default: all)")
    p.add_argument("--reps", type=int, default=2, help="timed alternations (default: 2)")
    args, args.extra = p.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        module, data, trainer = build(args, Path(workdir))
        callbacks = [cb for cb in trainer.callbacks if isinstance(cb, BehaviourCloningWarmup)]
        if args.warmup:
            callbacks = [BehaviourCloningWarmup(demonstrations=args.warmup, epochs=2, batch_size=2)]
        if not callbacks:
            p.error(f"{args.config} has no warm-up (stages.warmup; give --warmup N): nothing to time")
        callback = callbacks[0]
        callback.progress = False
        callback.epochs = args.epochs or callback.epochs
        demos = callback.demonstrations_for_rank(module, data)[: args.steps]
        callback.demonstrations_for_rank = lambda *_: demos  # collected once: both ways train on the same steps
        settings = (module.micro_batch_tokens, module.micro_batch_rows)
        start = {name: value.detach().clone() for name, value in module.lm.state_dict().items() if "lora_" in name}
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        positions, growth = {}, {way: [] for way in WAYS}
        for rep in range(args.reps):
            for way in WAYS if rep % 2 == 0 else WAYS[::-1]:
                took, positions[way], grew = train(module, callback, data, way, settings, start)
                seconds[way].append(took)
                growth[way].append(grew)
    lengths = sorted(len(d.input_ids) for d in demos)
    print(f"{args.config.name}: {len(demos)} demonstration steps of {lengths[0]}-{lengths[-1]} tokens ({sum(lengths)} in all), "
          f"batch {callback.batch_size}, {callback.epochs} epoch(s); split = micro_batch_tokens {settings[0]}, micro_batch_rows {settings[1]}; "
          f"{module.lm.dtype}, {torch.get_num_threads()} threads, {machine_load()}")
    for way in WAYS:
        print(f"{way:>5}: {statistics.median(seconds[way]):7.1f} s (per rep {', '.join(f'{t:.1f}' for t in seconds[way])}), "
              f"{positions[way]} positions, peak RSS +{statistics.median(growth[way]) / 2**30:.2f} GiB")
    ratios = [w / s for w, s in zip(seconds["whole"], seconds["split"])]
    print(f"whole / split: {statistics.median(ratios):.3f}x (per pair {', '.join(f'{r:.3f}' for r in ratios)})")
    return seconds, positions, lengths


if __name__ == "__main__":
    main()

"""Rollout time with and without shared prompt prefixes (the engine's ``share_prefixes``), side by side.

The config's module, engine, warm-up and training rollout are ``fit``'s (:mod:`configured`):
for the main job, 1 task group of 4 episodes, 6 steps, the merged-copy engine, after the
behaviour-cloning warm-up. Rep k plays epoch k's rollout (its tasks and sampling seed) once
with each setting, alternating which goes first, so both settings see the same prompts and,
up to float rounding, sample the same responses. Printed per setting: the rollout's seconds
(median, per rep), the tokens the sampling model's forwards took (rows × width, padding
included, counted at its input embeddings) and the response tokens; then the median of the
per-rep ratios, and how many rollouts and steps sampled the same responses in both settings. ``tokens/s`` is response tokens over the whole rollout's
seconds (environment steps included). With the CTranslate2 engine (``--model.engine=...CT2Engine``)
the forwarded tokens are the prompt tokens handed to its generators (static prompts once).

    python benchmarks/prefix_sharing.py                                # configs/alfworld.yaml
    python benchmarks/prefix_sharing.py --group-size 8 --reps 2        # the paper's group size
    python benchmarks/prefix_sharing.py --config configs/frozenlake.yaml --warmup 8
    python benchmarks/prefix_sharing.py --model.engine=paw_lightning.rollout.ct2.CT2Engine
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

import configured
import torch
from machine import machine_load

from paw_lightning.rollout import ct2
from paw_lightning.rollout.engine import HFEngine

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"plain": False, "shared": True}


class TokenCounter:
    """Tokens the sampling model's forwards take (rows × width, padding included), or the
    prompt tokens handed to CTranslate2 generators (:class:`CountedGenerator`)."""

    def __init__(self):
        self.tokens = 0

    def __call__(self, module, args, output) -> None:
        self.tokens += args[0].numel()

    def count_ct2_prompts(self, engine) -> None:
        """The samplers ``engine`` makes from now on count their generators' prompt tokens."""
        make_sampler = engine.sampler

        def counted_sampler(*args, **kwargs):
            sampler = make_sampler(*args, **kwargs)
            load = sampler.load

            def counted_load(seed: int) -> None:
                load(seed)
                sampler.generators = [CountedGenerator(generator, self) for generator in sampler.generators]

            sampler.load = counted_load
            return sampler

        engine.sampler = counted_sampler


class CountedGenerator:
    def __init__(self, generator, counter: TokenCounter):
        self.generator, self.counter = generator, counter

    def generate_batch(self, start_tokens, **kwargs):
        self.counter.tokens += len(kwargs.get("static_prompt") or []) + sum(map(len, start_tokens))
        return self.generator.generate_batch(start_tokens, **kwargs)


def rollout(module, data, epoch: int, counter: TokenCounter) -> tuple[float, int, list[list[int]]]:
    """One training rollout: seconds, forwarded tokens, every step's response token ids."""
    counter.tokens = 0
    start = time.perf_counter()
    trajectories = configured.collect(module, data, epoch)
    seconds = time.perf_counter() - start
    return seconds, counter.tokens, [step.response_ids for t in trajectories for step in t.steps]


def main(argv: list[str] | None = None) -> dict[str, list]:
    """Runs the comparison and prints it; returns each setting's runs (seconds, forwarded
    tokens, response token ids)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                     epilog="Any other argument (e.g. --model.lm.dtype=float32) is passed on to the CLI.")
    configured.add_run_arguments(parser, ROOT / "configs/alfworld.yaml")
    parser.add_argument("--reps", type=int, default=3, help="rollouts per setting, alternated (default: 3)")
    args, args.extra = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="prefix_sharing-") as tmp:
        module, data, trainer = configured.build(args, Path(tmp))
        engine = module.engine
        if not isinstance(engine, (HFEngine, ct2.CT2Engine)):
            parser.error(f"{args.config.name} samples with {type(engine).__name__}: prefix sharing is the hf and ct2 engines'")
        configured.warm_up(module, data, trainer, args.warmup)
        counter = TokenCounter()
        rollout(module, data, args.reps, counter)  # untimed: first-call allocations, the engine's copy's making
        if isinstance(engine, HFEngine):
            (engine.merged if engine.merge_lora else module.lm).get_input_embeddings().register_forward_hook(counter)
            described = f"HFEngine(merge_lora={engine.merge_lora})"
        else:
            counter.count_ct2_prompts(engine)
            described = f"CT2Engine({engine.compute_type}, workers={engine.workers}; forwarded: prompt tokens)"
        r = data.rollout
        print(f"{args.config.name}: {r.groups} group(s) × {r.group_size} episodes, ≤ {r.max_steps} steps, budget {r.max_new_tokens}, "
              f"engine {described}, precision {trainer.precision}, "
              f"{torch.get_num_threads()} threads, {machine_load()}", flush=True)
        results = {name: [] for name in SETTINGS}
        for rep in range(args.reps):
            order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                engine.share_prefixes = SETTINGS[name]
                results[name].append(rollout(module, data, rep, counter))
            plain, shared = results["plain"][-1], results["shared"][-1]
            print(f"rep {rep + 1}: plain {plain[0]:.1f} s, shared {shared[0]:.1f} s ({machine_load()})", flush=True)
    print(f"\n{'setting':<8}{'median s':>10}{'runs (s)':>24}{'forwarded':>16}{'responses':>11}{'tokens/s':>10}")
    for name, runs in results.items():
        seconds = [run[0] for run in runs]
        responses = [sum(map(len, run[2])) for run in runs]
        print(f"{name:<8}{statistics.median(seconds):>10.1f}{', '.join(f'{s:.1f}' for s in seconds):>24}{statistics.median(run[1] for run in runs):>16.0f}"
              f"{statistics.median(responses):>11.0f}{sum(responses) / sum(seconds):>10.1f}")
    ratios = [p[0] / s[0] for p, s in zip(results["plain"], results["shared"])]
    saved = [1 - s[1] / p[1] for p, s in zip(results["plain"], results["shared"])]
    print(f"\nshared vs plain: rollout {statistics.median(ratios):.3f}x faster (per rep: {', '.join(f'{r:.3f}' for r in ratios)}), "
          f"forwarded tokens {100 * statistics.median(saved):.0f}% fewer")
    same = sum(p[2] == s[2] for p, s in zip(results["plain"], results["shared"]))
    steps = sum(a == b for p, s in zip(results["plain"], results["shared"]) for a, b in zip(p[2], s[2]))
    total = sum(len(p[2]) for p in results["plain"])
    print(f"the same responses in {same} of {len(ratios)} rollouts ({steps} of {total} steps; float rounding can flip a sampled token)")
    return results


if __name__ == "__main__":
    main()

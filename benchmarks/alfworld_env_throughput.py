"""ALFWorld environment speed: steps/s per worker, and the environments' share of rollout time.

Part 1, **environment steps per second**: an ``EnvPool`` of ``--pool-size`` generated
ALFWorld games (train split) plays seeded random admissible commands for ``--steps``
batched steps, in-process (``num_workers=0``) and with 1 and 2 worker processes, side by
side. Episodes that win are reset to the next game; resets are timed with the steps
(they are part of any rollout). Reported: steps/s of the pool and per worker.

Part 2, **share of rollout time in environments** (``--rollout``): the real rollout loop
(``Collector`` with the policy loaded as training loads it: base LM plus fresh LoRA) plays
``--groups × --group-size`` episodes of ``--max-steps`` steps; the pool's ``reset_many``
/ ``step_many`` and the engine's ``generate`` are timed. Reported: seconds in each and the
environments' share of the rollout.

    python benchmarks/alfworld_env_throughput.py                    # part 1 only
    python benchmarks/alfworld_env_throughput.py --rollout          # + part 2, embedded model

Games are generated on first use and cached (``python -m paw_lightning.envs.alfworld.generate``).
"""
from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from machine import machine_load

from paw_lightning.envs import EnvPool, make_env_factory


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pool-size", type=int, default=8, help="environments stepped per batch (default: 8)")
    p.add_argument("--steps", type=int, default=40, help="batched steps per setting (default: 40)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="worker counts compared (default: 0 1 2)")
    p.add_argument("--games", type=int, default=16, help="generated train games cycled through (default: 16)")
    p.add_argument("--rollout", action="store_true", help="also time a real rollout with the model")
    p.add_argument("--model", default="embedded", help="model for --rollout (default: embedded)")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-env-workers", type=int, default=0, help="pool workers in the --rollout part")
    return p.parse_args()


def env_steps_per_second(factory, pool_size: int, steps: int, num_workers: int, games: int) -> float:
    """Batched random-command steps per second of a pool (resets of won episodes included)."""
    rng = random.Random(0)
    pool = EnvPool(factory, pool_size, num_workers=num_workers)
    try:
        next_game = pool_size
        infos = [info for _, info in pool.reset_many([(i, i % games, 0) for i in range(pool_size)])]  # warm-up: builds envs
        start = time.perf_counter()
        for _ in range(steps):
            results = pool.step_many([(i, rng.choice(info["admissible_actions"])) for i, info in enumerate(infos)])
            done = [i for i, (_, _, d, _) in enumerate(results) if d]
            infos = [r[3] for r in results]
            for i, (_, info) in zip(done, pool.reset_many([(i, (next_game + k) % games, 0) for k, i in enumerate(done)])):
                infos[i] = info
            next_game += len(done)
        return steps * pool_size / (time.perf_counter() - start)
    finally:
        pool.close()


def rollout_env_share(args: argparse.Namespace, factory) -> None:
    from paw_lightning.model import LMConfig, load_model, load_tokenizer
    from paw_lightning.rollout.collector import Collector
    from paw_lightning.rollout.engine import GenerationEngine
    from paw_lightning.rollout.prompts import PromptBuilder

    lm = LMConfig(name_or_path=args.model)
    tokenizer = load_tokenizer(lm)
    model = load_model(lm).eval()
    size = args.groups * args.group_size
    pool = EnvPool(factory, size, num_workers=args.num_env_workers)
    engine = GenerationEngine(model, tokenizer, args.max_new_tokens)
    timers = {"environment": 0.0, "generation": 0.0}

    def timed(name, fn):
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                timers[name] += time.perf_counter() - start
        return wrapper

    pool.reset_many, pool.step_many = timed("environment", pool.reset_many), timed("environment", pool.step_many)
    engine.generate = timed("generation", engine.generate)
    collector = Collector(pool, engine, PromptBuilder("alfworld", 2), args.max_steps, -0.1)
    start = time.perf_counter()
    trajs = collector.collect([(g, g) for g in range(args.groups)], args.group_size, 1.0, seed=0, progress=False)
    total = time.perf_counter() - start
    pool.close()
    steps = sum(len(t.steps) for t in trajs)
    print(f"\nrollout: {len(trajs)} episodes, {steps} steps, {total:.1f} s ({machine_load()})")
    for name, seconds in timers.items():
        print(f"  {name:12s} {seconds:7.1f} s  {seconds / total:6.1%} of the rollout")
    print(f"  other        {total - sum(timers.values()):7.1f} s  (prompt building, parsing)")


def main() -> None:
    args = parse_args()
    factory = make_env_factory("alfworld", split="train", max_generated=args.games)
    print(f"preparing {args.games} generated train games ...")
    factory().prepare(progress=False)
    print(f"ALFWorld env steps/s: pool of {args.pool_size}, {args.steps} batched random-command steps ({machine_load()})")
    print(f"{'workers':>8} {'steps/s':>9} {'per worker':>11} {'vs in-process':>14}")
    base = None
    for workers in args.workers:
        rate = env_steps_per_second(factory, args.pool_size, args.steps, workers, args.games)
        base = base or rate
        print(f"{workers:>8} {rate:9.1f} {rate / max(workers, 1):11.1f} {rate / base:13.2f}x")
    if args.rollout:
        rollout_env_share(args, factory)


if __name__ == "__main__":
    main()

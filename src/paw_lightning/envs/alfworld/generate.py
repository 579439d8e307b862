"""Pre-generate procedural ALFWorld games into the cache (see ``generator``'s docstring).

    python -m paw_lightning.envs.alfworld.generate --split train --num-games 1000
    python -m paw_lightning.envs.alfworld.generate --split all --num-games 200 --workers 2

Games already in the cache are skipped, so the command is resumable; game ``i`` of a split
is the same whichever command, process or worker made it. ``AlfWorldEnv`` with the same
seed / task types / mix / held-out floor plans (and ``max_generated`` ≤ N) then finds them.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from paw_lightning.envs.alfworld.generator import SPLITS, TASK_TYPES, GameStore, GeneratorConfig
from paw_lightning.envs.alfworld.layouts import DEFAULT_OOD_FLOOR_PLANS


def parse_mix(text: str | None, task_types: list[str]) -> tuple[tuple[str, float], ...]:
    """``"pick_and_place_simple=2,look_at_obj_in_light=1"`` -> weights (unlisted types of ``task_types``: 1)."""
    mix = {t: 1.0 for t in task_types}
    for item in filter(None, (text or "").split(",")):
        name, _, weight = item.partition("=")
        if name.strip() not in task_types:
            raise SystemExit(f"--task-mix: {name.strip()!r} is not one of the task types {task_types}")
        mix[name.strip()] = float(weight)
    return tuple(sorted(mix.items()))


def _worker(args: tuple) -> None:
    config, cache_dir, split, index = args
    GameStore(config, cache_dir).entry(split, index)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--split", default="train", choices=[*SPLITS, "all"])
    parser.add_argument("--num-games", type=int, required=True, help="games per split")
    parser.add_argument("--start", type=int, default=0, help="first game index")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (AlfWorldEnv's generator_seed)")
    parser.add_argument("--task-types", nargs="+", default=list(TASK_TYPES), choices=TASK_TYPES)
    parser.add_argument("--task-mix", default=None, help="weights, e.g. 'pick_two_obj_and_place=2' (default uniform)")
    parser.add_argument("--ood-floor-plans", type=int, nargs="+", default=list(DEFAULT_OOD_FLOOR_PLANS))
    parser.add_argument("--cache-dir", default=None, help="default: $PAW_LIGHTNING_CACHE/alfworld")
    parser.add_argument("--workers", type=int, default=1, help="parallel generator processes")
    args = parser.parse_args(argv)

    config = GeneratorConfig(args.seed, parse_mix(args.task_mix, args.task_types), tuple(args.ood_floor_plans))
    store = GameStore(config, args.cache_dir)
    splits = list(SPLITS) if args.split == "all" else [args.split]
    for split in splits:
        started = time.perf_counter()
        if args.workers <= 1:
            store.ensure(split, args.num_games, start=args.start)
        else:
            from tqdm.auto import tqdm

            jobs = [(config, args.cache_dir, split, i) for i in range(args.start, args.start + args.num_games)]
            with mp.get_context("spawn").Pool(args.workers) as pool:
                results = pool.imap_unordered(_worker, jobs)
                for _ in tqdm(results, total=len(jobs), desc=f"alfworld {split}", unit="game"):
                    pass
        seconds = time.perf_counter() - started
        print(f"{split}: {args.num_games} games ready in {store.data_root}/{SPLITS[split]} "
              f"({seconds:.1f} s, {seconds / max(args.num_games, 1):.2f} s/game incl. cached)")


if __name__ == "__main__":
    main()

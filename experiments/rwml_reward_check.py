"""Can RWML's embedding reward tell an environment's states apart?

RWML pays a predicted next observation ŝ when 1 − cos(E(ŝ), E(o_{t+1})) < τ_d (METHODS.md §4).
That is only a world-model reward if a wrong prediction lands farther away than τ_d. This plays
random admissible actions in each environment, keeps the transitions whose observation changed,
and reports how often the wrong prediction "nothing changes" (ŝ = o_t) would still be paid::

    python experiments/rwml_reward_check.py                        # the five default environments
    python experiments/rwml_reward_check.py --envs alfworld --tasks 12 --embedder /path/to/encoder

Near 1, the reward rate measures the format, not the world model; every RWML fit logs the same
figure for its own triplets as ``rwml/wrong_copy_reward_rate``.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import torch

from paw_lightning.embedding import SentenceEmbedder
from paw_lightning.envs import make_env_factory
from paw_lightning.objectives.rwml import wrong_copy_reward_rate
from paw_lightning.rollout.triplets import random_triplets

ENVS = ['frozenlake {"size": 4}', 'frozenlake {"size": 3, "observation": "coordinates", "layout": "corners"}', "sokoban", "sudoku", "alfworld"]


def check(env_spec: str, embed: SentenceEmbedder, tasks: int, steps: int, taus: list[float]) -> str:
    """One table row: the share of changed transitions whose wrong copy is paid, per τ_d."""
    name, _, kwargs = env_spec.partition(" ")
    start = time.perf_counter()
    env, rng = make_env_factory(name, **json.loads(kwargs or "{}"))(), random.Random(0)
    triplets = [t for seed in range(tasks) for t in random_triplets(env, seed, rng, steps, 0)]
    changed = torch.tensor([t.observation.split() != t.next_observation.split() for t in triplets], dtype=torch.bool)
    current, true = embed([t.observation for t in triplets]), embed([t.next_observation for t in triplets])
    rates = [wrong_copy_reward_rate(current, true, changed, tau) for tau in taus]
    distance = (1 - (current[changed] * true[changed]).sum(-1)).median().item() if changed.any() else float("nan")
    paid = " | ".join("–" if r is None else f"{r:.0%}" for r in rates)
    return f"| {env_spec} | {len(triplets)} / {int(changed.sum())} | {distance:.3f} | {paid} | {time.perf_counter() - start:.0f} |"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=ENVS, help="environment names, each optionally followed by its JSON kwargs in the same argument")
    parser.add_argument("--tasks", type=int, default=12, help="random episodes per environment")
    parser.add_argument("--steps", type=int, default=8, help="steps per episode")
    parser.add_argument("--taus", nargs="+", type=float, default=[0.05, 0.1, 0.2], help="τ_d values (paper: 0.1 data stage, 0.2 training)")
    parser.add_argument("--embedder", default="embedded", help="embedded (all-MiniLM-L6-v2) or an encoder's directory / hub id")
    args = parser.parse_args(argv)
    embed = SentenceEmbedder(args.embedder)
    print("| environment | transitions / changed | median 1 − cos of a wrong copy | " + " | ".join(f"paid at τ_d {tau}" for tau in args.taus) + " | s |")
    print("|---|---|---|" + "---|" * len(args.taus) + "---|")
    for env_spec in args.envs:
        print(check(env_spec, embed, args.tasks, args.steps, args.taus), flush=True)


if __name__ == "__main__":
    main()

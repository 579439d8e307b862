"""Scripted reference policies on the learning benchmark's FrozenLake maps: how often each wins,
exactly, on the held-out maps the benchmark validates on and on fresh maps of the same kind.

    python experiments/reference_policies.py            # the benchmark: configs/frozenlake.yaml + configs/learning/frozenlake.yaml
    python experiments/reference_policies.py -c configs/frozenlake.yaml --maps 2000

The setting (``data.env_kwargs``, ``data.evaluation``, ``data.rollout.max_steps``) is read from
``fit -c … --print_config``, so the maps are the ones a run with those files plays: held-out
task g is ``reset(derive_seed("val", g))``, as in ``RolloutDataModule.play_eval``.

Policies (each ignores the text it is shown, except the last):

- ``uniform``: each of Up, Down, Left, Right with probability 1/4;
- ``down_or_right``: Down or Right, 1/2 each (never looks at the holes);
- ``shortest_path``: the first move of a shortest hole-free path (``FrozenLakeEnv.solve``).

A policy's win probability on a map is exact, not sampled: with V_0 = 0 and
V_k(p) = Σ_m π(m | p) · (r(p, m) + [not done(p, m)] · V_{k−1}(p')), the answer is
V_{max_steps}(start). The transitions (p, m) → (p', r, done) come from the environment itself
(``load_map`` with the player at p, then ``step(m)``). Non-slippery maps only.
:func:`yardstick` gives the means for the maps a run's evaluation plan names (the learning
report's line and the dashed line of its plot).
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.envs.grid import ACTIONS, Pos
from paw_lightning.rollout.collector import derive_seed

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ["configs/frozenlake.yaml", "configs/learning/frozenlake.yaml"]
Policy = Callable[[FrozenLakeEnv, Pos], dict[str, float]]  # (env on the map, player cell) → move → probability


def uniform(env: FrozenLakeEnv, pos: Pos) -> dict[str, float]:
    return {move: 1 / len(ACTIONS) for move in ACTIONS}


def down_or_right(env: FrozenLakeEnv, pos: Pos) -> dict[str, float]:
    return {"Down": 0.5, "Right": 0.5}


def shortest_path(env: FrozenLakeEnv, pos: Pos) -> dict[str, float]:
    return {env.solve()[0]: 1.0}


POLICIES: dict[str, Policy] = {"uniform": uniform, "down_or_right": down_or_right, "shortest_path": shortest_path}


def grid_rows(size: int, player: Pos, goal: Pos, holes: frozenset[Pos]) -> list[str]:
    """The map in ``load_map``'s letters (``P _ O G``)."""
    return ["".join("P" if (r, c) == player else "G" if (r, c) == goal else "O" if (r, c) in holes else "_" for c in range(size))
            for r in range(size)]


def win_probability(env: FrozenLakeEnv, rows: list[str], max_steps: int, policy: Policy) -> float:
    """Exact probability that ``policy`` wins the map ``rows`` (``P _ O G``) within ``max_steps``
    moves (the module docstring's V_k)."""
    env.load_map(rows)
    _, start, goal, holes = env.parse_state(env.render())
    size, step = len(rows), {}  # (cell, move) → (next cell, reward, done)
    cells, frontier = [start], [start]  # the cells the player can stand on, reached from the start
    while frontier:
        cell = frontier.pop()
        for move in ACTIONS:
            env.load_map(grid_rows(size, cell, goal, holes))
            observation, reward, done, _ = env.step(move)
            nxt = step[cell, move] = (env.parse_state(observation)[1], reward, done)
            if not done and nxt[0] not in cells:
                cells.append(nxt[0])
                frontier.append(nxt[0])
    moves = {}  # cell → the policy's move probabilities
    for cell in cells:
        env.load_map(grid_rows(size, cell, goal, holes))
        moves[cell] = policy(env, cell)
    value = dict.fromkeys(cells, 0.0)
    for _ in range(max_steps):
        value = {cell: sum(p * (step[cell, m][1] + (0.0 if step[cell, m][2] else value[step[cell, m][0]]))
                           for m, p in moves[cell].items())
                 for cell in cells}
    return value[start]


def seeded_map(env: FrozenLakeEnv, seed: int) -> list[str]:
    """The map ``reset(seed)`` plays, in ``load_map``'s letters."""
    observation, _ = env.reset(seed)
    _, player, goal, holes = env.parse_state(observation)
    return grid_rows(env.size, player, goal, holes)


def win_rates(env_kwargs: dict, task_seeds: list[int], max_steps: int) -> dict[str, list[float]]:
    """Each policy's win probability within ``max_steps`` moves on each map that ``reset(seed)``
    plays for ``task_seeds``."""
    env = FrozenLakeEnv(**env_kwargs)
    maps = [seeded_map(env, seed) for seed in task_seeds]
    return {name: [win_probability(env, rows, max_steps, policy) for rows in maps] for name, policy in POLICIES.items()}


def yardstick(plan: dict) -> dict[str, float] | None:
    """Each policy's mean win probability on the held-out maps of an evaluation plan (the
    ``eval`` part of a run's ``eval/val_*.json``: ``env``, ``env_kwargs``, ``task_seeds``,
    ``max_steps``); ``None`` unless it is non-slippery FrozenLake."""
    if plan.get("env") != "frozenlake" or (plan.get("env_kwargs") or {}).get("slippery"):
        return None
    return {name: statistics.mean(values) for name, values in win_rates(plan["env_kwargs"], plan["task_seeds"], plan["max_steps"]).items()}


def resolved_setting(configs: list[str]) -> dict:
    """``data`` of ``fit -c <configs> --print_config``."""
    cmd = [sys.executable, "-m", "paw_lightning", "fit", *(a for c in configs for a in ("-c", c)), "--print_config"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"could not resolve {' '.join(configs)}:\n{result.stderr[-2000:]}")
    return yaml.safe_load(result.stdout)["data"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", action="append", help=f"config files, in order (default: {' '.join(BENCHMARK)})")
    parser.add_argument("--maps", type=int, default=4000, help="fresh maps (seeds derive_seed('reference', i)) for the distribution's figure")
    args = parser.parse_args(argv)
    data = resolved_setting(args.config or BENCHMARK)
    kwargs = {**(data["env_kwargs"] or {}), **(data["evaluation"]["env_kwargs"] or {})}
    if data["env"] != "frozenlake" or kwargs.get("slippery"):
        sys.exit(f"reference policies are computed for non-slippery FrozenLake only, got env {data['env']!r} with {kwargs}")
    max_steps, held_out = data["rollout"]["max_steps"], data["evaluation"]["groups"]
    sets = {f"{held_out} held-out maps": win_rates(kwargs, [derive_seed("val", g) for g in range(held_out)], max_steps),
            f"{args.maps} fresh maps": win_rates(kwargs, [derive_seed("reference", i) for i in range(args.maps)], max_steps)}
    print(f"FrozenLake {kwargs}, at most {max_steps} moves; win probability in %, exact per map, mean over maps "
          f"(± the standard error over maps)\n")
    print("| policy | " + " | ".join(sets) + " |\n|---" + "|---" * len(sets) + "|")
    for name in POLICIES:
        cells = [f"{100 * statistics.mean(rates[name]):.1f} ± {100 * statistics.stdev(rates[name]) / len(rates[name]) ** 0.5:.1f}" for rates in sets.values()]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)

if __name__ == "__main__":
    main()

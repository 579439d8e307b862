"""Scripted FrozenLake policies' exact win probabilities (experiments/reference_policies.py)
against hand-computed numbers, and the command on the learning benchmark's maps."""
from __future__ import annotations

import subprocess
import sys

import pytest

from paw_lightning.envs.frozenlake import FrozenLakeEnv

from helpers import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import reference_policies as ref  # noqa: E402

OPEN = ["P_", "_G"]  # start (0, 0), goal (1, 1), no hole


@pytest.fixture
def env():
    return FrozenLakeEnv(size=2)


@pytest.mark.parametrize("max_steps, expected", [(1, 0.0), (2, 0.5), (3, 0.75), (4, 0.875)])
def test_down_or_right_on_an_open_map(env, max_steps, expected):
    # the first move leaves the start either way; then each move is the winning one with
    # probability 1/2 (the other bumps into the border): P(win within k) = 1 − 2^−(k−1)
    assert ref.win_probability(env, OPEN, max_steps, ref.down_or_right) == pytest.approx(expected)


def test_uniform_on_an_open_map(env):
    # within 2 moves: Down or Right (1/2), then the one move onto the goal (1/4)
    assert ref.win_probability(env, OPEN, 2, ref.uniform) == pytest.approx(1 / 8)
    # within 3: stay on the start first (Up/Left, 1/2), then 1/8 as above; or step onto a side
    # cell (1/2), from where 2 moves win with 1/4 (onto the goal at once) + 1/2 · 1/4 (two border
    # bumps keep it there, then the goal); back to the start loses the race: 1/2 · 1/8 + 1/2 · 3/8
    assert ref.win_probability(env, OPEN, 3, ref.uniform) == pytest.approx(1 / 4)


def test_a_hole_on_the_way(env):
    # Right falls into the hole (1/2); Down (1/2), then Right wins (1/2) or Down bumps and a
    # third move wins (1/2 · 1/2): 1/2 · (1/2 + 1/4)
    assert ref.win_probability(env, ["PO", "_G"], 3, ref.down_or_right) == pytest.approx(3 / 8)


def test_the_shortest_path_wins_when_the_budget_allows_it():
    env = FrozenLakeEnv(size=3)
    island = ["P__", "O__", "_OG"]  # (2, 0) is walled in by holes: no path from it, and none to it
    assert ref.win_probability(env, island, 4, ref.shortest_path) == 1.0
    assert ref.win_probability(env, island, 3, ref.shortest_path) == 0.0  # the path takes 4 moves


def test_a_seeded_map_is_the_map_reset_plays():
    env = FrozenLakeEnv(size=3, hole_prob=0.2, layout="corners", observation="coordinates")
    rows = ref.seeded_map(env, 7)
    assert env.load_map(rows)[0] == env.reset(7)[0]


@pytest.mark.slow
def test_the_command_on_the_benchmarks_maps():
    result = subprocess.run([sys.executable, str(ROOT / "experiments/reference_policies.py"), "--maps", "50"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| policy | 32 held-out maps | 50 fresh maps |" in result.stdout
    assert "| down_or_right | 54.5 ± 5.1 |" in result.stdout  # the figure docs/results/learning.md quotes
    assert "| shortest_path | 100.0 ± 0.0 | 100.0 ± 0.0 |" in result.stdout


@pytest.mark.slow
def test_another_environment_is_refused():
    result = subprocess.run([sys.executable, str(ROOT / "experiments/reference_policies.py"), "-c", "configs/search_qa.yaml"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 1 and "non-slippery FrozenLake only, got env 'search_qa'" in result.stderr

"""Sudoku 4×4 as a text game (SPA, METHODS.md §5): digits 1–4, 2×2 boxes, ``blanks`` empty cells.

Rules (the ones the tests check): the action ``place D at (R,C)`` (case and spaces free) writes
digit D in the empty cell at zero-indexed row R, column C. The admissible actions are the
placements that break no rule: an empty cell and a digit not yet in its row, column or box. A
placement that breaks one, names a filled or outside cell, or is not a placement at all leaves
the grid unchanged (reward 0; ``action_recognised`` False only for text that is no placement).
Filled cells stay (no erasing). The episode is won when the grid is full (reward 1.0, done); it
is lost (reward 0, done) when an empty cell has no admissible digit left. Puzzles: a random
valid grid with ``blanks`` cells removed, kept only when the solution is unique.
"""
from __future__ import annotations

import random
import re
from itertools import product

from paw_lightning.envs.base import EnvError, Outcome
from paw_lightning.ranges import OneToTen, PositiveInt
from paw_lightning.envs.grid import COORDINATES_RULE, Pos, describe, format_pos, read_observation, render_grid

DIGITS = (1, 2, 3, 4)
_PLACE = re.compile(r"^\s*place\s+([0-9])\s+at\s+\(\s*([0-9])\s*,\s*([0-9])\s*\)\s*$", re.IGNORECASE)
BASE = ((1, 2, 3, 4), (3, 4, 1, 2), (2, 1, 4, 3), (4, 3, 2, 1))  # a valid 4×4 grid

Grid = tuple[tuple[int, ...], ...]  # 0 = empty


def parse_placement(action: str) -> tuple[int, Pos] | None:
    """``(digit, (row, col))`` of ``place D at (R,C)``, or ``None`` for any other text."""
    match = _PLACE.match(action)
    return (int(match[1]), (int(match[2]), int(match[3]))) if match else None


def conflicts(grid: Grid, digit: int, pos: Pos) -> bool:
    """Whether ``digit`` is already in the row, column or 2×2 box of ``pos``."""
    r, c = pos
    box = [grid[br][bc] for br in range(r - r % 2, r - r % 2 + 2) for bc in range(c - c % 2, c - c % 2 + 2)]
    return digit in grid[r] or digit in (row[c] for row in grid) or digit in box


def legal_placements(grid: Grid) -> list[tuple[int, Pos]]:
    """Every (digit, empty cell) that breaks no rule, in row-major then digit order."""
    return [(d, (r, c)) for r, c in product(range(4), range(4)) if grid[r][c] == 0 for d in DIGITS if not conflicts(grid, d, (r, c))]


def place(grid: Grid, digit: int, pos: Pos) -> Grid:
    return tuple(tuple(digit if (r, c) == pos else v for c, v in enumerate(row)) for r, row in enumerate(grid))


def solutions(grid: Grid, limit: int = 2) -> list[Grid]:
    """Up to ``limit`` completions of ``grid`` (depth-first, first empty cell first)."""
    empty = next(((r, c) for r, c in product(range(4), range(4)) if grid[r][c] == 0), None)
    if empty is None:
        return [grid]
    found: list[Grid] = []
    for digit in DIGITS:
        if not conflicts(grid, digit, empty):
            found += solutions(place(grid, digit, empty), limit - len(found))
            if len(found) >= limit:
                break
    return found


def random_solution(rng: random.Random) -> Grid:
    """A valid full grid: the base grid with digits relabelled, rows swapped within and across
    bands, columns likewise, and maybe transposed (every transformation keeps the rules)."""
    labels = dict(zip(DIGITS, rng.sample(DIGITS, 4)))
    bands = rng.sample([0, 1], 2)
    rows = [2 * b + i for b in bands for i in rng.sample([0, 1], 2)]
    stacks = rng.sample([0, 1], 2)
    cols = [2 * s + i for s in stacks for i in rng.sample([0, 1], 2)]
    grid = tuple(tuple(labels[BASE[r][c]] for c in cols) for r in rows)
    return tuple(zip(*grid)) if rng.random() < 0.5 else grid


class SudokuEnv:
    """Sudoku 4×4 on a seeded puzzle with a unique solution (rules in the module docstring)."""

    max_return = 1.0  # R_max of METHODS.md §3c: the return of a won episode

    def __init__(self, blanks: OneToTen = 6, coordinates: bool = True, max_generation_tries: PositiveInt = 200):
        if not 1 <= blanks <= 10:
            raise ValueError(f"Sudoku blanks must be in 1..10 (more rarely leave a unique solution), got {blanks}")
        self.blanks, self.coordinates, self.max_generation_tries = blanks, coordinates, max_generation_tries
        self._grid: Grid | None = None
        self._done = False

    @property
    def task(self) -> str:
        return (
            "Fill the 4x4 Sudoku grid: every row, every column and every 2x2 box must hold the digits 1-4 once."
            " Empty cells are _. Action: place D at (R,C), a digit D into the empty cell at row R, column C;"
            f" filled cells cannot change. {COORDINATES_RULE}"
        )

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        rng = random.Random(seed)
        for _ in range(self.max_generation_tries):
            solution = random_solution(rng)
            puzzle = solution
            for pos in rng.sample(list(product(range(4), range(4))), self.blanks):
                puzzle = place(puzzle, 0, pos)
            if len(solutions(puzzle)) == 1:
                return self.load_puzzle(puzzle)
        raise EnvError(f"no Sudoku puzzle with a unique solution and {self.blanks} blanks for seed {seed}")

    def load_puzzle(self, puzzle) -> tuple[str, dict]:
        """Start an episode on a given puzzle: 4 rows of 4 digits, 0 = empty."""
        grid = tuple(tuple(int(v) for v in row) for row in puzzle)
        if len(grid) != 4 or any(len(row) != 4 or not set(row) <= {0, *DIGITS} for row in grid) or not solutions(grid, limit=1):
            raise ValueError("a Sudoku puzzle is 4 rows of 4 digits 0-4 (0: empty) that can be completed")
        self._grid, self._done = grid, False
        return self.render(), self._info()

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._grid is None or self._done:
            raise EnvError("Sudoku episode is not running: call reset() first")
        placement = parse_placement(action)
        if placement is None:
            shown = action.strip()[:40]
            return f"Invalid action {shown!r}: write place D at (R,C).\n{self.render()}", 0.0, False, self._info(recognised=False)
        digit, (r, c) = placement
        problem = self._problem(digit, (r, c))
        if problem:
            return f"{problem} The grid is unchanged.\n{self.render()}", 0.0, False, self._info(recognised=True)
        self._grid = place(self._grid, digit, (r, c))
        won = self._won()
        self._done = won or not self._solvable_step_left()
        return self.render(), 1.0 if won else 0.0, self._done, self._info(recognised=True)

    def solve(self) -> list[str]:
        """The placements that complete the grid from here (the expert). Raises ``EnvError``
        when an earlier placement made the puzzle unsolvable, or before the first reset."""
        if self._grid is None:
            raise EnvError("Sudoku has no puzzle: call reset() first")
        found = solutions(self._grid, limit=1)
        if not found:
            raise EnvError("the current Sudoku grid cannot be completed (an earlier placement was wrong)")
        return [f"place {found[0][r][c]} at ({r},{c})" for r, c in product(range(4), range(4)) if self._grid[r][c] == 0]

    def render(self) -> str:
        """The observation: the grid (``_`` for empty), then the empty cells' coordinates."""
        if self._grid is None:
            raise EnvError("Sudoku has no puzzle: call reset() first")
        text = render_grid([[str(v) if v else "_" for v in row] for row in self._grid])
        empty = [(r, c) for r, c in product(range(4), range(4)) if self._grid[r][c] == 0]
        return f"{text}\n{describe([('empty cell', 'empty cells', '_', empty)])}" if self.coordinates and empty else text

    def parse_state(self, observation: str) -> Grid | None:
        """The grid an observation shows (0: empty), checked against its empty-cells sentence
        when it has one; ``None`` when it holds no 4×4 grid or the two disagree. Optional (envs/base.py)."""
        rows, sentence = read_observation(observation, "1234_")
        if len(rows) != 4 or len(rows[0]) != 4:
            return None
        grid = tuple(tuple(0 if v == "_" else int(v) for v in row) for row in rows)
        empty = {(r, c) for r, c in product(range(4), range(4)) if grid[r][c] == 0}
        if sentence is not None and (len(sentence) != 1 or sentence[0][1] != "_" or set(sentence[0][2]) != empty):
            return None
        return grid

    def judge(self, observation: str) -> Outcome | None:
        """The rules applied to the grid an observation shows (:meth:`parse_state`): won when
        full, lost when an empty cell has no admissible digit left, and the admissible
        placements; ``None`` if unreadable."""
        grid = self.parse_state(observation)
        if grid is None:
            return None
        empty = [(r, c) for r, c in product(range(4), range(4)) if grid[r][c] == 0]
        won = not empty
        stuck = any(all(conflicts(grid, d, pos) for d in DIGITS) for pos in empty)
        return Outcome(done=won or stuck, won=won, admissible_actions=[f"place {d} at {format_pos(pos)}" for d, pos in legal_placements(grid)])

    def _problem(self, digit: int, pos: Pos) -> str | None:
        r, c = pos
        if not (0 <= r < 4 and 0 <= c < 4) or digit not in DIGITS:
            return f"place {digit} at {format_pos(pos)} is outside the grid or not a digit 1-4."
        if self._grid[r][c]:
            return f"Cell {format_pos(pos)} is already filled."
        if conflicts(self._grid, digit, pos):
            return f"{digit} is already in the row, column or box of {format_pos(pos)}."
        return None

    def _won(self) -> bool:
        return self._grid is not None and all(all(row) for row in self._grid)

    def _solvable_step_left(self) -> bool:
        """Whether every empty cell still has a digit that breaks no rule."""
        empty = [(r, c) for r, c in product(range(4), range(4)) if self._grid[r][c] == 0]
        return all(any(not conflicts(self._grid, d, pos) for d in DIGITS) for pos in empty)

    def _info(self, recognised: bool | None = None) -> dict:
        actions = [f"place {d} at {format_pos(pos)}" for d, pos in legal_placements(self._grid)] if self._grid else []
        info = {"task": self.task, "admissible_actions": actions, "won": self._won()}
        if recognised is not None:
            info["action_recognised"] = recognised
        return info

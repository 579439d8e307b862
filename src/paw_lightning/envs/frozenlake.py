"""FrozenLake as a text game (SPA, METHODS.md §5).

A ``size`` x ``size`` lake: reaching the goal wins (reward 1.0), a hole loses (reward 0),
both end the episode; symbols as in SPA (``P``, ``_``, ``O``, ``G``, ``X``, ``√``).
``observation="full"`` is the grid plus the coordinates sentence (the grid alone with
``coordinates=False``: SPA's ablation), ``"coordinates"`` the sentence alone. Maps (ours): ``random.Random(seed)`` places start and goal (``layout``) and
holes with ``hole_prob``, redrawn until a path exists. Slippery ice (gym semantics): the
intended or either perpendicular direction, 1/3 each, reproducible per (seed, episode).

"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal, get_args

from paw_lightning.envs.base import EnvError, Outcome
from paw_lightning.ranges import AtLeastTwo, UnitIntervalClosedOpen
from paw_lightning.envs.grid import (
    ACTIONS,
    COORDINATES_RULE,
    Pos,
    bfs_plan,
    describe,
    invalid_action_sentence,
    parse_action,
    parse_grid,
    read_observation,
    render_grid,
    shift,
)

Observation = Literal["full", "coordinates"]
Layout = Literal["random", "corners"]
OBSERVATIONS, LAYOUTS = get_args(Observation), get_args(Layout)
PERPENDICULAR = {
    "Up": ("Left", "Right"),
    "Down": ("Right", "Left"),
    "Left": ("Down", "Up"),
    "Right": ("Up", "Down"),
}


class FrozenLakeEnv:
    """FrozenLake on a seeded, always solvable map (see the module docstring for the rules)."""

    max_return = 1.0  # R_max of METHODS.md §3c: the return of a won episode

    def __init__(self, size: AtLeastTwo = 4, slippery: bool = False, hole_prob: UnitIntervalClosedOpen = 0.2, observation: Observation = "full", layout: Layout = "random", coordinates: bool = True) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"FrozenLake layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if observation not in OBSERVATIONS:
            raise ValueError(f"FrozenLake observation must be one of {', '.join(OBSERVATIONS)}, got {observation!r}")
        if observation == "coordinates" and not coordinates:
            raise ValueError("FrozenLake observation='coordinates' with coordinates=False would show nothing")
        if size < 2:
            raise ValueError(f"FrozenLake size must be >= 2, got {size}")
        if not 0.0 <= hole_prob < 1.0:
            raise ValueError(f"FrozenLake hole_prob must be in [0, 1), got {hole_prob}")
        self.size, self.slippery, self.hole_prob, self.observation, self.layout = size, slippery, hole_prob, observation, layout
        self.coordinates = coordinates
        self._rows = self._cols = size
        self._holes: frozenset[Pos] = frozenset()
        self._goal: Pos = (0, 0)
        self._player: Pos | None = None  # None until the first reset
        self._done = False
        self._slip_rng = random.Random(0)

    @property
    def task(self) -> str:
        slip = (
            " The ice is slippery: you move in the chosen direction only one time in three,"
            " otherwise to one of the two perpendicular directions."
            if self.slippery
            else ""
        )
        symbols = (
            " Walk the player (P) to the goal (G) without stepping into a hole (O); _ is frozen ice, X means the player"
            " fell into a hole and √ that the player reached the goal."
            if self.observation == "full"
            else " Walk the player to the goal without stepping into a hole."
        )
        return (
            f"You are on a frozen lake of {self._rows} rows and {self._cols} columns.{symbols} Moving into the border"
            f" leaves the player in place.{slip} {COORDINATES_RULE}"
            f" Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        rng = random.Random(seed)
        self._rows = self._cols = self.size  # _walk's border during generation
        cells = [(r, c) for r in range(self.size) for c in range(self.size)]
        while True:
            start, goal = rng.sample(cells, 2) if self.layout == "random" else (cells[0], cells[-1])
            holes = frozenset(p for p in cells if p not in (start, goal) and rng.random() < self.hole_prob)
            if bfs_plan(start, self._walk(holes), lambda p: p == goal) is not None:
                return self._start(self.size, self.size, start, goal, holes, f"{seed}:{episode}")

    def load_map(self, rows: Sequence[str], episode: int = 0) -> tuple[str, dict]:
        """Start an episode on a given map written with ``P _ O G`` (one ``P``, one ``G``)."""
        found = parse_grid(rows, "P_OG")
        if len(found["P"]) != 1 or len(found["G"]) != 1:
            raise ValueError("a FrozenLake map needs exactly one player (P) and one goal (G)")
        (start,), (goal,) = found["P"], found["G"]
        return self._start(len(rows), len(rows[0]), start, goal, frozenset(found["O"]), f"map:{episode}")

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._player is None or self._done:
            raise EnvError("FrozenLake episode is not running: call reset() first")
        move = parse_action(action)
        if move is None:
            obs = f"{invalid_action_sentence(action)}\n{self.render()}"
            return obs, 0.0, False, self._info(recognised=False)
        if self.slippery:
            move = self._slip_rng.choice((PERPENDICULAR[move][0], move, PERPENDICULAR[move][1]))
        self._player = self._move(self._player, move)
        won = self._player == self._goal
        self._done = won or self._player in self._holes
        info = self._info(recognised=True)
        info["executed_action"] = move
        return self.render(), 1.0 if won else 0.0, self._done, info

    def solve(self) -> list[str]:
        """A shortest hole-free action plan from the current position to the goal (BFS on the
        non-slippery map; on slippery ice it is the plan for the intended directions).
        Empty when the episode is over; raises ``EnvError`` before the first reset."""
        if self._player is None:
            raise EnvError("FrozenLake has no map: call reset() first")
        if self._done:
            return []
        plan = bfs_plan(self._player, self._walk(self._holes), lambda p: p == self._goal)
        assert plan is not None, "maps are solvable and the player is on ice"
        return plan

    def render(self) -> str:
        """The observation text: the grid, then the coordinates sentence (only the sentence
        with ``observation="coordinates"``, only the grid with ``coordinates=False``)."""
        if self._player is None:
            raise EnvError("FrozenLake has no map: call reset() first")
        on_hole, on_goal = self._player in self._holes, self._player == self._goal
        grid = [["O" if (r, c) in self._holes else "_" for c in range(self._cols)] for r in range(self._rows)]
        grid[self._goal[0]][self._goal[1]] = "G"
        grid[self._player[0]][self._player[1]] = "X" if on_hole else "√" if on_goal else "P"
        player = grid[self._player[0]][self._player[1]]
        coords = describe(
            [
                ("player", "players", player, [self._player]),
                ("goal", "goals", "G", [self._goal]),
                ("hole", "holes", "O", self._holes),
            ]
        )
        if self.observation == "coordinates":
            return coords
        return f"{render_grid(grid)}\n{coords}" if self.coordinates else render_grid(grid)

    def parse_state(self, observation: str) -> tuple[str, Pos, Pos, frozenset[Pos]] | None:
        """The state an observation shows, ``(player symbol, player, goal, holes)`` (the symbol:
        ``P`` on ice, ``X`` in a hole, ``√`` on the goal), read from its grid and from its
        coordinates sentence; ``None`` when neither is readable or the two disagree. The map's
        size is not part of it (the sentence does not show it). Optional (envs/base.py)."""
        rows, sentence = read_observation(observation, "P_OGX√")
        states = set()
        if rows:
            found = {symbol: [(r, c) for r, row in enumerate(rows) for c, v in enumerate(row) if v == symbol] for symbol in "PXG√O"}
            players = [(symbol, pos) for symbol in "PX√" for pos in found[symbol]]
            goals = found["G"] + [pos for symbol, pos in players if symbol == "√"]
            if len(players) != 1 or len(goals) != 1:
                return None
            (symbol, player), (goal,) = players[0], goals
            states.add((symbol, player, goal, frozenset(found["O"] + ([player] if symbol == "X" else []))))
        if sentence is not None:
            groups = {name.rstrip("s"): (symbol, cells) for name, symbol, cells in sentence}
            player, goal = groups.get("player"), groups.get("goal")
            if player is None or goal is None or len(player[1]) != 1 or len(goal[1]) != 1 or set(groups) - {"player", "goal", "hole"}:
                return None
            states.add((player[0], player[1][0], goal[1][0], frozenset(groups.get("hole", ("O", []))[1])))
        return states.pop() if len(states) == 1 else None

    def judge(self, observation: str) -> Outcome | None:
        """Whether the state an observation shows (:meth:`parse_state`) ends the episode (the
        player on the goal or in a hole) and is won (on the goal); ``None`` if unreadable."""
        state = self.parse_state(observation)
        if state is None:
            return None
        symbol, player, goal, holes = state
        won = player == goal
        return Outcome(done=won or player in holes, won=won)

    def _start(
        self, rows: int, cols: int, start: Pos, goal: Pos, holes: frozenset[Pos], slip_key: str
    ) -> tuple[str, dict]:
        self._rows, self._cols = rows, cols
        self._player, self._goal, self._holes, self._done = start, goal, holes, False
        self._slip_rng = random.Random(f"frozenlake-slip:{slip_key}")
        return self.render(), self._info()

    def _move(self, pos: Pos, move: str) -> Pos:
        r, c = shift(pos, move)
        return (r, c) if 0 <= r < self._rows and 0 <= c < self._cols else pos

    def _walk(self, holes: frozenset[Pos]):
        """BFS successors: deterministic moves that do not end in a hole."""
        def successors(pos: Pos):
            for move in ACTIONS:
                nxt = self._move(pos, move)
                if nxt not in holes:
                    yield move, nxt
        return successors

    def _info(self, recognised: bool | None = None) -> dict:
        info = {"task": self.task, "admissible_actions": list(ACTIONS), "won": self._player == self._goal}
        if recognised is not None:
            info["action_recognised"] = recognised
        return info

"""Sokoban as a text game (SPA, METHODS.md §5).

The player moves Up/Down/Left/Right and pushes (never pulls) boxes; the episode is won
(reward 1.0, done) when every box is on a target, every other step gives 0, and deadlocks
do not end it. Deterministic: ``episode`` is ignored. Symbols as in SPA (``#``, ``_``,
``O``, ``X``, ``√``, ``P``, ``S``). Levels (ours, simpler than SPA's reverse-play generator):
a random ``size`` x ``size`` room with random targets, boxes and player, kept only if a BFS
finds a solution (at most ``max_generation_tries`` draws).

"""
from __future__ import annotations

import random
from collections.abc import Sequence

from paw_lightning.envs.base import EnvError, Outcome
from paw_lightning.ranges import AtLeastFive, NonNegativeInt, PositiveInt
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

State = tuple[Pos, frozenset[Pos]]  # (player, boxes)


def push(walls: frozenset[Pos], state: State, move: str) -> State:
    """The state after ``move`` under the push rules (unchanged when the move is blocked)."""
    player, boxes = state
    nxt = shift(player, move)
    if nxt in walls:
        return state
    if nxt in boxes:
        beyond = shift(nxt, move)
        if beyond in walls or beyond in boxes:
            return state
        boxes = (boxes - {nxt}) | {beyond}
    return nxt, boxes


def shortest_plan(walls: frozenset[Pos], targets: frozenset[Pos], state: State) -> list[str] | None:
    """A shortest list of moves that puts every box on a target (BFS), or ``None``."""
    def successors(s: State):
        for move in ACTIONS:
            nxt = push(walls, s, move)
            if nxt != s:
                yield move, nxt
    return bfs_plan(state, successors, lambda s: s[1] <= targets)


class SokobanEnv:
    """Sokoban on a seeded, verified-solvable level (see the module docstring for the rules)."""

    max_return = 1.0  # R_max of METHODS.md §3c: the return of a won episode

    def __init__(
        self, size: AtLeastFive = 6, num_boxes: PositiveInt = 1, max_generation_tries: PositiveInt = 1000, max_inner_walls: NonNegativeInt = 2, coordinates: bool = True
    ) -> None:
        if size < 5:
            raise ValueError(f"Sokoban size must be >= 5 (a 3x3 interior), got {size}")
        if num_boxes < 1 or 2 * num_boxes + 1 > (size - 2) ** 2:
            raise ValueError(f"Sokoban num_boxes={num_boxes} does not fit a {size}x{size} room")
        if max_generation_tries < 1 or max_inner_walls < 0:
            raise ValueError("Sokoban max_generation_tries must be >= 1 and max_inner_walls >= 0")
        self.size, self.num_boxes, self.coordinates = size, num_boxes, coordinates
        self.max_generation_tries, self.max_inner_walls = max_generation_tries, max_inner_walls
        self._shape = (size, size)
        self._walls: frozenset[Pos] = frozenset()
        self._blocking: frozenset[Pos] = frozenset()  # walls plus the cells around the grid
        self._targets: frozenset[Pos] = frozenset()
        self._state: State | None = None  # None until the first reset
        self._done = False

    @property
    def task(self) -> str:
        return (
            "You are the player (P) in a Sokoban room surrounded by walls (#). Push every box (X)"
            " onto a target (O) by walking into it: the box moves one cell the same way if that"
            " cell is floor (_) or a target; boxes cannot be pulled, nor pushed into a wall or"
            " another box. √ is a box on a target and S the player on a target."
            f" {COORDINATES_RULE} Actions: {', '.join(ACTIONS)}."
        )

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        rng = random.Random(seed)
        n, k = self.size, self.num_boxes
        border = frozenset((r, c) for r in range(n) for c in range(n) if r in (0, n - 1) or c in (0, n - 1))
        interior = [(r, c) for r in range(1, n - 1) for c in range(1, n - 1)]
        for _ in range(self.max_generation_tries):
            walls = border | frozenset(rng.sample(interior, rng.randint(0, self.max_inner_walls)))
            floor = [p for p in interior if p not in walls]
            if len(floor) < 2 * k + 1:
                continue
            cells = rng.sample(floor, 2 * k + 1)
            targets, state = frozenset(cells[:k]), (cells[-1], frozenset(cells[k : 2 * k]))
            if shortest_plan(walls, targets, state) is not None:
                return self._start((n, n), walls, targets, state)
        raise EnvError(f"no solvable Sokoban level for seed {seed} in {self.max_generation_tries} tries")

    def load_map(self, rows: Sequence[str], episode: int = 0) -> tuple[str, dict]:
        """Start an episode on a given level written with ``# _ O X √ P S`` (not checked for
        solvability). Cells outside the grid count as walls."""
        found = parse_grid(rows, "#_OX√PS")
        players = found["P"] + found["S"]
        boxes = frozenset(found["X"] + found["√"])
        targets = frozenset(found["O"] + found["√"] + found["S"])
        if len(players) != 1 or not boxes or len(boxes) != len(targets):
            raise ValueError("a Sokoban map needs one player (P or S) and as many targets as boxes (at least 1)")
        return self._start((len(rows), len(rows[0])), frozenset(found["#"]), targets, (players[0], boxes))

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self._state is None or self._done:
            raise EnvError("Sokoban episode is not running: call reset() first")
        move = parse_action(action)
        if move is None:
            obs = f"{invalid_action_sentence(action)}\n{self.render()}"
            return obs, 0.0, False, self._info(recognised=False)
        self._state = push(self._blocking, self._state, move)
        self._done = self._won()
        return self.render(), 1.0 if self._done else 0.0, self._done, self._info(recognised=True)

    def solve(self) -> list[str]:
        """A shortest move list from the current state that wins (BFS over (player, boxes)).
        Empty when already won; raises ``EnvError`` from a deadlock or before the first reset."""
        if self._state is None:
            raise EnvError("Sokoban has no level: call reset() first")
        plan = shortest_plan(self._blocking, self._targets, self._state)
        if plan is None:
            raise EnvError("the current Sokoban state cannot be solved (a box is stuck)")
        return plan

    def render(self) -> str:
        """The observation text: the grid, then the coordinates sentence (unless ``coordinates`` is false)."""
        if self._state is None:
            raise EnvError("Sokoban has no level: call reset() first")
        player, boxes = self._state
        grid = [["_"] * self._shape[1] for _ in range(self._shape[0])]
        on_target, off_target = boxes & self._targets, boxes - self._targets
        for cells, symbol in ((self._walls, "#"), (self._targets, "O"), (off_target, "X"), (on_target, "√")):
            for r, c in cells:
                grid[r][c] = symbol
        grid[player[0]][player[1]] = "S" if player in self._targets else "P"
        coords = describe(
            [
                ("player", "players", grid[player[0]][player[1]], [player]),
                ("box", "boxes", "X", off_target),
                ("box", "boxes", "√", on_target),
                ("target", "targets", "O", self._targets),
            ]
        )
        return f"{render_grid(grid)}\n{coords}" if self.coordinates else render_grid(grid)

    def parse_state(self, observation: str) -> tuple[Pos, frozenset[Pos], frozenset[Pos], frozenset[Pos]] | None:
        """The state an observation shows, ``(player, boxes, targets, walls)``, read from its
        grid (required: only it shows the walls) and checked against its coordinates sentence
        when it has one; ``None`` when unreadable or the two disagree. Optional (envs/base.py)."""
        rows, sentence = read_observation(observation, "#_OX√PS")
        if not rows:
            return None
        found = {symbol: frozenset((r, c) for r, row in enumerate(rows) for c, v in enumerate(row) if v == symbol) for symbol in "#OX√PS"}
        players = found["P"] | found["S"]
        if len(players) != 1:
            return None
        (player,) = players
        boxes, targets = found["X"] | found["√"], found["O"] | found["√"] | found["S"]
        if sentence is not None:
            shown = {symbol: frozenset(cells) for _, symbol, cells in sentence}
            expected = {"P" if found["P"] else "S": players, "X": found["X"], "√": found["√"], "O": targets}
            if {k: v for k, v in shown.items() if v} != {k: v for k, v in expected.items() if v}:
                return None
        return player, boxes, targets, found["#"]

    def judge(self, observation: str) -> Outcome | None:
        """Won (and done) when every box of the state an observation shows is on a target
        (:meth:`parse_state`; deadlocks do not end an episode); ``None`` if unreadable."""
        state = self.parse_state(observation)
        if state is None:
            return None
        won = bool(state[1]) and state[1] <= state[2]
        return Outcome(done=won, won=won)

    def _start(
        self, shape: tuple[int, int], walls: frozenset[Pos], targets: frozenset[Pos], state: State
    ) -> tuple[str, dict]:
        rows, cols = shape
        ring = [(r, c) for r in range(-1, rows + 1) for c in range(-1, cols + 1)]
        outside = frozenset((r, c) for r, c in ring if r in (-1, rows) or c in (-1, cols))
        self._shape, self._walls, self._targets, self._state = shape, walls, targets, state
        self._blocking = walls | outside
        self._done = self._won()
        return self.render(), self._info()

    def _won(self) -> bool:
        return self._state is not None and self._state[1] <= self._targets

    def _info(self, recognised: bool | None = None) -> dict:
        info = {"task": self.task, "admissible_actions": list(ACTIONS), "won": self._won()}
        if recognised is not None:
            info["action_recognised"] = recognised
        return info

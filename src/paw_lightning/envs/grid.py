"""Helpers shared by the grid games (FrozenLake, Sokoban): actions, text rendering, BFS.

Observations follow SPA (METHODS.md §5): the raw grid, one row per line with no
separators, then one sentence with the zero-indexed ``(row,col)`` coordinates of the key
objects, e.g. ``Player (P) is at (4,3); box (X) is at (3,3); target (O) is at (1,2).``
Row 0 is the top row and column 0 the leftmost column.
"""
from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence

Pos = tuple[int, int]

ACTIONS: tuple[str, ...] = ("Up", "Down", "Left", "Right")
MOVES: dict[str, Pos] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}
COORDINATES_RULE = "Coordinates are (row,col), zero-indexed from the top-left corner."


def parse_action(action: str) -> str | None:
    """The canonical action named by ``action`` (case-insensitive, surrounding whitespace
    ignored), or ``None`` when it names none."""
    key = action.strip().lower()
    return next((name for name in ACTIONS if name.lower() == key), None)


def shift(pos: Pos, move: str) -> Pos:
    """The cell one step from ``pos`` in direction ``move``."""
    dr, dc = MOVES[move]
    return pos[0] + dr, pos[1] + dc


def invalid_action_sentence(action: str, max_chars: int = 40) -> str:
    """One sentence saying ``action`` was not understood (long actions are truncated)."""
    shown = action.strip()
    if len(shown) > max_chars:
        shown = shown[: max_chars - 3] + "..."
    return f"Invalid action {shown!r}: valid actions are {', '.join(ACTIONS)}."


def format_pos(pos: Pos) -> str:
    return f"({pos[0]},{pos[1]})"


def describe(groups: Iterable[tuple[str, str, str, Iterable[Pos]]]) -> str:
    """The coordinates sentence. ``groups`` holds ``(singular, plural, symbol, positions)``;
    empty groups are left out and positions are listed in row-major order."""
    parts = []
    for singular, plural, symbol, positions in groups:
        cells = sorted(positions)
        if len(cells) == 1:
            parts.append(f"{singular} ({symbol}) is at {format_pos(cells[0])}")
        elif cells:
            listed = ", ".join(format_pos(p) for p in cells)
            parts.append(f"{plural} ({symbol}) are at {listed}")
    sentence = "; ".join(parts)
    return sentence[:1].upper() + sentence[1:] + "."


def render_grid(rows: Sequence[Sequence[str]]) -> str:
    """The grid as text: one row per line, cells not separated."""
    return "\n".join("".join(row) for row in rows)


def parse_grid(rows: Sequence[str], allowed: str) -> dict[str, list[Pos]]:
    """Positions of every symbol in a rectangular text grid (the inverse of ``render_grid``).

    Raises ``ValueError`` on ragged rows or a symbol outside ``allowed``."""
    if not rows or any(len(row) != len(rows[0]) for row in rows) or not rows[0]:
        raise ValueError(f"a map must be a non-empty list of equally long rows, got {list(rows)!r}")
    found: dict[str, list[Pos]] = {symbol: [] for symbol in allowed}
    for r, row in enumerate(rows):
        for c, symbol in enumerate(row):
            if symbol not in found:
                raise ValueError(f"unknown symbol {symbol!r} at {format_pos((r, c))}; allowed: {allowed}")
            found[symbol].append((r, c))
    return found


_SENTENCE_PART = re.compile(r"^([A-Za-z][a-z ]*?) \((.)\) (?:is|are) at (\(\d+,\d+\)(?:, \(\d+,\d+\))*)$")
_CELL = re.compile(r"\((\d+),(\d+)\)")


def parse_sentence(line: str) -> list[tuple[str, str, list[Pos]]] | None:
    """The inverse of :func:`describe`: ``(name, symbol, positions)`` per group, the name in
    lower case as written (singular or plural), or ``None`` when ``line`` is not such a sentence."""
    line = line.strip()
    if not line.endswith("."):
        return None
    groups = []
    for part in line[:-1].split("; "):
        match = _SENTENCE_PART.match(part)
        if match is None:
            return None
        cells = [(int(r), int(c)) for r, c in _CELL.findall(match[3])]
        groups.append((match[1].lower(), match[2], cells))
    return groups


def read_observation(observation: str, symbols: str) -> tuple[list[str], list[tuple[str, str, list[Pos]]] | None]:
    """A (possibly predicted) observation's grid rows, the lines made only of ``symbols`` (the
    first run of them), and its coordinates sentence (:func:`parse_sentence`; ``None`` if it
    has none). Other lines (an invalid-action sentence) are skipped. The helper of the
    environments' optional ``parse_state`` (:mod:`paw_lightning.envs.base`)."""
    rows: list[str] = []
    sentence = None
    for line in (raw.strip() for raw in observation.strip().splitlines()):
        if line and set(line) <= set(symbols) and (not rows or sentence is None):
            if rows and len(line) != len(rows[0]):
                return [], None
            rows.append(line)
        elif sentence is None and (groups := parse_sentence(line)) is not None:
            sentence = groups
    return rows, sentence


def bfs_plan(
    start: Hashable,
    successors: Callable[[Hashable], Iterable[tuple[str, Hashable]]],
    is_goal: Callable[[Hashable], bool],
) -> list[str] | None:
    """A shortest action list from ``start`` to a goal state, or ``None`` if none is reachable.

    ``successors(state)`` yields ``(action, next_state)``; ties are broken by the order it
    yields them, so the plan is deterministic."""
    parents: dict[Hashable, tuple[Hashable, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        if is_goal(state):
            plan = []
            while parents[state] is not None:
                state, action = parents[state]
                plan.append(action)
            return plan[::-1]
        for action, nxt in successors(state):
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
    return None

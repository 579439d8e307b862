"""``AlfWorldEnv``: ALFWorld text games behind the ``TextEnv`` protocol.

Games come from the official ``json_2.1.1`` tree (filtered as alfworld's own loader does) or
are generated offline by :mod:`paw_lightning.envs.alfworld.generator` (``source="auto"`` picks
the first that exists). ``reset(seed, episode)`` plays game ``seed % n_games`` of the split
through alfworld's wrappers (:mod:`~paw_lightning.envs.alfworld.engine`); ALFWorld is
deterministic, so ``episode`` changes nothing. Reward is 10 on the winning step, else 0;
``info`` adds ``task_type``, ``gamefile`` and ``game_index`` to the protocol's keys.

"""
from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from typing import Literal

from paw_lightning.envs.alfworld.generator import SPLITS, TASK_TYPES, GameStore, GeneratorConfig
from paw_lightning.envs.base import EnvError
from paw_lightning.ranges import NonNegativeInt, PositiveInt

Split = Literal[tuple(SPLITS)]
Source = Literal["auto", "official", "generated"]

WIN_REWARD = 10.0
TASK_PREFIX = "Your task is to: "


@functools.lru_cache(maxsize=8)
def official_games(data_root: str, split: str, task_types: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(game file, task type) of every playable game of ``split`` under ``data_root`` (sorted)."""
    split_root = os.path.join(data_root, SPLITS[split])
    games = []
    for root, dirs, files in sorted(os.walk(split_root)):
        if "traj_data.json" not in files + dirs or "movable" in root or "Sliced" in root:
            continue
        game_file = os.path.join(root, "game.tw-pddl")
        if not os.path.lexists(game_file):
            continue
        task_type = read_game_json(os.path.join(root, "traj_data.json"), ("task_type",))["task_type"]
        if task_type not in task_types:
            continue
        if not read_game_json(game_file, GAME_KEYS).get("solvable"):
            continue
        games.append((game_file, task_type))
    return tuple(sorted(games))


GAME_KEYS = ("pddl_domain", "grammar", "pddl_problem")  # what alfworld's engine loads from a game.tw-pddl


def read_game_json(path: str, needed: tuple[str, ...]) -> dict:
    """A game folder's JSON file (``traj_data.json``, ``game.tw-pddl``) as a mapping holding
    ``needed``; a ``ValueError`` naming the file and what is wrong with it otherwise."""
    if os.path.isdir(path):
        raise ValueError(f"'{path}' is a directory, not a file")
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except OSError as err:
        raise ValueError(f"'{path}' cannot be read: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"'{path}' is not text: byte {err.start} is not UTF-8") from None
    except json.JSONDecodeError as err:
        reason = "is empty (0 bytes)" if not err.doc else f"is not valid JSON at line {err.lineno}, column {err.colno}: {err.msg}"
        raise ValueError(f"'{path}' {reason}") from None
    if not isinstance(content, dict):
        raise ValueError(f"'{path}' must hold a JSON object, not a {type(content).__name__}")
    lacking = [name for name in needed if not isinstance(content.get(name), str) or not content[name]]
    if lacking:
        raise ValueError(f"'{path}' lacks {', '.join(lacking)} (an ALFWorld game folder's {os.path.basename(path)})")
    return content


def find_official_root(data_path: str | None) -> str | None:
    """The ``json_2.1.1`` directory of ``data_path`` (or ``$ALFWORLD_DATA``), if there is one."""
    base = data_path if data_path is not None else os.environ.get("ALFWORLD_DATA")
    if not base:
        return None
    base = os.path.expanduser(os.path.expandvars(base))
    for candidate in (os.path.join(base, "json_2.1.1"), base):
        if any(os.path.isdir(os.path.join(candidate, d)) for d in SPLITS.values()):
            return candidate
    return None


class AlfWorldEnv:
    """ALFWorld text games (see the module docstring).

    Args:
        split: ``train``, ``eval_in_distribution`` or ``eval_out_of_distribution``.
        data_path: an official ALFWorld data directory (holding ``json_2.1.1``, or that
            tree itself); None reads ``$ALFWORLD_DATA``.
        source: ``auto`` (official when found, else generated), ``official`` or ``generated``.
        task_types: the task types played (default: all six).
        max_generated: number of generated games in the split.
        max_official: keep only the first N official games (None: all).
        task_mix: generator weights per task type (``{type: weight}``); None = uniform over
            ``task_types``.
        generator_seed: the generator's master seed.
        ood_floor_plans: floor plans held out for ``eval_out_of_distribution`` (None: ALFRED's
            24 test scenes).
        cache_dir: generated-games cache (None: ``$PAW_LIGHTNING_CACHE/alfworld``).
    """

    max_return = WIN_REWARD  # R_max of METHODS.md §3c: the return of a won episode (10)

    def __init__(
        self,
        split: Split = "train",
        data_path: str | None = None,
        source: Source = "auto",
        task_types: Sequence[str] | None = None,
        max_generated: PositiveInt = 1000,
        max_official: PositiveInt | None = None,
        task_mix: dict[str, float] | None = None,
        generator_seed: NonNegativeInt = 0,
        ood_floor_plans: Sequence[int] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"unknown ALFWorld split {split!r}: choose one of {', '.join(SPLITS)}")
        self.task_types = tuple(task_types) if task_types is not None else TASK_TYPES
        unknown = set(self.task_types) - set(TASK_TYPES)
        if unknown or not self.task_types:
            raise ValueError(f"unknown ALFWorld task types {sorted(unknown)}: choose among {TASK_TYPES}")
        if source not in ("auto", "official", "generated"):
            raise ValueError(f"source must be 'auto', 'official' or 'generated', got {source!r}")
        if max_generated < 1:
            raise ValueError(f"max_generated must be >= 1, got {max_generated}")
        self.split = split
        official_root = find_official_root(data_path) if source != "generated" else None
        if source == "official" and official_root is None:
            raise ValueError(f"no official ALFWorld json_2.1.1 tree under {data_path or '$ALFWORLD_DATA'}")
        self.source = "official" if official_root else "generated"
        self.data_root = official_root
        self.max_official = max_official
        self.max_generated = max_generated
        self._store: GameStore | None = None
        if self.source == "generated":
            mix = {t: float((task_mix or {}).get(t, 1.0)) for t in self.task_types}
            kwargs = {"ood_floor_plans": tuple(ood_floor_plans)} if ood_floor_plans is not None else {}
            config = GeneratorConfig(seed=generator_seed, task_mix=tuple(sorted(mix.items())), **kwargs)
            config.weights()  # validates the mix
            self._store = GameStore(config, cache_dir)
        self._env = None
        self._running = False
        self._valid: set[str] = set()
        self._game: dict = {}

    @property
    def n_games(self) -> int:
        """Number of games in the split."""
        if self._store is not None:
            return self.max_generated
        return len(self._official())

    def _official(self) -> tuple[tuple[str, str], ...]:
        games = official_games(self.data_root, self.split, self.task_types)
        if not games:
            where = os.path.join(self.data_root, SPLITS[self.split])
            raise EnvError(f"no playable ALFWorld games of types {self.task_types} in {where}")
        return games[: self.max_official] if self.max_official else games

    def game(self, index: int) -> dict:
        """``{"gamefile", "task_type", …}`` of game ``index % n_games``."""
        index %= self.n_games
        if self._store is not None:
            return {**self._store.entry(self.split, index), "game_index": index}
        gamefile, task_type = self._official()[index]
        return {"gamefile": gamefile, "task_type": task_type, "game_index": index}

    def prepare(self, progress: bool = True) -> int:
        """Generate (or find) every game of the split now instead of at first use; the count."""
        if self._store is not None:
            self._store.ensure(self.split, self.max_generated, progress=progress)
        return self.n_games

    def reset(self, seed: int, episode: int = 0) -> tuple[str, dict]:
        from paw_lightning.envs.alfworld import engine

        self._game = self.game(seed)
        if self._env is None:
            self._env = engine.make_text_env()
        with engine.engine_speedups():
            self._env.load(self._game["gamefile"])
            obs, infos = self._env.reset()
        if TASK_PREFIX not in obs:
            raise EnvError(f"ALFWorld game {self._game['gamefile']} has no task sentence in its first observation")
        self._task = obs.rsplit(TASK_PREFIX, 1)[1].strip()
        self._running = True
        return obs, self._info(infos)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if not self._running:
            raise EnvError("ALFWorld episode is not running: call reset() first")
        from paw_lightning.envs.alfworld import engine

        recognised = action.strip() in self._valid
        with engine.engine_speedups():
            obs, _score, _done, infos = self._env.step(action)
        won = bool(infos["won"])
        self._running = not won
        info = self._info(infos)
        info["action_recognised"] = recognised
        return obs, WIN_REWARD if won else 0.0, won, info

    def walkthrough(self) -> list[str]:
        """The current game's stored winning command sequence from its start (generated games:
        the bundled planner's plan; official games: alfworld's hand-coded expert's)."""
        if not self._game:
            raise EnvError("ALFWorld has no game: call reset() first")
        with open(self._game["gamefile"]) as f:
            return list(json.load(f).get("walkthrough") or [])

    def expert_plan(self) -> list[str]:
        """The bundled planner's commands from the *current* state to a win (slow in kitchens,
        up to a minute: fast-downward searches the full problem; prefer ``walkthrough()``
        from the start)."""
        from paw_lightning.envs.alfworld import engine

        if self._env is None or not self._game:
            raise EnvError("ALFWorld has no game: call reset() first")
        with engine.engine_speedups():
            return engine.replan(self._env)

    def _info(self, infos: dict) -> dict:
        commands = list(infos["admissible_commands"])
        self._valid = set(commands)
        return {
            "task": self._task,
            "admissible_actions": [c for c in commands if c != "help"],
            "won": bool(infos["won"]),
            "task_type": self._game["task_type"],
            "gamefile": self._game["gamefile"],
            "game_index": self._game["game_index"],
        }

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

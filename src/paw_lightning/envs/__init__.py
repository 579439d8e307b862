"""Text environments (the ``TextEnv`` protocol), the grid games of SPA, and a parallel pool."""
from paw_lightning.envs.base import EnvError, TextEnv
from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.envs.pool import EnvPool
from paw_lightning.envs.registry import ENV_REGISTRY, check_env_config, make_env_factory, resolve_env_class, tagged_env_kwargs
from paw_lightning.envs.sokoban import SokobanEnv
from paw_lightning.envs.sudoku import SudokuEnv

__all__ = [
    "ENV_REGISTRY",
    "EnvError",
    "EnvPool",
    "FrozenLakeEnv",
    "SokobanEnv",
    "SudokuEnv",
    "TextEnv",
    "check_env_config",
    "make_env_factory",
    "resolve_env_class",
    "tagged_env_kwargs",
]

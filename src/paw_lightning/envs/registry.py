"""Environment registry: turn a config name plus keyword arguments into an env factory.

``name`` is a registry key (``"frozenlake"``, ``"sokoban"``, ``"sudoku"``, ``"alfworld"``, ``"webshop"``, ``"search_qa"``, ``"world_model"``) or a dotted import
path ``"package.module.ClassName"`` to a user environment implementing ``TextEnv``. A registry
entry may itself be a dotted path, imported on first use (``alfworld``: importing
paw_lightning does not import textworld). The
factory is a ``functools.partial`` of the class, so it pickles by reference and can be
sent to ``EnvPool`` worker processes. Keyword arguments are checked up front against the
constructor's signature and types, and a registered environment is built once with them
(:mod:`paw_lightning.envs.arguments`), so a typo or a value out of range fails at start-up with
one ``ValueError`` instead of inside every worker.
"""
from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Sequence

from paw_lightning.envs.arguments import check_env_arguments
from paw_lightning.envs.base import TextEnv
from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.envs.sokoban import SokobanEnv
from paw_lightning.envs.sudoku import SudokuEnv

ENV_REGISTRY: dict[str, type | str] = {"frozenlake": FrozenLakeEnv, "sokoban": SokobanEnv, "sudoku": SudokuEnv}
ENV_REGISTRY["alfworld"] = "paw_lightning.envs.alfworld.env.AlfWorldEnv"  # a dotted path: imported on first use
ENV_REGISTRY["webshop"] = "paw_lightning.envs.webshop.env.WebShopEnv"
ENV_REGISTRY["search_qa"] = "paw_lightning.envs.search_qa.env.SearchQAEnv"
ENV_REGISTRY["world_model"] = "paw_lightning.envs.world_model.WorldModelEnv"  # RWML's prediction task


def resolve_env_class(name: str) -> type:
    """The environment class for a registry key or a dotted path; ``ValueError`` otherwise."""
    if name in ENV_REGISTRY:
        if not isinstance(ENV_REGISTRY[name], str):
            return ENV_REGISTRY[name]
        name = ENV_REGISTRY[name]
    module_name, _, class_name = name.rpartition(".")
    if not module_name:
        choices = ", ".join(sorted(ENV_REGISTRY))
        raise ValueError(
            f"unknown environment {name!r}: choose one of {choices}, or give a dotted path 'package.module.Class'"
        )
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"cannot import environment class {name!r}: {err}") from None
    if not (inspect.isclass(cls) and all(callable(getattr(cls, m, None)) for m in ("reset", "step"))):
        raise ValueError(f"{name!r} is not an environment class with reset() and step() methods")
    return cls


def check_env_config(name: str, layers: Sequence[tuple[str, dict | None]], build: bool = True) -> type:
    """The class of environment ``name``, after checking the keyword arguments that ``layers``
    give (``(config key, mapping)`` pairs merged in order, e.g. ``data.env_kwargs`` then
    ``data.evaluation.env_kwargs``; :func:`~paw_lightning.envs.arguments.check_env_arguments`):
    a ``ValueError`` naming the key otherwise. With ``build``, a registered class is also built
    once per layer (its own rules)."""
    cls = resolve_env_class(name)
    check_env_arguments(name, cls, layers, build=build and name in ENV_REGISTRY)
    return cls


def make_env_factory(name: str, **kwargs) -> Callable[[], TextEnv]:
    """A picklable zero-argument callable that builds environment ``name`` with ``kwargs`` (checked first)."""
    return functools.partial(check_env_config(name, [("env_kwargs", kwargs)]), **kwargs)


def tagged_env_kwargs(factory: Callable[[], TextEnv]) -> dict:
    """The values of the factory's ``tagged_kwargs`` (a class attribute, see :class:`TextEnv`): the
    factory's keyword, else the constructor's default. Empty for an env without them."""
    cls, given = getattr(factory, "func", None), getattr(factory, "keywords", None) or {}
    names = getattr(cls, "tagged_kwargs", ())
    if not names:
        return {}
    parameters = inspect.signature(cls).parameters
    return {name: given.get(name, parameters[name].default) for name in names}

"""An environment's keyword arguments checked before anything is built from them.

``data.env_kwargs`` and ``data.evaluation.env_kwargs`` are free-form mappings to the parser: what
they may hold is the environment class's constructor. :func:`check_env_arguments` reads it:

1. every given key must be a parameter of the constructor, and every parameter without a default
   must be given;
2. each value must fit the parameter's annotation: the range types of :mod:`paw_lightning.ranges`
   (a probability, a size, a step limit), ``Literal`` choices, ``bool``, paths as ``str``, checked
   by the same parser types, and worded the same way, as every other key of the CLI;
3. a registered environment (:data:`~paw_lightning.envs.registry.ENV_REGISTRY`) is then built once
   with them, so the rules that tie several arguments together (FrozenLake's ``observation`` and
   ``coordinates``, Sokoban's boxes and room size, a data path that must exist) fail here too. A
   registered constructor only checks and stores its arguments (games, catalogs and corpora are
   made on first use), so this costs microseconds; a user's class (a dotted path) is not built:
   its constructor may be expensive, and steps 1–2 still apply to it.

Each failure is one ``ValueError`` naming the key as the config spells it, e.g.
``data.env_kwargs.hole_prob = 2: must be a number >= 0 and < 1``. A value given as an override
(``data.evaluation.env_kwargs``) is named under that key.
"""
from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Sequence

from jsonargparse import ArgumentParser

from paw_lightning.cli_checks import one_line
from paw_lightning.envs.base import EnvError


def check_env_arguments(name: str, cls: type, layers: Sequence[tuple[str, dict | None]], build: bool) -> None:
    """Check the keyword arguments of environment ``name`` (class ``cls``) given by ``layers``:
    ``(config key, mapping)`` pairs, merged in order (a later one overrides), each checked as it
    stands merged with the ones before (the training arguments, then the evaluation's). ``build``:
    construct the class once with each merged mapping (step 3 of the module docstring)."""
    merged: dict = {}
    owner: dict[str, str] = {}
    for where, kwargs in layers:
        merged = {**merged, **(kwargs or {})}
        owner.update({key: where for key in kwargs or {}})
        _check_signature(name, cls, merged, owner, where)
        if build:
            _check_construction(name, cls, merged, where)


def _check_signature(name: str, cls: type, kwargs: dict, owner: dict[str, str], where: str) -> None:
    parameters = _parameters(cls)
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    named = {key: p for key, p in parameters.items() if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)}
    for key in kwargs:
        if key not in named and not takes_any:
            raise ValueError(f"{owner[key]}.{key}: not an argument of the {name} environment (its arguments: {', '.join(named) or 'none'})")
    missing = [key for key, p in named.items() if p.default is inspect.Parameter.empty and key not in kwargs]
    if missing:
        raise ValueError(f"{where}: the {name} environment needs {', '.join(missing)}")
    hints = _hints(cls)
    for key, value in kwargs.items():
        if key in hints:
            _check_value(f"{owner[key]}.{key}", hints[key], value)


def _check_value(key: str, hint, value) -> None:
    """``value`` against ``hint`` with the CLI's parser types, as ``key = value: must be …``."""
    parser = _value_parser(hint)
    try:
        parser.parse_object({"value": value})
    except Exception as err:  # jsonargparse's ArgumentError (or a type's own error): one line
        line = one_line(str(err), [f"--value={value}"])
        reason = line.split(": ", 1)[1] if ": " in line else line
        raise ValueError(f"{key} = {value!r}: {reason}") from None


@functools.lru_cache(maxsize=None)
def _value_parser(hint) -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=hint)
    return parser


def _check_construction(name: str, cls: type, kwargs: dict, where: str) -> None:
    try:
        cls(**kwargs)
    except (ValueError, TypeError, EnvError, FileNotFoundError) as err:
        raise ValueError(f"{where}: {err}" if where else str(err)) from None


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(cls).parameters)


def _hints(cls: type) -> dict:
    """The constructor's resolved annotations (``from __future__ import annotations`` leaves them
    as strings); an annotation that cannot be resolved is not checked."""
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # a user's class with an annotation of a name it does not import
        return {}
    hints.pop("return", None)
    return {key: hint for key, hint in hints.items() if hint is not typing.Any}

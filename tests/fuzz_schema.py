"""Bad CLI values derived from the CLI's own schema, not from a list (tests/test_cli_schema_fuzz.py).

The schema: every leaf key of the ``fit``, ``validate`` and ``test`` parsers (``trainer.*``
included), the declared ranges of Lightning's and torch's keys
(:data:`paw_lightning.cli_checks.DECLARED_RANGES`), and the ``init_args`` of every class that a
YAML file under ``configs/`` selects by ``class_path`` (recursively). From each key's type come
the values it must refuse: a wrong type, an empty string, a float for an integer, NaN and ±inf
for a number, a value just outside each bound of a declared range (zero, negative, above 1,
huge), a value outside a ``Literal``, and an unknown class path. The environments' arguments
(``data.env_kwargs``, ``data.evaluation.env_kwargs``: free-form mappings to the parser) come from
each registered environment's constructor (:func:`env_argument_cases`). A candidate is kept only if no
alternative of the key's type accepts it (:func:`accepts`), so every case is a value the CLI
must refuse with one line naming the key.

:func:`shared_parser` makes the campaign cheap and still faithful: ``main()`` runs as a user's
command does, but the parser (built the same way) is built once, not once per invocation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import math
import operator
import pathlib
import sqlite3
import types
import typing
from collections.abc import Iterable
from unittest import mock

import yaml
from jsonargparse import ArgumentParser
from jsonargparse._loaders_dumpers import yaml_load
from jsonargparse._typehints import ActionTypeHint

from paw_lightning.cli import PawCLI, main
from paw_lightning.cli_checks import DECLARED_RANGES
from paw_lightning.envs import ENV_REGISTRY, resolve_env_class
from paw_lightning.envs.world_model import Triplet, write_triplets

from helpers import ROOT

SUBCOMMANDS = ("fit", "validate", "test")
UNKNOWN_CLASSES = ("no.such.Class",)


@dataclasses.dataclass(frozen=True)
class Case:
    """One bad invocation: ``args`` to add to a valid command line; the error line must name
    ``key`` and ``value`` (and say what is allowed, if ``says_allowed``)."""

    args: tuple[str, ...]
    key: str
    value: str
    subcommand: str = "fit"
    says_allowed: bool = True  # the line also says what is allowed ("must …")


# ------------------------------------------------------------------------------ the parser
@contextlib.contextmanager
def shared_parser():
    """Inside the block, every ``PawCLI`` reuses the parser the first one built (and its
    subcommand bookkeeping): parsing is what is tested, building it again costs ~0.3 s a case."""
    built: dict = {}
    original = PawCLI.setup_parser

    def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs):
        if add_subcommands and built:
            self.parser, self._subcommand_parsers, self._subcommand_method_arguments = built["state"]
            return
        original(self, add_subcommands, main_kwargs, subparser_kwargs)
        if add_subcommands:
            built["state"] = (self.parser, self._subcommand_parsers, self._subcommand_method_arguments)

    with mock.patch.object(PawCLI, "setup_parser", setup_parser):
        yield built


def subcommand_parsers() -> dict[str, ArgumentParser]:
    """The ``fit`` / ``validate`` / ``test`` parsers of the CLI, as ``main()`` builds them."""
    grabbed = {}

    def grab(self, parser, args):
        grabbed.update(self._subcommand_parsers)
        raise SystemExit(0)

    with mock.patch.object(PawCLI, "parse_arguments", grab), contextlib.suppress(SystemExit):
        PawCLI(args=["fit"])
    return {name: grabbed[name] for name in SUBCOMMANDS}


def leaves(parser: ArgumentParser) -> dict[str, typing.Any]:
    """Every typed leaf key of ``parser`` and its type."""
    return {action.dest: action._typehint for action in parser._actions
            if isinstance(action, ActionTypeHint) and not action.dest.endswith(".help")}


def schema() -> dict[str, dict[str, typing.Any]]:
    """Per subcommand: each leaf key's type, a declared range (``DECLARED_RANGES``) replacing
    the type of a key whose class is not ours."""
    parsers = subcommand_parsers()
    return {name: {**leaves(parser), **{k: v for k, v in DECLARED_RANGES.items() if "init_args" not in k}}
            for name, parser in parsers.items()}


def selectable_classes(folder: pathlib.Path = ROOT / "configs") -> dict[tuple[str, str], str]:
    """``(key, class_path)`` of every class that a YAML file under ``folder`` selects → the file."""
    found: dict[tuple[str, str], str] = {}

    def walk(node, path):
        if isinstance(node, dict):
            if isinstance(node.get("class_path"), str) and path:
                found.setdefault((".".join(path), node["class_path"]), str(file.relative_to(ROOT)))
            for name, value in node.items():
                walk(value, [*path, "init_args"] if name == "init_args" else [*path, str(name)] if name != "class_path" else path)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    for file in sorted(folder.rglob("*.yaml")):
        walk(yaml.safe_load(file.read_text()), [])
    return found


def class_leaves(class_path: str) -> dict[str, typing.Any]:
    """The typed constructor arguments of the class at ``class_path``."""
    module, name = class_path.rsplit(".", 1)
    parser = ArgumentParser()
    parser.add_class_arguments(getattr(importlib.import_module(module), name), fail_untyped=False)
    return leaves(parser)


# ------------------------------------------------------------------------- bad values
def alternatives(hint) -> list:
    """The alternatives of a (possibly optional) union type."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [alt for arg in typing.get_args(hint) for alt in alternatives(arg)]
    return [hint]


def accepts(hint, value) -> bool:
    """Whether one alternative of ``hint`` would take ``value`` (already read as YAML), by the
    declared range of a restricted number type; a type this cannot judge counts as accepting."""
    for alt in alternatives(hint):
        origin = typing.get_origin(alt)
        if alt is type(None):
            ok = value is None
        elif origin is typing.Literal:
            ok = any(value == choice and type(value) is type(choice) for choice in typing.get_args(alt))
        elif origin in (list, tuple, set, Iterable) or alt in (list, tuple):
            ok = isinstance(value, list)
        elif origin is dict or alt is dict:
            ok = isinstance(value, dict)
        elif alt is bool:
            ok = isinstance(value, bool)
        elif isinstance(alt, type) and issubclass(alt, bool):
            ok = isinstance(value, bool)
        elif isinstance(alt, type) and issubclass(alt, (int, float)):
            ok = _number_fits(alt, value)
        elif alt in (str, pathlib.Path):  # any text; a number or a list may be text too
            ok = True
        elif isinstance(alt, type) and issubclass(alt, str):  # a restricted string (a pattern)
            ok = isinstance(value, (str, int)) and _string_fits(alt, str(value))
        else:  # a class, a callable, a timedelta, Any: strings and mappings may be specs of them
            ok = True
        if ok:
            return True
    return False


def _number_fits(alt, value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    base = getattr(alt, "_type", int if issubclass(alt, int) else float)
    if base is int and isinstance(value, float) and (alt is int or not value.is_integer()):
        return False  # a restricted int takes an integral float (1e30), as jsonargparse does
    try:
        alt(value)
    except (ValueError, TypeError):
        return False
    return True


def _string_fits(alt, value) -> bool:
    try:
        alt(value)
    except (ValueError, TypeError):
        return False
    return True


def candidates(hint) -> list[str]:
    """Command-line values that could be wrong for ``hint``: by type, and by the bounds of each
    declared range among its alternatives."""
    values = ["abc", "", "[1, 2]", "1.5", ".nan", "1e999"]  # wrong type, empty, a fraction, NaN, inf
    for alt in alternatives(hint):
        for compare, reference in getattr(alt, "_restrictions", ()):  # each bound, and beyond it
            step = 1 if alt._type is int else 0.5
            values += [repr(v) for v in (reference, reference - step, reference + step)]
            values += ["-7", "1e30"] if compare in (operator.gt, operator.ge) and reference >= 0 else ["1e30"]  # negative, huge
        if _takes_a_class(alt):
            values += UNKNOWN_CLASSES
    return list(dict.fromkeys(values))


def _takes_a_class(alt) -> bool:
    """Whether a class_path selects the value: a class type, or a generic of one (``Callable[…, Optimizer]``)."""
    if isinstance(alt, type):
        return not issubclass(alt, (int, float, str, bool, dict, list, pathlib.Path, datetime.timedelta, type(None)))
    return typing.get_origin(alt) is not None and any(
        isinstance(arg, type) and arg.__module__.startswith(("paw_lightning", "lightning", "torch")) for arg in typing.get_args(alt))


def bad_values(hint) -> list[str]:
    """The candidates no alternative of ``hint`` accepts (each read as the CLI reads it: YAML)."""
    bad = []
    for text in candidates(hint):
        value = as_parsed(text)
        if isinstance(value, float) and not math.isfinite(value) and any(_has_float(alt) for alt in alternatives(hint)):
            bad.append(text)  # NaN and ±inf: refused everywhere (cli_checks.check_finite)
        elif text in UNKNOWN_CLASSES:
            bad.append(text)
        elif not accepts(hint, value):
            bad.append(text)
    return bad


def _has_float(alt) -> bool:
    return isinstance(alt, type) and issubclass(alt, float)


def as_parsed(text: str):
    """``text`` as the parser reads a command-line value (jsonargparse's YAML: ``1e30`` is a float)."""
    try:
        return yaml_load(text) if text else ""
    except yaml.YAMLError:
        return text


def cases() -> list[Case]:
    """Every generated bad invocation: each leaf of each subcommand, and each init argument of
    each class a config selects (``--KEY=CLASS --KEY.init_args.ARG=BAD``)."""
    found: list[Case] = []
    seen: set[str] = set()  # validate and test share fit's sections: each section key once; the top-level keys in each
    for subcommand, keys in schema().items():
        for key, hint in sorted(keys.items()):
            if key not in seen or "." not in key:
                seen.add(key)
                found += [Case((f"--{key}={value}",), key, value, subcommand) for value in bad_values(hint)]
    for (key, class_path), _ in sorted(selectable_classes().items()):
        select = f"--{key}={class_path}"
        for arg, hint in sorted(class_leaves(class_path).items()):
            if key == "model.optimizer" and arg == "params":  # the callable's argument: the module gives it
                continue
            full = f"{key}.init_args.{arg}"
            declared = DECLARED_RANGES.get(full)
            found += [Case((select, f"--{full}={value}"), full, value) for value in bad_values(declared or hint)]
    return found


def env_argument_cases(folder: pathlib.Path) -> list[Case]:
    """Each typed constructor argument of each registered environment, given bad values under
    ``data.env_kwargs`` and (for the first environment's) ``data.evaluation.env_kwargs``; the
    world-model environment gets a valid triplet folder in ``folder`` for its required ``directory``."""
    write_triplets(folder / "triplets" / "train.jsonl", [Triplet("t", "o", "a", "n", [("o0", "a0")])] * 3)
    required = {"world_model": {"directory": str(folder / "triplets")}}
    found: list[Case] = []
    for name in sorted(ENV_REGISTRY):
        cls = resolve_env_class(name)
        base = (f"--data.env={name}", f"--data.env_kwargs={required.get(name, {})}")
        for arg, hint in sorted(typing.get_type_hints(cls.__init__).items()):
            if arg == "return" or arg in required.get(name, {}):
                continue
            for key in ("data.env_kwargs", "data.evaluation.env_kwargs") if name == "frozenlake" else ("data.env_kwargs",):
                found += [Case((*base, f"--{key}.{arg}={value}"), f"{key}.{arg}", value) for value in bad_values(hint)]
    return found


def runs_in(database) -> int:
    """Active MLflow runs in the test's tracking database (a bad invocation may leave none)."""
    if not database.exists():
        return 0
    with sqlite3.connect(database) as connection:
        return connection.execute("select count(*) from runs where lifecycle_stage = 'active'").fetchone()[0]


def invoke(argv: list[str], capsys) -> tuple[object, str, list[str]]:
    """Run ``main(argv)``: (its exit code, ``None`` if it ran through, or the exception that
    escaped main's handling as text; its stderr; the stderr's ``error:`` lines)."""
    try:
        main(argv)
        code = None  # it ran: the bad input went unnoticed
    except SystemExit as done:
        code = done.code
    except Exception as err:  # escaped main's handling: a traceback for the user
        code = f"{type(err).__name__}: {err}"
    err = capsys.readouterr().err
    return code, err, [line for line in err.splitlines() if line.startswith("error:")]

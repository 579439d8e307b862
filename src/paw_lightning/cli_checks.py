"""Checks of the command line's input that run before anything is built, and its errors as one line.

The parser checks each key against its type; our own classes declare their ranges as types
(:mod:`paw_lightning.ranges`). This module adds what the parser cannot see:

- :data:`DECLARED_RANGES`: ranges of keys whose classes are not ours (Lightning's ``Trainer``
  and ``ModelCheckpoint``, torch's optimizer), checked by :func:`check_declared_ranges` with a
  small parser of their own, so that the error names the key before Lightning builds anything;
- :func:`check_finite`: no NaN or ±inf anywhere in the config;
- (the input files are :mod:`paw_lightning.input_files`'s);
- :func:`one_line`: a parser error as ``key = value: must be …``.

Every check raises ``ValueError`` (``FileNotFoundError`` for a missing file, or the parser's
``ArgumentError``); ``paw_lightning.cli.main`` prints it as one ``error:`` line and exits with
code 2.
"""
from __future__ import annotations

import functools
import math
import re
from typing import Any, Literal, Optional, Union

from jsonargparse import ArgumentParser, Namespace
from jsonargparse.typing import restricted_string_type

from paw_lightning.ranges import ClosedUnitInterval, FromMinusOne, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, describe, restricted_number_type

DeviceIds = restricted_string_type("DeviceIds", r"^([1-9][0-9]*|[0-9]+,([0-9]+,?)*)$")  # "2" devices, or indices "0,1"
Seed = restricted_number_type("Seed", int, [(">=", 0), ("<=", 2**32 - 1)])  # numpy's seed range
Batches = Optional[Union[NonNegativeInt, ClosedUnitInterval]]  # Lightning: a count of batches, or a fraction of them
# the keys of classes that are not ours (Lightning's, torch's), with the ranges their own code checks late or not at all
DECLARED_RANGES: dict[str, Any] = {
    "seed_everything": Union[bool, Seed],
    "trainer.devices": Union[PositiveInt, Literal[-1, "-1", "auto"], list[NonNegativeInt], DeviceIds],
    "trainer.num_nodes": PositiveInt,
    "trainer.max_epochs": Optional[FromMinusOne],
    "trainer.min_epochs": Optional[NonNegativeInt],
    "trainer.max_steps": FromMinusOne,
    "trainer.min_steps": Optional[NonNegativeInt],
    "trainer.check_val_every_n_epoch": Optional[PositiveInt],
    "trainer.log_every_n_steps": Optional[PositiveInt],
    "trainer.accumulate_grad_batches": PositiveInt,
    "trainer.num_sanity_val_steps": Optional[FromMinusOne],
    "trainer.reload_dataloaders_every_n_epochs": NonNegativeInt,
    "trainer.limit_train_batches": Batches,
    "trainer.limit_val_batches": Batches,
    "trainer.limit_test_batches": Batches,
    "trainer.limit_predict_batches": Batches,
    "trainer.overfit_batches": Union[NonNegativeInt, ClosedUnitInterval],
    "trainer.gradient_clip_val": Optional[NonNegativeFloat],
    "trainer.fast_dev_run": Union[bool, NonNegativeInt],
    "checkpoint.save_top_k": FromMinusOne,
    "checkpoint.every_n_epochs": Optional[NonNegativeInt],
    "checkpoint.every_n_train_steps": Optional[NonNegativeInt],
    "checkpoint.mode": Literal["min", "max"],
    "model.optimizer.init_args.lr": PositiveFloat,
    "model.optimizer.init_args.weight_decay": NonNegativeFloat,
    "model.optimizer.init_args.eps": NonNegativeFloat,
}


@functools.cache
def _range_parser() -> ArgumentParser:
    parser = ArgumentParser(exit_on_error=False)
    for key, range_type in DECLARED_RANGES.items():
        parser.add_argument(f"--{key}", type=range_type)  # only the keys a config holds are given
    return parser


def check_declared_ranges(config: Namespace) -> None:
    """The values of :data:`DECLARED_RANGES`' keys that ``config`` (one subcommand's) holds,
    each against its range; ``trainer.accelerator`` and ``trainer.strategy``, when given by
    name, against the names Lightning knows."""
    given = Namespace()
    for key in DECLARED_RANGES:
        value = config_value(config, key)
        if value is not None:
            given[key] = value
    _range_parser().parse_object(given)
    _check_registered_name(config, "trainer.accelerator", _accelerators())
    _check_registered_name(config, "trainer.strategy", _strategies())
    _check_registered_name(config, "trainer.profiler", ["simple", "advanced", "pytorch", "xla"])


def config_value(config: Namespace, key: str):
    """The value of the dotted ``key`` in ``config``, ``None`` where it has none."""
    try:
        return config[key]
    except (KeyError, TypeError, AttributeError):
        return None


def _accelerators() -> list[str]:
    from lightning.pytorch.accelerators import AcceleratorRegistry

    return ["auto", "gpu", *sorted(AcceleratorRegistry.available_accelerators())]


def _strategies() -> list[str]:
    from lightning.pytorch.strategies import StrategyRegistry

    return ["auto", "ddp", "dp", "fsdp", *StrategyRegistry.available_strategies()]


def _check_registered_name(config: Namespace, key: str, names: list[str]) -> None:
    value = config_value(config, key)
    if isinstance(value, str) and value not in names:
        raise ValueError(f"{key} = {value!r}: must be one of {', '.join(dict.fromkeys(names))}, or a class_path")


def check_finite(config, prefix: str = "") -> None:
    """Refuse NaN and ±inf anywhere in ``config`` (YAML's ``.nan``/``.inf``, ``1e999``): no
    setting means them, and a range check such as ``> 0`` lets ``inf`` through."""
    items = vars(config).items() if isinstance(config, Namespace) else config.items() if isinstance(config, dict) else enumerate(config) if isinstance(config, list) else ()
    for name, value in items:
        key = f"{prefix}.{name}" if prefix and not isinstance(name, int) else f"{prefix}[{name}]" if prefix else str(name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{key} = {value}: must be a finite number")
        if isinstance(value, (Namespace, dict, list)):
            check_finite(value, key)


# ----------------------------------------------------------------------------------- files
KINDS = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "list": "a list", "dict": "a mapping", "NoneType": "null"}
_NAMED = {"DeviceIds": "device indices such as '0,1'"}
_NOISE = ("Subtypes:", "Errors:", "Given value type:", "Given value:", "Does not validate against any of the Union subtypes")


def one_line(message: str, args: list[str] | tuple = ()) -> str:
    """A parser (or union) error as one line: ``key = value: must be …`` (what the key's type
    allows), e.g. ``model.world_model_objective.init_args.alpha = 1.5: must be a number > 0 and
    <= 1``. jsonargparse lists every alternative of a union, nested per class, over a dozen
    lines; the key is the chain of ``Parser key`` lines (a class's arguments under
    ``.init_args.``), the reasons those of the innermost one; a value the message does not
    show is taken from the command line ``args`` (``--key=value``)."""
    raw = []
    for line in message.rstrip().splitlines():  # a callable's error puts the nested key on its own line: split it off
        head, sep, tail = line.partition(': Parser key "')
        raw += [head, " " * _indent(line) + 'Parser key "' + tail] if sep else [line]
    raw = [line for line in raw if line.strip()]
    chain, block = _key_chain(raw)
    if not chain:
        reasons = [_clean(line) for line in raw if not _clean(line).startswith((*_NOISE, "Expected a <class 'NoneType'>"))]
        first = reasons[0] if reasons else "invalid arguments"
        return re.sub(r"^unrecognized arguments: (?:(?:fit|validate|test) )+", "unrecognized arguments: ", first)
    key = ".init_args.".join(chain)
    if any(isinstance(arg, str) and arg.startswith(f"--{'.'.join(chain)}=") for arg in args):
        key = ".".join(chain)  # a dataclass or null (e.g. data.evaluation.fixed): its keys have no init_args
    allowed, value, other = _alternatives(block)
    if value is None:
        value = next((arg.split("=", 1)[1] for arg in args if isinstance(arg, str) and arg.startswith(f"--{key}=")), None)
    if other and value is not None:  # a class that is missing or refuses an option
        return f"{key} = {value}: {other[0]}" + (f"; must be {_or(allowed)}" if allowed else "")
    if allowed and value is not None:
        return f"{key} = {value}: must be {_or(allowed)}"
    reason = other[0] if other else _or(allowed) if allowed else "invalid value"
    return f"{key}: {reason}" + (f" (given: {value})" if value is not None and value not in reason else "")


def _clean(line: str) -> str:
    return line.strip().removeprefix("- ").strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" -"))


def _key_chain(raw: list[str]) -> tuple[list[str], list[str]]:
    """The nested ``Parser key`` names (each deeper than the last) and the lines under the innermost."""
    chain, depth, start = [], -1, 0
    for number, line in enumerate(raw):
        found = re.match(r'\s*(?:- )?Parser key "([^"]+)"', line)
        if found and _indent(line) > depth:
            chain.append(found.group(1))
            depth, start = _indent(line), number + 1
    block = []
    for line in raw[start:]:
        if _indent(line) <= depth:
            break
        block.append(line)
    return chain, block


def _alternatives(block: list[str]) -> tuple[list[str], str | None, list[str]]:
    """What the innermost key's type allows (one phrase per alternative of a union), the given
    value, and any reason that is not a type's (a missing class, an unknown option)."""
    allowed, other, value, cls = [], [], None, None
    top = min((_indent(line) for line in block), default=0)
    for line in block:
        text = _clean(line)
        if text.startswith("Subtypes:") and _indent(line) == top:  # a class's alternative: any subclass
            allowed += [f"a class_path of {name} or a subclass" for module, name in re.findall(r"<class '([\w.]+)\.(\w+)'>", text)
                        if module.split(".")[0] not in ("builtins", "jsonargparse", "pathlib", "datetime")]
        if found := re.match(r"Problem with given class_path '([^']*)':", text):
            cls = found.group(1)
        if text.startswith("Given value:") and _indent(line) == top:
            value = text.split(":", 1)[1].strip()
            nested = re.match(r"NestedArg\(key='.*', val='(.*)'\)$", value)
            value = nested.group(1) if nested else value
            continue
        if text.startswith(_NOISE) or text.startswith("Problem with given class_path") or text.startswith("Expected a path but"):
            continue
        if found := re.match(r"Type typing\.Callable.* expects a function or a callable class: (.*?)(?:\. Got value: (.*))?$", text):
            allowed.append("the class_path of a callable class")
            other.append(found.group(1))
            value = value if value is not None else found.group(2)
            continue
        phrase, given = _phrase(text)
        given = given.split(". Got value:")[0] if given is not None else None  # a callable's error repeats the whole spec
        if given is not None and value is None:
            value = given
        if phrase is not None:
            allowed.append(phrase)
        else:
            other.append(f"class_path '{cls}': {text}" if cls and cls not in text else text)
    return list(dict.fromkeys(allowed)), value, other


def _phrase(reason: str) -> tuple[str | None, str | None]:
    """(what the type allows, the given value if the reason names it) of one type's error."""
    if found := re.match(r"Not of type (\w+): (?:(\S+) )?does not conform to restriction (.+)$", reason):
        return _range_words(found.group(1), found.group(3)), found.group(2)
    if found := re.match(r"Not of type (\w+): (?:(\S+) )?does not match regular expression", reason):
        return _NAMED.get(found.group(1), f"a {found.group(1)}"), found.group(2)
    if found := re.match(r"Not of type (\w+): .*", reason):
        return _range_words(found.group(1), None), None
    if found := re.match(r"Expected a <class '(?:[\w.]+\.)?(\w+)'>(?:\. Got value:\s*(.*))?$", reason):
        return KINDS.get(found.group(1), f"a {found.group(1)}"), found.group(2)
    if found := re.match(r"Expected a typing\.Literal\[(.*)\](?:\. Got value:\s*(.*))?$", reason):
        return f"one of {found.group(1)}", found.group(2)
    return None, None


def _range_words(name: str, expression: str | None) -> str:
    """``an integer > 0`` for a restricted type by name (:func:`~paw_lightning.ranges.describe`)."""
    from paw_lightning import ranges

    if name in _NAMED:
        return _NAMED[name]
    known = getattr(ranges, name, None) or globals().get(name)
    if known is not None and getattr(known, "_restrictions", None):
        return describe(known)
    return re.sub(r"v(>=|<=|==|!=|>|<)", r"\1 ", expression) if expression else f"a {name}"


def _or(phrases: list[str]) -> str:
    """``a, b or c`` with null last (``…, or null``)."""
    phrases = [p for p in phrases if p != "null"] + (["null"] if "null" in phrases else [])
    return phrases[0] if len(phrases) == 1 else f"{', '.join(phrases[:-1])} or {phrases[-1]}"

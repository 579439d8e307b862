"""Declared ranges of numeric settings, as types: the CLI's parser refuses a value outside its
range with one line naming the key, the value and the range, before anything is built.

jsonargparse's restricted number types (``PositiveInt``, ``ClosedUnitInterval``, …) are ``int``
and ``float`` subclasses: a class built in Python takes plain numbers and checks nothing more
than before; a setting read from YAML or the command line is checked at parse time.
NaN and ±inf pass a type such as ``PositiveFloat`` (or a plain ``float``, written ``.inf`` or
``1e999``): the CLI refuses any non-finite number in the whole config
(:func:`paw_lightning.cli_checks.check_finite`), so the types here state only the range.
"""
from __future__ import annotations

import operator

from jsonargparse.typing import (  # noqa: F401  (re-exported: one import site for every range)
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
    restricted_number_type,
)

UnitIntervalOpenClosed = restricted_number_type("UnitIntervalOpenClosed", float, [(">", 0.0), ("<=", 1.0)])  # (0, 1]: α, ρ, fractions kept
UnitIntervalClosedOpen = restricted_number_type("UnitIntervalClosedOpen", float, [(">=", 0.0), ("<", 1.0)])  # [0, 1): a dropout probability
NonPositiveFloat = restricted_number_type("NonPositiveFloat", float, [("<=", 0.0)])  # a penalty or a ceiling of advantages
AboveOne = restricted_number_type("AboveOne", float, [(">", 1.0)])  # a ratio bound above 1 (dual clip)
AtLeastOne = restricted_number_type("AtLeastOne", float, [(">=", 1.0)])  # a multiplier that never shrinks
FromMinusOne = restricted_number_type("FromMinusOne", int, [(">=", -1)])  # a count where -1 means "no limit" / "all"
# the environments' own (envs/arguments.py checks data.env_kwargs against them)
AtLeastTwo = restricted_number_type("AtLeastTwo", int, [(">=", 2)])  # a FrozenLake side
AtLeastFive = restricted_number_type("AtLeastFive", int, [(">=", 5)])  # a Sokoban room side: a 3x3 interior
OneToTen = restricted_number_type("OneToTen", int, [(">=", 1), ("<=", 10)])  # Sudoku's blanks
CosineDistance = restricted_number_type("CosineDistance", float, [(">", 0.0), ("<=", 2.0)])  # a threshold of 1 - cos


def describe(range_type) -> str:
    """What a restricted type allows, in words: ``an integer > 0``, ``a number >= 0 and <= 1``."""
    restrictions = getattr(range_type, "_restrictions", None)
    if not restrictions:
        return getattr(range_type, "__name__", str(range_type))
    kind = "an integer" if range_type._type is int else "a number"
    join = f" {range_type._join} "
    return f"{kind} " + join.join(f"{_SYMBOLS[compare]} {reference:g}" for compare, reference in restrictions)


_SYMBOLS = {operator.gt: ">", operator.ge: ">=", operator.lt: "<", operator.le: "<=", operator.eq: "==", operator.ne: "!="}

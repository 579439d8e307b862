"""Floor plans and object rules for the ALFWorld generator, read from the ``alfworld`` package.

Everything comes from what ``alfworld`` ships (``alfworld/gen/layouts/FloorPlan<N>-*`` files
and ``alfworld.gen.constants``); nothing is invented except where stated. Simplifications
(ours): a receptacle type without instances gets ``EXTRA_RECEPTACLE_COUNT`` of them at free
navigable points (per-floor-plan seeded RNG); a lamp stands on a ``LAMP_HOLDERS`` receptacle;
movable receptacles are ordinary objects; non-interactive scenery is left out.

"""
from __future__ import annotations

import functools
import json
import os
import random
import re
from dataclasses import dataclass

import alfworld.gen.constants as C

LAYOUT_DIR = os.path.join(os.path.dirname(C.__file__), "layouts")

ROOM_TYPES = {
    "Kitchen": range(1, 31), "LivingRoom": range(201, 231), "Bedroom": range(301, 331), "Bathroom": range(401, 431)
}
ALL_FLOOR_PLANS: tuple[int, ...] = tuple(n for r in ROOM_TYPES.values() for n in r)
#: Held out for the out-of-distribution split by default: ALFRED's test scenes (6 per room type).
DEFAULT_OOD_FLOOR_PLANS: tuple[int, ...] = tuple(sorted(C.TEST_SCENE_NUMBERS))

EXTRA_RECEPTACLE_COUNT = {"StoveBurner": 4}
LAMPS = ("DeskLamp", "FloorLamp")
LAMP_HOLDERS = (
    "Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand", "ArmChair", "Sofa", "Bed"
)

MOVABLE_RECEPTACLES = frozenset(C.MOVABLE_RECEPTACLES)
STATIC_RECEPTACLE_TYPES = frozenset(C.VAL_RECEPTACLE_OBJECTS) - MOVABLE_RECEPTACLES
OPENABLE_TYPES = frozenset(C.OPENABLE_CLASS_SET)
CLEANABLE = frozenset(C.VAL_ACTION_OBJECTS["Cleanable"])
HEATABLE = frozenset(C.VAL_ACTION_OBJECTS["Heatable"])
COOLABLE = frozenset(C.VAL_ACTION_OBJECTS["Coolable"])
SLICEABLE = frozenset(C.VAL_ACTION_OBJECTS["Sliceable"])
TOGGLEABLE = frozenset(C.VAL_ACTION_OBJECTS["Toggleable"])
#: Object types that can be placed somewhere (ALFRED's pickupable objects, sliced ones excluded).
PLACEABLE = frozenset(o for objs in C.VAL_RECEPTACLE_OBJECTS.values() for o in objs if not o.endswith("Sliced"))
GOALS_VALID = {task: frozenset(rooms) for task, rooms in C.GOALS_VALID.items()}


def can_hold(receptacle_type: str, object_type: str) -> bool:
    """ALFRED's rule: may ``object_type`` be placed in ``receptacle_type``?"""
    return object_type in C.VAL_RECEPTACLE_OBJECTS.get(receptacle_type, ())


def room_type(floor_plan: int) -> str:
    for room, numbers in ROOM_TYPES.items():
        if floor_plan in numbers:
            return room
    raise ValueError(f"unknown floor plan {floor_plan}")


@dataclass(frozen=True)
class Receptacle:
    """A receptacle instance: ALFRED id (``Cabinet|+00.68|...``), type, PDDL location id."""

    id: str
    type: str
    location: str


@dataclass(frozen=True)
class FloorPlan:
    """What a floor plan offers the generator (see the module docstring)."""

    number: int
    room: str
    receptacles: tuple[Receptacle, ...]
    object_types: tuple[str, ...]  # placeable object types present, sorted
    lamps: tuple[str, ...]  # toggleable lamp types present
    free_points: tuple[tuple[int, int], ...]  # navigable grid points that hold no receptacle

    @property
    def receptacle_types(self) -> frozenset[str]:
        return frozenset(r.type for r in self.receptacles)

    def receptacles_of(self, rtype: str) -> list[Receptacle]:
        return [r for r in self.receptacles if r.type == rtype]


def _location(x: float, z: float, rotation: float, horizon: float) -> str:
    step = C.AGENT_STEP_SIZE
    return f"loc|{round(x / step)}|{round(z / step)}|{round(rotation / 90) % 4}|{int(horizon)}"


def _receptacle_type(alfred_id: str) -> str:
    """``Sink|-01.90|+00.97|-01.50|SinkBasin`` -> SinkBasin; ``Cabinet|+00.68|...`` -> Cabinet."""
    parts = alfred_id.split("|")
    return parts[-1] if len(parts) > 4 and not re.match(r"^[+-]?\d", parts[-1]) else parts[0]


@functools.cache
def load_floor_plan(number: int) -> FloorPlan:
    """Read floor plan ``number`` from ``alfworld/gen/layouts`` (cached)."""
    import numpy as np

    base = os.path.join(LAYOUT_DIR, f"FloorPlan{number}")
    with open(f"{base}-objects.json") as f:
        present = set(json.load(f))
    with open(f"{base}-openable.json") as f:
        poses = json.load(f)
    step = C.AGENT_STEP_SIZE
    points = sorted({(round(x / step), round(z / step)) for x, z in np.load(f"{base}-layout.npy")})

    receptacles = []
    for alfred_id, (x, z, rotation, horizon) in sorted(poses.items()):
        rtype = _receptacle_type(alfred_id)
        if rtype in STATIC_RECEPTACLE_TYPES:
            receptacles.append(Receptacle(alfred_id, rtype, _location(x, z, rotation, horizon)))
    have = {r.type for r in receptacles}
    used = {tuple(int(v) for v in r.location.split("|")[1:3]) for r in receptacles}
    for rtype in sorted(present & STATIC_RECEPTACLE_TYPES - have):
        rng = random.Random(f"alfworld-extra-receptacle:{number}:{rtype}")
        for k in range(1, EXTRA_RECEPTACLE_COUNT.get(rtype, 1) + 1):
            px, pz = rng.choice([p for p in points if p not in used])
            used.add((px, pz))
            stem = rtype[: -len("Basin")] + f"|extra|{k}|{rtype}" if rtype.endswith("Basin") else f"{rtype}|extra|{k}"
            receptacles.append(Receptacle(stem, rtype, "loc|%d|%d|%d|30" % (px, pz, rng.randrange(4))))

    rtypes = {r.type for r in receptacles}
    objects = tuple(sorted(o for o in present & PLACEABLE if any(can_hold(rt, o) for rt in rtypes)))
    lamps = tuple(lamp for lamp in LAMPS if lamp in present and rtypes & set(LAMP_HOLDERS))
    return FloorPlan(
        number=number,
        room=room_type(number),
        receptacles=tuple(receptacles),
        object_types=objects,
        lamps=lamps,
        free_points=tuple(p for p in points if p not in used),
    )

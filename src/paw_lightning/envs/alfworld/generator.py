"""Offline procedural ALFWorld games: PDDL problems in ALFWorld's own domain, verified solvable.

A game (all draws from one seeded ``random.Random``): a task type from ``task_mix`` and a
floor plan that allows it; the target object and receptacle types; a scene of 1-3 instances
per object type where ALFRED's rules allow; the PDDL problem and goal-library task sentence;
then ``Verifier``: a fast-downward plan replayed through the text engine must win, else redraw.
Simplifications (ours): small object counts, uniform placement instead of ALFRED's physics
spawn, no sliced objects or movable-receptacle tasks, templated (not human) task sentences.
Splits (``SPLITS``) never share a game; the output is the official ``json_2.1.1`` layout.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
from dataclasses import dataclass, field, replace

import alfworld.gen.goal_library as glib

from paw_lightning.envs.alfworld import engine as E
from paw_lightning.envs.alfworld import layouts as L

GENERATOR_VERSION = 1
TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
#: Our split names (alfworld's ``train_eval`` values) -> directory of the official tree.
SPLITS = {"train": "train", "eval_in_distribution": "valid_seen", "eval_out_of_distribution": "valid_unseen"}
ID_BUCKETS = 10
MAX_DRAWS = 200
#: The appliance a state-changing task uses, excluded as its target receptacle.
STATE_CHANGE = {
    "pick_clean_then_place_in_recep": ("SinkBasin", L.CLEANABLE, {"SinkBasin", "BathtubBasin"}),
    "pick_heat_then_place_in_recep": ("Microwave", L.HEATABLE, {"Microwave"}),
    "pick_cool_then_place_in_recep": ("Fridge", L.COOLABLE, {"Fridge"}),
}
#: Constants the domain's actions name; always declared in the problem.
DOMAIN_CONSTANTS = (
    "SinkBasinType - rtype", "MicrowaveType - rtype", "FridgeType - rtype",
    "KnifeType - otype", "ButterKnifeType - otype",
)


def _data_file(name: str) -> str:
    import alfworld

    return os.path.join(os.path.dirname(alfworld.__file__), "data", name)


def domain_text() -> str:
    with open(_data_file("alfred.pddl")) as f:
        return f.read()


def grammar_text() -> str:
    with open(_data_file("alfred.twl2")) as f:
        return f.read()


def mangle(alfred_id: str) -> str:
    """ALFRED id -> PDDL name, as ALFRED/ALFWorld write them (``|`` -> ``_bar_`` ...)."""
    for old, new in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        alfred_id = alfred_id.replace(old, new)
    return alfred_id


@dataclass
class GameSpec:
    """One drawn game: task, scene and start pose (everything needed to write the files)."""

    floor_plan: int
    task_type: str
    object_target: str
    parent_target: str  # receptacle type, "" for look_at_obj_in_light
    toggle_target: str  # lamp type for look_at_obj_in_light, else ""
    task_desc: str
    objects: list[tuple[str, str, str]] = field(default_factory=list)  # (alfred id, type, receptacle id)
    agent_location: str = ""

    @property
    def task_dir(self) -> str:
        """``<task_type>-<Object>-<MovableRecep>-<Recep>-<scene>`` as in ALFRED/ALFWorld."""
        recep = self.parent_target or self.toggle_target
        return f"{self.task_type}-{self.object_target}-None-{recep}-{self.floor_plan}"

    def signature(self) -> str:
        return json.dumps([self.floor_plan, self.task_type, self.object_target, self.parent_target,
                           self.toggle_target, sorted(self.objects), self.agent_location])

    def pddl_params(self) -> dict:
        return {"object_target": self.object_target, "parent_target": self.parent_target,
                "toggle_target": self.toggle_target, "mrecep_target": "", "object_sliced": False}


def task_options(fp: L.FloorPlan, task_type: str) -> list[tuple[str, str]]:
    """Feasible (object type, receptacle-or-lamp type) pairs for ``task_type`` in ``fp``."""
    if fp.room not in L.GOALS_VALID[task_type]:
        return []
    rtypes = fp.receptacle_types
    if task_type == "look_at_obj_in_light":
        return [(o, lamp) for o in fp.object_types for lamp in fp.lamps]
    needs, allowed, excluded = STATE_CHANGE.get(task_type, (None, L.PLACEABLE, set()))
    if needs is not None and needs not in rtypes:
        return []
    options = []
    for o in fp.object_types:
        if o not in allowed:
            continue
        holders = {rt for rt in rtypes if L.can_hold(rt, o)}
        for rt in sorted(holders - excluded):
            if holders - {rt}:  # somewhere else to start from
                options.append((o, rt))
    return options


def sample_spec(rng: random.Random, fp: L.FloorPlan, task_type: str) -> GameSpec | None:
    """Draw task parameters and a scene for ``task_type`` in ``fp`` (None if infeasible)."""
    options = task_options(fp, task_type)
    if not options:
        return None
    obj = rng.choice(sorted({o for o, _ in options}))
    target = rng.choice(sorted(t for o, t in options if o == obj))
    look = task_type == "look_at_obj_in_light"
    parent, toggle = ("", target) if look else (target, "")
    template = rng.choice(glib.gdict[task_type]["templates"])
    desc = template.format(obj=obj.lower(), recep=parent.lower(), toggle=toggle.lower(), mrecep="")
    spec = GameSpec(fp.number, task_type, obj, parent, toggle, desc)

    for otype in fp.object_types:
        holders = [r for r in fp.receptacles if L.can_hold(r.type, otype)]
        if otype == obj:
            holders = [r for r in holders if r.type != parent]
            count = rng.randint(2, 3) if task_type == "pick_two_obj_and_place" else rng.randint(1, 3)
        else:
            count = rng.choices((1, 2, 3), weights=(0.7, 0.25, 0.05))[0]
        for k in range(1, count + 1):
            spec.objects.append((f"{otype}|{fp.number}|{k}", otype, rng.choice(holders).id))
    lamp_holders = [r for r in fp.receptacles if r.type in L.LAMP_HOLDERS]
    for lamp in fp.lamps:
        spec.objects.append((f"{lamp}|{fp.number}|1", lamp, rng.choice(lamp_holders).id))
    x, z = rng.choice(fp.free_points)
    spec.agent_location = "loc|%d|%d|%d|30" % (x, z, rng.randrange(4))
    return spec


def problem_text(spec: GameSpec) -> str:
    """The PDDL problem (``initial_state.pddl``) of ``spec`` for ALFWorld's domain."""
    fp = L.load_floor_plan(spec.floor_plan)
    recs = {r.id: r for r in fp.receptacles}
    otypes = sorted({t for _, t, _ in spec.objects} | {spec.object_target} | ({spec.toggle_target} - {""}))
    rtypes = sorted(fp.receptacle_types | ({spec.parent_target} - {""}))
    locations = sorted({r.location for r in fp.receptacles} | {spec.agent_location})
    declared = [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    declared += [c for c in DOMAIN_CONSTANTS if c not in declared]
    declared += [f"{mangle(i)} - object" for i, _, _ in spec.objects]
    declared += [f"{mangle(r.id)} - receptacle" for r in fp.receptacles]
    declared += [f"{mangle(loc)} - location" for loc in locations]

    init = [f"(atLocation agent1 {mangle(spec.agent_location)})"]
    for r in fp.receptacles:
        init.append(f"(receptacleType {mangle(r.id)} {r.type}Type)")
        init.append(f"(receptacleAtLocation {mangle(r.id)} {mangle(r.location)})")
        if r.type in L.OPENABLE_TYPES:
            init.append(f"(openable {mangle(r.id)})")
    for rt in rtypes:
        init += [f"(canContain {rt}Type {ot}Type)" for ot in otypes if L.can_hold(rt, ot)]
    for oid, otype, rid in spec.objects:
        name = mangle(oid)
        init += [f"(objectType {name} {otype}Type)", f"(inReceptacle {name} {mangle(rid)})",
                 f"(objectAtLocation {name} {mangle(recs[rid].location)})"]
        for flag, members in (("pickupable", L.PLACEABLE), ("isReceptacleObject", L.MOVABLE_RECEPTACLES),
                              ("cleanable", L.CLEANABLE), ("heatable", L.HEATABLE), ("coolable", L.COOLABLE),
                              ("sliceable", L.SLICEABLE), ("toggleable", L.TOGGLEABLE)):
            if otype in members:
                init.append(f"({flag} {name})")
    goal = glib.gdict[spec.task_type]["pddl"].replace("#", "-")
    goal = goal.format(obj=spec.object_target, recep=spec.parent_target, toggle=spec.toggle_target, mrecep="")
    indent = "\n        "
    return (
        f"\n(define (problem plan_{spec.task_dir.replace('-', '_')})\n    (:domain alfred)\n    (:objects\n"
        f"        agent1 - agent{indent}{indent.join(declared)}\n    )\n"
        f"    (:init{indent}{indent.join(init)}\n    )\n{goal}"
    )


class Verifier:
    """Solvability check: the bundled planner plans, the text engine replays the plan.

    fast-downward's search (textworld's ``replan``) takes ~10 s on a full kitchen problem
    because of the many distractor objects, so (ours) the planner is given the *relevant*
    problem: the same receptacles, locations and start, and only the instances of the
    target type and the lamps. Distractors never appear in a precondition of a plan that
    does not touch them (the domain has no capacity limits), and the demangled names of the
    kept entities are the same, so the plan is then replayed command by command through the
    *full* game and must be admissible at every step and end in a win: the replay, not the
    argument, is the check.
    """

    def __init__(self) -> None:
        self._plan_env = E.make_pddl_env(admissible_commands=True, policy_commands=True)
        self._play_env = E.make_pddl_env(admissible_commands=True)

    def solve(self, spec: GameSpec) -> list[str] | None:
        """A winning command sequence for the game of ``spec``, else None."""
        relevant = replace(spec, objects=[o for o in spec.objects if o[1] in (spec.object_target, spec.toggle_target)])
        with E.engine_speedups():
            try:
                self._plan_env.load(game_files(relevant, None, {})[0])
                state = self._plan_env.reset()
            except Exception:  # a problem the translator rejects counts as unsolvable
                return None
            plan = list(state["policy_commands"] or [])
            if not plan or state["won"]:
                return None
            self._play_env.load(game_files(spec, None, {})[0])
            state = self._play_env.reset()
            if state["won"]:
                return None
            for command in plan:
                if command not in state["admissible_commands"]:
                    return None
                state, _, _ = self._play_env.step(command)
            return plan if state["won"] else None


def game_files(spec: GameSpec, plan: list[str] | None, extra: dict) -> tuple[dict, dict]:
    """(``game.tw-pddl`` dict, ``traj_data.json`` dict) for ``spec``."""
    game = {
        "pddl_domain": domain_text(),
        "grammar": grammar_text().replace("UNKNOWN GOAL", spec.task_desc),
        "pddl_problem": problem_text(spec),
        "solvable": plan is not None,
        "walkthrough": plan,
    }
    traj = {
        "task_type": spec.task_type,
        "pddl_params": spec.pddl_params(),
        "scene": {"floor_plan": f"FloorPlan{spec.floor_plan}", "scene_num": spec.floor_plan},
        "task_id": extra.get("trial", ""),
        "turk_annotations": {"anns": [{"task_desc": spec.task_desc[:1].upper() + spec.task_desc[1:] + ".",
                                       "high_descs": [], "assignment_id": "paw_lightning"}]},
        "paw_lightning": {"generator_version": GENERATOR_VERSION, "task_desc": spec.task_desc, **extra},
    }
    return game, traj


@dataclass(frozen=True)
class GeneratorConfig:
    """What the generated games depend on (its hash names the cache directory).

    Args:
        seed: master seed.
        task_mix: relative weight per task type (missing types weigh 0); None = uniform.
        ood_floor_plans: floor plans held out for ``eval_out_of_distribution``.
    """

    seed: int = 0
    task_mix: tuple[tuple[str, float], ...] | None = None
    ood_floor_plans: tuple[int, ...] = L.DEFAULT_OOD_FLOOR_PLANS

    def weights(self) -> dict[str, float]:
        mix = dict(self.task_mix) if self.task_mix is not None else {t: 1.0 for t in TASK_TYPES}
        unknown = set(mix) - set(TASK_TYPES)
        if unknown or not any(w > 0 for w in mix.values()) or any(w < 0 for w in mix.values()):
            raise ValueError(f"bad task mix {mix}: weights >= 0 over {TASK_TYPES}, at least one > 0")
        return {t: float(mix.get(t, 0.0)) for t in TASK_TYPES}

    def key(self) -> str:
        blob = json.dumps([GENERATOR_VERSION, self.seed, sorted(self.weights().items()), sorted(self.ood_floor_plans)])
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def floor_plans(self, split: str) -> tuple[int, ...]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
        ood = set(self.ood_floor_plans)
        if split == "eval_out_of_distribution":
            return tuple(sorted(ood))
        return tuple(n for n in L.ALL_FLOOR_PLANS if n not in ood)


def draw_game(config: GeneratorConfig, split: str, index: int, verifier: Verifier) -> tuple[GameSpec, list[str]]:
    """Game ``index`` of ``split``: the first verified draw of its own RNG stream."""
    rng = random.Random(f"paw-alfworld:v{GENERATOR_VERSION}:{config.seed}:{config.key()}:{split}:{index}")
    weights = config.weights()
    types = [t for t in TASK_TYPES if weights[t] > 0]
    plans = [L.load_floor_plan(n) for n in config.floor_plans(split)]
    for _ in range(MAX_DRAWS):
        task_type = rng.choices(types, weights=[weights[t] for t in types])[0]
        candidates = [fp for fp in plans if task_options(fp, task_type)]
        if not candidates:
            continue
        spec = sample_spec(rng, rng.choice(candidates), task_type)
        if spec is None:
            continue
        if split != "eval_out_of_distribution":
            bucket = int(hashlib.sha256(spec.signature().encode()).hexdigest(), 16) % ID_BUCKETS
            if (bucket == 0) != (split == "eval_in_distribution"):
                continue
        plan = verifier.solve(spec)
        if plan is not None:
            return spec, plan
    raise RuntimeError(
        f"no solvable ALFWorld game after {MAX_DRAWS} draws (split {split}, index {index}, mix {weights},"
        f" floor plans {config.floor_plans(split)})"
    )


def default_cache_dir() -> str:
    """``$PAW_LIGHTNING_CACHE/alfworld`` (default ``~/.cache/paw_lightning/alfworld``)."""
    return os.path.join(os.path.expanduser(os.environ.get("PAW_LIGHTNING_CACHE", "~/.cache/paw_lightning")), "alfworld")


class GameStore:
    """Generated games cached on disk, in the official layout, generated on first use.

    ``<cache_dir>/generated-<config key>/json_2.1.1/<split dir>/<task dir>/trial_…/`` holds
    the games (a tree the official-data loader reads as it is);
    ``<cache_dir>/generated-<config key>/index/<split dir>/<i>.json`` maps game ``i`` of a
    split to its directory. Files are written to a temporary name and renamed, so several
    processes may generate the same game at once: they write identical files and the
    first rename wins.
    """

    def __init__(self, config: GeneratorConfig | None = None, cache_dir: str | None = None) -> None:
        self.config = config or GeneratorConfig()
        self.root = os.path.join(cache_dir or default_cache_dir(), f"generated-{self.config.key()}")
        self.data_root = os.path.join(self.root, "json_2.1.1")
        self._verifier: Verifier | None = None

    def _index_file(self, split: str, index: int) -> str:
        return os.path.join(self.root, "index", SPLITS[split], f"{index:06d}.json")

    def entry(self, split: str, index: int) -> dict:
        """``{"gamefile", "task_type", "task_desc"}`` of game ``index`` of ``split`` (generated if missing)."""
        self.config.floor_plans(split)  # validates the split name
        path = self._index_file(split, index)
        if not os.path.exists(path):
            self._generate(split, index)
        with open(path) as f:
            entry = json.load(f)
        entry["gamefile"] = os.path.join(self.data_root, entry["relpath"], "game.tw-pddl")
        return entry

    def ensure(self, split: str, num_games: int, start: int = 0, progress: bool = True) -> None:
        """Generate (or find cached) games ``start … start+num_games-1`` of ``split``."""
        from tqdm.auto import tqdm

        for index in tqdm(range(start, start + num_games), desc=f"alfworld {split}", disable=not progress, unit="game"):
            self.entry(split, index)

    def _generate(self, split: str, index: int) -> None:
        if self._verifier is None:
            self._verifier = Verifier()
        spec, plan = draw_game(self.config, split, index, self._verifier)
        trial = f"trial_G{self.config.key()}_{index:06d}"
        relpath = os.path.join(SPLITS[split], spec.task_dir, trial)
        extra = {"trial": trial, "seed": self.config.seed, "config_key": self.config.key(), "split": split,
                 "index": index}
        game, traj = game_files(spec, plan, extra)
        final = os.path.join(self.data_root, relpath)
        if not os.path.exists(final):
            os.makedirs(os.path.dirname(final), exist_ok=True)
            tmp = f"{final}.tmp{os.getpid()}"
            os.makedirs(tmp, exist_ok=True)
            with open(os.path.join(tmp, "game.tw-pddl"), "w") as f:
                json.dump(game, f)
            with open(os.path.join(tmp, "traj_data.json"), "w") as f:
                json.dump(traj, f, indent=2)
            try:
                os.rename(tmp, final)
            except OSError:  # another process finished first: identical content
                for name in os.listdir(tmp):
                    os.remove(os.path.join(tmp, name))
                os.rmdir(tmp)
        index_file = self._index_file(split, index)
        os.makedirs(os.path.dirname(index_file), exist_ok=True)
        with open(f"{index_file}.tmp{os.getpid()}", "w") as f:
            json.dump({"relpath": relpath, "task_type": spec.task_type, "task_desc": spec.task_desc}, f)
        os.replace(f"{index_file}.tmp{os.getpid()}", index_file)
        config_file = os.path.join(self.root, "config.json")
        if not os.path.exists(config_file):
            with open(f"{config_file}.tmp{os.getpid()}", "w") as f:
                json.dump({"generator_version": GENERATOR_VERSION, "seed": self.config.seed,
                           "task_mix": self.config.weights(), "ood_floor_plans": list(self.config.ood_floor_plans)}, f)
            os.replace(f"{config_file}.tmp{os.getpid()}", config_file)

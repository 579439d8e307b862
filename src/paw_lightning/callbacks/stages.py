"""The stages before RL, keyed by name: the ``stages:`` section of a config.

Each stage is one callback that runs at ``on_fit_start`` of a fresh run; a config sets it by
key (``class_path``/``init_args``, or ``null`` for none), so repeated ``-c`` files merge stage by
stage instead of replacing a whole list::

    stages:
      warmup:      {class_path: paw_lightning.callbacks.BehaviourCloningWarmup, init_args: {…}}
      self_play:   {class_path: paw_lightning.callbacks.SelfPlaySFT, init_args: {…}}
      rwml:        {class_path: paw_lightning.callbacks.RWMLData, init_args: {…}}

They run in the order of :data:`STAGES`, before ``trainer.callbacks`` (a user's own callbacks)
and the CLI's always-present ones. A later file that sets only some ``init_args`` of a stage
changes those keys (jsonargparse merges by key when the class stays; with another
``class_path`` it keeps the keys the new class also takes). When a later ``-c`` file changes,
replaces or removes a stage an earlier file set, the CLI prints one line to stderr
(:func:`stage_replacements`); a ``--stages.…`` override on the command line is the user's
explicit choice and prints nothing.
"""
from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import yaml

from paw_lightning.callbacks.rwml import RWMLData
from paw_lightning.callbacks.self_play import SelfPlaySFT
from paw_lightning.callbacks.warmup import BehaviourCloningWarmup

# key → (callback type, what it is); the order is the order they run, each needing what the ones before leave
STAGES: dict[str, tuple[type, str]] = {
    "warmup": (BehaviourCloningWarmup, "behaviour-cloning warm-up (BehaviourCloningWarmup): SFT on demonstrations in the policy's "
               "format; runs first"),
    "self_play": (SelfPlaySFT, "SPA's self-play world-model SFT (SelfPlaySFT): after the warm-up, whose policy writes SPA's "
                  "format (prompt_style spa) so that its own transcripts can be rewritten"),
    "rwml": (RWMLData, "RWML's data stage (RWMLData): triplets, filter model, subsampling on the world-model task "
             "(data.env=world_model); runs last, playing the policy the stages before it left"),
}
_MISSING = object()


def stage_replacements(config_files: list[str | Path], base: str | Path | None = None) -> list[str]:
    """The lines that say which ``-c`` file changed, replaced or removed a stage an earlier file
    (or ``base``) set, in the order the files apply, e.g.::

        stages.warmup: configs/methods/spa.yaml replaces the one from configs/alfworld.yaml
        stages.warmup: configs/methods/rwml.yaml removes the one from configs/alfworld.yaml
        stages.self_play: configs/methods/spa_sft1.yaml changes epochs of the one from configs/methods/spa.yaml

    ``replaces``: the stage is now the later file's own (another class, or a ``class_path`` with
    every setting as the later file alone gives it; "keeping its …" names the settings that
    came through from the earlier one when the class changed); ``changes k, …``: the settings
    that differ, the rest kept from the earlier file; ``removes``: ``null``. Nothing when a file adds a stage no earlier file
    set, or sets the values it already had. Files that cannot be read are skipped (the parser
    reports them)."""
    current: dict[str, tuple[dict | None, str]] = {}  # stage → (its spec so far, the file that last set it)
    lines = []
    for path in ([base] if base is not None else []) + list(config_files):
        try:
            stages = (yaml.safe_load(Path(path).read_text()) or {}).get("stages") or {}
        except (OSError, ValueError, yaml.YAMLError, AttributeError):
            continue
        if not isinstance(stages, dict):
            continue
        for key, spec in stages.items():
            if key not in STAGES or (spec is not None and not isinstance(spec, dict)):
                continue
            before, source = current.get(key, (None, ""))
            after = _merged(key, before, spec)
            line = _describe(key, before, spec, after, str(path), source)
            if line:
                lines.append(line)
            current[key] = (after, str(path) if after != before else source)
    return lines


def _merged(key: str, before: dict | None, spec: dict | None) -> dict | None:
    """``spec`` applied on ``before`` as jsonargparse merges them (``class_path`` and ``init_args``)."""
    if spec is None:
        return None
    class_path = spec.get("class_path") or (before or {}).get("class_path") or _class_path(STAGES[key][0])
    kept = dict((before or {}).get("init_args") or {})
    if before is not None and _short(class_path) != _short(before["class_path"]):
        accepted = _parameters(class_path)
        kept = {k: v for k, v in kept.items() if k in accepted}
    return {"class_path": class_path, "init_args": {**kept, **(spec.get("init_args") or {})}}


def _describe(key: str, before: dict | None, spec: dict | None, after: dict | None, path: str, source: str) -> str | None:
    if before is None:
        return None
    if after is None:
        return f"stages.{key}: {path} removes the one from {source}"
    previous, result, alone = _filled(before), _filled(after), _filled(_merged(key, None, spec))
    if result == previous:
        return None
    if _short(after["class_path"]) != _short(before["class_path"]) or (spec.get("class_path") and result == alone):
        kept = [k for k, v in result.items() if v != alone.get(k, _MISSING)]
        return f"stages.{key}: {path} replaces the one from {source}" + (f" (keeping its {', '.join(kept)})" if kept else "")
    changed = [k for k, v in result.items() if v != previous.get(k, _MISSING)]
    return f"stages.{key}: {path} changes {', '.join(changed)} of the one from {source}"


def _filled(spec: dict) -> dict[str, object]:
    """A stage's ``init_args`` with its class's defaults for the keys it leaves out."""
    return {**_parameters(spec["class_path"]), **spec["init_args"]}


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _short(class_path: str) -> str:
    """``paw_lightning.callbacks.warmup.BehaviourCloningWarmup`` and ``paw_lightning.callbacks.BehaviourCloningWarmup`` name one class."""
    return class_path.rsplit(".", 1)[-1]


def _parameters(class_path: str) -> dict[str, object]:
    """The ``__init__`` parameters of ``class_path`` with their defaults (``{}`` if it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        return {p.name: p.default for p in inspect.signature(cls).parameters.values() if p.name != "self"}
    except (ImportError, AttributeError, ValueError, TypeError):
        return {}

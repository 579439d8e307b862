"""What a resume changed: the run's config against the one its MLflow run was logged with.

A resume continues one run, and its curves mean one experiment only if its settings stayed.
A later ``trainer.max_epochs`` is the point of most resumes and a new learning rate the advice
for a run stopped by non-finite steps, but another group size, environment or model turns the
run into two experiments drawn as one. So a resume prints the keys it changed, once, and tags
the run with them (``resume.changed``); the run's ``config.yaml`` then holds the new config.
Keys a resume sets itself (``ckpt_path``, the logger's run id) and the length of the run
(``trainer.max_epochs``, ``trainer.max_steps``) are not counted.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import yaml

UNCOUNTED = ("ckpt_path", "trainer.max_epochs", "trainer.max_steps", "trainer.logger")  # keys, or prefixes of keys followed by "."


def flat(tree, prefix: str = "") -> dict[str, object]:
    """A nested mapping as ``{"a.b.c": leaf}`` (lists are leaves)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree} if prefix else {}
    out: dict[str, object] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _counted(key: str) -> bool:
    return not any(key == u or key.startswith(u + ".") for u in UNCOUNTED)


def _short(value) -> str:
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "…"


def changed_settings(before: str, after: str) -> list[str]:
    """``"<key>: <before> → <after>"`` for every counted key whose value differs between two
    configs dumped as YAML (a key only one has counts, as absent)."""
    old, new = flat(yaml.safe_load(before) or {}), flat(yaml.safe_load(after) or {})
    return [f"{key}: {_short(old.get(key, '(absent)'))} → {_short(new.get(key, '(absent)'))}"
            for key in sorted(set(old) | set(new)) if _counted(key) and old.get(key, "(absent)") != new.get(key, "(absent)")]


def logged_config(client, run_id: str, name: str = "config.yaml") -> str | None:
    """The config an MLflow run was logged with, or ``None`` if it has none."""
    if not any(info.path == name for info in client.list_artifacts(run_id)):
        return None
    with tempfile.TemporaryDirectory() as folder:
        return Path(client.download_artifacts(run_id, name, folder)).read_text()

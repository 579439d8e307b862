"""docs/reference/config.md agrees with the parser: every key of ``fit``'s resolved default
configuration has a row in the key sections, every row names a key that exists, and each row's
default is the resolved default (parsed only, nothing instantiated)."""
from __future__ import annotations

import re

import yaml

from paw_lightning.cli import resolved_config

from helpers import ROOT, flatten

ROW = re.compile(r"^\| `([^`]+)` \| `?(.*?)`? \|")


def documented_defaults() -> dict[str, str]:
    """Key → default cell of the key sections' rows (the component tables after them document
    init arguments of classes chosen by ``class_path``, not keys of the default config)."""
    text = (ROOT / "docs/reference/config.md").read_text()
    keys_part = text.split("## Components chosen by `class_path`")[0]
    return {m.group(1): m.group(2) for m in map(ROW.match, keys_part.splitlines()) if m}


def same_default(shown: str, value: object) -> bool:
    """The cell shows the value: as YAML, or a class by its name (``[DurableCheckpointIO]``)."""
    if isinstance(value, list) and all(isinstance(v, dict) and "class_path" in v for v in value):
        return shown == "[" + ", ".join(v["class_path"].rsplit(".", 1)[-1] for v in value) + "]"
    parsed = yaml.safe_load(shown)
    if isinstance(parsed, str) and isinstance(value, float):  # YAML 1.1 reads 1e-08 (no dot) as a string
        parsed = float(parsed)
    return parsed == value


def test_every_key_has_a_row_with_its_default():
    resolved = flatten(resolved_config())
    documented = documented_defaults()
    assert sorted(set(resolved) - set(documented)) == [], "keys without a row in docs/reference/config.md"
    assert sorted(set(documented) - set(resolved)) == [], "rows in docs/reference/config.md for keys the parser does not have"
    wrong = {key: (documented[key], value) for key, value in resolved.items() if not same_default(documented[key], value)}
    assert wrong == {}, "rows whose default is not the resolved default (shown, resolved)"

"""The benchmarks that time the trainer by wrapping its methods still find them (a renamed or
moved method would otherwise break the benchmark only when someone runs it)."""
from __future__ import annotations

import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import epoch_time_split  # noqa: E402


def test_epoch_time_split_wraps_methods_that_exist():
    for owner, name, _, _ in epoch_time_split.HOOKS:
        assert callable(getattr(owner, name, None)), f"{owner.__name__}.{name} is gone: update benchmarks/epoch_time_split.py"

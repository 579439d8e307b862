"""A resume names the settings it changed against the config its MLflow run was logged with;
the run's length and the keys a resume sets itself do not count."""
from __future__ import annotations

from paw_lightning.tracking.resumed_config import changed_settings, flat

BEFORE = """
seed_everything: 0
ckpt_path: null
trainer: {max_epochs: 2, logger: {init_args: {run_id: null}}}
data: {rollout: {groups: 2, group_size: 4, temperature: 1.0}, env_kwargs: {size: 4}}
model: {optimizer: {init_args: {lr: 1.0e-05}}, stages: [a, b]}
"""
AFTER = """
seed_everything: 0
ckpt_path: runs/1/abc/checkpoints/last.ckpt
trainer: {max_epochs: 6, logger: {init_args: {run_id: abc}}}
data: {rollout: {groups: 2, group_size: 8, temperature: 1.0}, env_kwargs: {size: 4, slippery: true}}
model: {optimizer: {init_args: {lr: 1.0e-06}}, stages: [a]}
"""


def test_changed_settings_are_named_with_both_values():
    assert changed_settings(BEFORE, AFTER) == [
        "data.env_kwargs.slippery: (absent) → True",
        "data.rollout.group_size: 4 → 8",
        "model.optimizer.init_args.lr: 1e-05 → 1e-06",
        "model.stages: ['a', 'b'] → ['a']",
    ]
    assert changed_settings(BEFORE, BEFORE) == []
    assert flat({"a": {"b": 1, "c": {}}, "d": [1]}) == {"a.b": 1, "a.c": {}, "d": [1]}

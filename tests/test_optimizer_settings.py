"""A resume keeps the checkpoint's optimizer moments but the config's settings: Lightning's
restore would bring back the old learning rate of a run resumed with a new one."""
from __future__ import annotations

import torch

from paw_lightning.training import optimizer_settings


def test_the_configs_settings_replace_the_restored_ones_and_the_moments_stay():
    weight = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    old = torch.optim.AdamW([weight], lr=1e-3, weight_decay=0.0)
    weight.grad = torch.tensor([0.5, 0.25])
    old.step()
    saved = old.state_dict()

    new = torch.optim.AdamW([weight], lr=1e-4, weight_decay=0.1)  # the resumed run's config
    settings = optimizer_settings.configured(new)
    new.load_state_dict(saved)  # what Lightning's restore does
    assert new.param_groups[0]["lr"] == 1e-3 and new.param_groups[0]["weight_decay"] == 0.0
    changes = optimizer_settings.reapply(new, settings)
    assert changes == ["lr 0.001 → 0.0001", "weight_decay 0.0 → 0.1"]
    assert new.param_groups[0]["lr"] == 1e-4 and new.param_groups[0]["weight_decay"] == 0.1
    state = new.state[weight]  # Adam's moments after one step of gradient g: m = (1 − β1)·g, v = (1 − β2)·g²
    torch.testing.assert_close(state["exp_avg"], 0.1 * torch.tensor([0.5, 0.25]))
    torch.testing.assert_close(state["exp_avg_sq"], 0.001 * torch.tensor([0.25, 0.0625]))
    assert float(state["step"]) == 1.0
    assert optimizer_settings.reapply(new, settings) == []  # nothing left to change


def test_a_second_parameter_group_is_named():
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    settings = optimizer_settings.configured(optimizer)
    optimizer.param_groups[1]["lr"] = 0.05
    assert optimizer_settings.reapply(optimizer, settings) == ["lr 0.05 → 0.5 (parameter group 1)"]

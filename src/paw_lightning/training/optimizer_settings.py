"""The optimizer's hyper-parameters come from the config, also on a resume.

Lightning's restore loads a checkpoint's optimizer state whole: Adam's moments and step counts,
and each parameter group's settings (``lr``, ``betas``, ``weight_decay``, …). A run resumed with
another learning rate (the advice for a run that stopped on non-finite steps) would silently
train on with the old one. :func:`configured` records the groups' settings as
``configure_optimizers`` built them; :func:`reapply` writes them back after the restore, keeping
the checkpoint's moments and step counts, and names what changed.
"""
from __future__ import annotations

import copy

import torch


def configured(optimizer: torch.optim.Optimizer) -> list[dict]:
    """Each parameter group's settings (everything but its parameters), copied."""
    return [{key: copy.deepcopy(value) for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
    return a == b


def reapply(optimizer: torch.optim.Optimizer, settings: list[dict]) -> list[str]:
    """Set each group's settings back to ``settings`` (from :func:`configured`); returns one
    ``"<key> <restored> → <configured>"`` for each setting the restore had changed."""
    changes = []
    for i, (group, wanted) in enumerate(zip(optimizer.param_groups, settings)):
        for key, value in wanted.items():
            if key in group and not _same(group[key], value):
                changes.append(f"{key} {group[key]} → {value}" + (f" (parameter group {i})" if len(settings) > 1 else ""))
                group[key] = copy.deepcopy(value)
    return changes

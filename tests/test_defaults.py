"""One home per default: a ``PaWModule`` and a ``RolloutDataModule`` built in Python train what
``python -m paw_lightning fit`` with no ``-c`` trains. The recipe's model and data defaults live
in the classes' signatures; the base config holds only what has no Python home (the trainer's
recipe settings and the seed)."""
from __future__ import annotations

from pathlib import Path

import torch
import yaml

from paw_lightning.cli import BASE_CONFIG, PawCLI
from paw_lightning.data import RolloutDataModule
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule


def hyperparameters(obj, depth: int = 0):
    """Every public setting of an object, recursively, as plain data (classes by name)."""
    if isinstance(obj, (int, float, str, bool, type(None))):
        return obj
    if isinstance(obj, (list, tuple)):
        return [hyperparameters(o, depth + 1) for o in obj]
    if isinstance(obj, dict):
        return {str(k): hyperparameters(v, depth + 1) for k, v in sorted(obj.items())}
    assert depth < 5, f"unexpectedly deep setting {obj!r}"
    settings = {k: v for k, v in vars(obj).items() if not k.startswith("_") and k != "last_diagnostics"}
    return {"class": type(obj).__name__, **{k: hyperparameters(v, depth + 1) for k, v in sorted(settings.items())}}


def trained(module: PaWModule, data: RolloutDataModule) -> dict:
    """What a fit with these two objects trains: objectives, optimizer, update and data settings."""
    optimizer = module.optimizer_factory([torch.nn.Parameter(torch.zeros(1))])
    settings = ("score_batch_size", "wm_eval_samples", "micro_batch_tokens", "micro_batch_rows", "max_grad_norm",
                "gather_weights_for_generation", "old_logprobs", "init_weights")
    return {
        "policy_objective": hyperparameters(module.policy_objective),
        "world_model_objective": hyperparameters(module.world_model_objective),
        "critic": hyperparameters(module.critic),
        "engine": hyperparameters(module.engine),
        "lm": hyperparameters(module.lm_config),
        "optimizer": [type(optimizer).__name__, hyperparameters(optimizer.defaults)],
        "module": {key: hyperparameters(getattr(module, key)) for key in settings},
        "data": {key: hyperparameters(getattr(data, key)) for key in ("env_name", "env_kwargs", "rollout", "evaluation", "ppo_epochs", "mini_batch_size", "env_workers", "env_timeout")},
    }


def test_python_defaults_train_what_fit_without_a_config_trains(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    python = trained(PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir))), RolloutDataModule())
    cli = PawCLI(args=[f"--model.lm.name_or_path={tiny_model_dir}"], run=False)
    assert trained(cli.model, cli.datamodule) == python
    # and it is the published PaW recipe, not vanilla RL
    assert python["world_model_objective"]["class"] == "ClippedMAE" and python["policy_objective"]["advantage"]["class"] == "GRPO"
    assert python["optimizer"][1]["lr"] == 1e-4 and python["module"]["max_grad_norm"] == 1.0


def test_a_default_object_is_never_shared_between_modules(tiny_model_dir):
    lm = LMConfig(name_or_path=str(tiny_model_dir))
    first, second = PaWModule(lm=lm), PaWModule(lm=lm)
    assert first.policy_objective is not second.policy_objective
    assert first.world_model_objective is not second.world_model_objective
    assert first.lm_config is not second.lm_config
    assert RolloutDataModule().rollout is not RolloutDataModule().rollout


def test_the_base_config_restates_no_python_default():
    base = yaml.safe_load(Path(BASE_CONFIG).read_text())
    assert set(base) <= {"seed_everything", "trainer"}, f"model and data defaults live in the signatures, not in {BASE_CONFIG.name}: {sorted(base)}"

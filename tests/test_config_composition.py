"""Every overlay composes with every environment's config and changes only the keys it declares.

An algorithm overlay (``configs/algorithms/``) owns the advantage estimator (and PPO's critic), an objective
overlay (``configs/objectives/``) the world-model objective (with its balancer), a scale overlay
(``configs/scale/``) trainer, batch, precision and model-size keys. If each overlay changes
only its own keys and no two families declare the same key, any combination
``-c <env> -c <algorithm> -c <objective> -c <scale>`` means the same in any order: nothing an
earlier overlay set is silently undone by a later one (e.g. an algorithm overlay turning the
KL term back on). Parse only (``--print_config``): nothing is instantiated.
"""
from __future__ import annotations

import itertools

import pytest
import yaml

from paw_lightning.cli import resolved_config

from helpers import ROOT

ENVS = {"alfworld": ["configs/alfworld.yaml"], "frozenlake": ["configs/frozenlake.yaml"],
        "sokoban": ["configs/frozenlake.yaml", "configs/sokoban.yaml"], "sudoku": ["configs/frozenlake.yaml", "configs/sudoku.yaml"], "webshop": ["configs/webshop.yaml"],
        "search_qa": ["configs/search_qa.yaml"]}
FAMILIES = {family: sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs" / family).glob("*.yaml"))
            for family in ("algorithms", "objectives", "scale")}
OVERLAYS = [path for paths in FAMILIES.values() for path in paths]
# keys a family may declare (dotted prefixes)
FAMILY_KEYS = {
    "algorithms": ["model.policy_objective.class_path", "model.policy_objective.init_args.advantage", "model.critic"],
    "objectives": ["model.world_model_objective"],
    "scale": ["trainer", "model.lm", "model.optimizer", "model.micro_batch_tokens", "model.micro_batch_rows", "model.score_batch_size",
              "model.gather_weights_for_generation", "model.engine", "data.rollout.groups", "data.rollout.group_size", "data.rollout.max_steps",
              "data.rollout.max_new_tokens", "data.mini_batch_size", "data.evaluation.groups", "data.evaluation.group_size"],
}


def flatten(tree, prefix: str = "") -> dict[str, object]:
    """Nested dicts → {dotted key: leaf} (lists and None are leaves)."""
    if not isinstance(tree, dict) or not tree:
        return {prefix: tree}
    return {k: v for key, value in tree.items() for k, v in flatten(value, f"{prefix}.{key}" if prefix else key).items()}


def resolved(*configs: str) -> dict[str, object]:
    return flatten(resolved_config(*(ROOT / path for path in configs)))


def owned_prefixes(overlay: str) -> list[str]:
    """The keys an overlay declares; one that sets a ``class_path`` owns that whole object
    (switching the class replaces its ``init_args``)."""
    declared = flatten(yaml.safe_load((ROOT / overlay).read_text()))
    return [*declared, *(key.removesuffix(".class_path") for key in declared if key.endswith(".class_path"))]


def is_under(key: str, prefixes: list[str]) -> bool:
    return any(key == p or key.startswith(p + ".") for p in prefixes)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_declares_only_its_own_keys(family):
    assert FAMILIES[family], f"no overlays in configs/{family}"
    for overlay in FAMILIES[family]:
        declared = flatten(yaml.safe_load((ROOT / overlay).read_text()))
        stray = [key for key in declared if not is_under(key, FAMILY_KEYS[family])]
        assert not stray, f"{overlay} sets keys outside its family ({family}): {stray}"


@pytest.mark.slow
@pytest.mark.parametrize("env", ENVS)
def test_every_overlay_changes_only_its_own_keys(env):
    base = resolved(*ENVS[env])
    for overlay in OVERLAYS:
        composed = resolved(*ENVS[env], overlay)
        changed = {key for key in base.keys() | composed.keys() if base.get(key, "<unset>") != composed.get(key, "<unset>")}
        foreign = sorted(key for key in changed if not is_under(key, owned_prefixes(overlay)))
        assert not foreign, f"-c {' -c '.join(ENVS[env])} -c {overlay} changes keys it does not declare: {foreign}"


@pytest.mark.slow
def test_overlays_compose_the_same_in_any_order():
    """One overlay of each family on the main job: every order gives the same config, with
    the algorithm's estimator, the objective's world model and the scale's trainer all there."""
    stack = ["configs/algorithms/rloo.yaml", "configs/objectives/vanilla.yaml", "configs/scale/gpu1.yaml"]
    configs = [resolved(*ENVS["alfworld"], *order) for order in itertools.permutations(stack)]
    assert all(config == configs[0] for config in configs[1:])
    config = configs[0]
    assert config["model.policy_objective.init_args.advantage.class_path"].endswith("RLOO")
    assert config["model.policy_objective.init_args.kl_coef"] == 0.0  # the main job's no-KL recipe survives the algorithm overlay
    assert config["model.world_model_objective"] is None and config["trainer.precision"] == "bf16-mixed"
    assert config["model.micro_batch_tokens"] == 16384 and config["model.micro_batch_rows"] is None  # a GPU batches the CPU recipe's one-sample micro-batches


def test_environment_keyword_overrides_are_typed_values_not_strings():
    """``--data.env_kwargs.size=5`` must reach the environment as the number 5 (a string '5'
    failed deep inside the environment), booleans and JSON as what they say."""
    data = resolved_config(ROOT / "configs/frozenlake.yaml", overrides=(
        "--data.env_kwargs.size=5", "--data.env_kwargs.slippery=true", "--data.env_kwargs.hole_prob=0.3", "--data.evaluation.env_kwargs.size=3"))["data"]
    assert data["env_kwargs"] == {"size": 5, "slippery": True, "hole_prob": 0.3}
    assert data["evaluation"]["env_kwargs"] == {"size": 3}
    rwml = resolved_config(ROOT / "configs/frozenlake.yaml", ROOT / "configs/methods/rwml.yaml", overrides=('--data.env_kwargs.source_kwargs={"size": 3}',))["data"]
    assert rwml["env_kwargs"]["source_kwargs"] == {"size": 3}

"""Every overlay composes with every environment's config and changes only the keys it declares.

An algorithm overlay (``configs/algorithms/``) owns the advantage estimator (and PPO's critic), the
policy loss's clip, KL, aggregation and ratio settings and the rollout's DAPO switches (``FAMILY_KEYS``), an objective
overlay (``configs/objectives/``) the world-model objective (with its balancer), a scale overlay
(``configs/scale/``) trainer, batch, precision and model-size keys. If each overlay changes
only its own keys and no two families declare the same key, any combination
``-c <env> -c <algorithm> -c <objective> -c <scale>`` means the same in any order: nothing an
earlier overlay set is silently undone by a later one (e.g. an algorithm overlay turning the
KL term back on). Parse only (``--print_config``): nothing is instantiated.

Every YAML file under ``configs/`` resolves on the config chain of the command in its header
(an environment config alone; an overlay on the environment it names, ``configs/<env>.yaml``
read as FrozenLake's). Environment configs set only what base.yaml's header allows. Stages
(``stages:``) merge by name: an overlay keeps the environment's warm-up unless it sets one, and
then one stderr line names the stage, the file that changed it and the file it came from.
"""
from __future__ import annotations

import itertools
import re

import pytest
import yaml

from paw_lightning.callbacks.stages import STAGES, stage_replacements
from paw_lightning.cli import BASE_CONFIG, resolved_config

from helpers import ROOT, flatten

ENVS = {"alfworld": ["configs/alfworld.yaml"], "frozenlake": ["configs/frozenlake.yaml"],
        "sokoban": ["configs/frozenlake.yaml", "configs/sokoban.yaml"], "sudoku": ["configs/frozenlake.yaml", "configs/sudoku.yaml"], "webshop": ["configs/webshop.yaml"],
        "search_qa": ["configs/search_qa.yaml"]}
FAMILIES = {family: sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs" / family).glob("*.yaml"))
            for family in ("algorithms", "objectives", "scale")}
OVERLAYS = [path for paths in FAMILIES.values() for path in paths]
# keys a family may declare (dotted prefixes)
FAMILY_KEYS = {
    "algorithms": ["model.policy_objective.class_path", "model.policy_objective.init_args.advantage", "model.critic",
                   "model.policy_objective.init_args.clip_low", "model.policy_objective.init_args.clip_high",  # DAPO's clip-higher
                   "model.policy_objective.init_args.kl_coef", "model.policy_objective.init_args.aggregation",
                   "data.rollout.dynamic_sampling", "data.rollout.mask_truncated",
                   "model.policy_objective.init_args.importance_sampling", "model.policy_objective.init_args.loss_norm_tokens",  # GSPO, Dr. GRPO
                   "model.policy_objective.init_args.clip_ratio_c"],
    "objectives": ["model.world_model_objective"],
    "scale": ["trainer", "stages.warmup", "model.lm", "model.optimizer", "model.micro_batch_tokens", "model.micro_batch_rows", "model.score_batch_size",
              "model.gather_weights_for_generation", "model.engine", "data.rollout.groups", "data.rollout.group_size", "data.rollout.max_steps",
              "data.rollout.max_new_tokens", "data.mini_batch_size", "data.evaluation.groups", "data.evaluation.group_size"],
}


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


# ----------------------------------------------------------- every file under configs/
CONFIG_FILES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml"))
# what base.yaml's header lets an environment config set (dotted prefixes)
ENV_CONFIG_KEYS = [
    "data.env", "data.env_kwargs", "data.evaluation.env_kwargs", "data.rollout.max_steps", "data.rollout.max_new_tokens",
    "data.rollout.history_length", "data.rollout.prompt_style", "data.rollout.invalid_penalty",
    "data.rollout.groups", "data.rollout.group_size", "data.mini_batch_size", "data.evaluation.groups", "trainer.max_epochs",
    "trainer.check_val_every_n_epoch", "model.lm.dtype", "model.micro_batch_tokens", "model.micro_batch_rows", "model.score_batch_size",
    "model.engine", "model.old_logprobs",
    "trainer.default_root_dir", "trainer.logger.init_args.experiment_name",
    "stages.warmup",
    "model.policy_objective.init_args.advantage", "model.policy_objective.init_args.kl_coef",
]
ENV_CONFIGS = sorted({paths[-1] for paths in ENVS.values()})


def header_chain(path: str) -> list[str]:
    """The ``-c`` files, up to and including ``path``, of the first ``paw_lightning … fit`` command
    in its header that names it (``configs/<env>.yaml`` read as ``configs/frozenlake.yaml``)."""
    lines = [""]
    for line in (ROOT / path).read_text().splitlines():
        if not line.startswith("#"):
            break
        lines[-1] += " " + line.lstrip("#").strip()
        if not lines[-1].endswith("\\"):  # a command continued on the next line
            lines.append("")
    for line in lines:
        for command in line.split("paw_lightning fit")[1:]:
            files = [f.replace("<env>", "frozenlake") for f in re.findall(r"-c (configs/\S+?\.yaml)", command)]
            if path in files:
                return files[: files.index(path) + 1]
    raise AssertionError(f"{path}: its header has no `python -m paw_lightning fit … -c {path}` command")


@pytest.mark.parametrize("path", CONFIG_FILES)
def test_every_config_file_resolves_on_the_config_its_header_names(path):
    chain = header_chain(path)
    config = resolved_config(*(ROOT / p for p in chain))
    assert set(config["stages"]) == set(STAGES)
    declared = yaml.safe_load((ROOT / path).read_text()) or {}
    for key, spec in (declared.get("stages") or {}).items():  # what the file sets is what runs
        if spec is None:
            assert config["stages"][key] is None, f"{path}: stages.{key}"
        else:
            for name, value in (spec.get("init_args") or {}).items():
                assert config["stages"][key]["init_args"][name] == value, f"{' + '.join(chain)}: stages.{key}.init_args.{name}"


def test_every_config_file_is_covered():
    """The composition tests see every file under configs/, and no stage lives in trainer.callbacks."""
    assert {p.split("/")[1] for p in CONFIG_FILES if p.count("/") == 2} == {"algorithms", "learning", "methods", "objectives", "scale"}
    assert {"configs/warmup.yaml", "configs/learning/frozenlake.yaml", "configs/methods/spa.yaml"} <= set(CONFIG_FILES)
    for path in CONFIG_FILES:
        trainer = (yaml.safe_load((ROOT / path).read_text()) or {}).get("trainer") or {}
        assert "callbacks" not in trainer, f"{path}: stages go under stages:, not trainer.callbacks"


@pytest.mark.parametrize("path", ENV_CONFIGS)
def test_environment_configs_set_only_what_base_yaml_allows(path):
    declared = flatten(yaml.safe_load((ROOT / path).read_text()))
    stray = [key for key in declared if not is_under(key, ENV_CONFIG_KEYS)]
    assert not stray, f"{path} sets keys base.yaml's header does not allow an environment config: {stray}"


# ------------------------------------------------------------------------- stages
def stage_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("stages.")]


def test_the_base_recipe_has_no_stages(capsys):
    assert "stages" not in yaml.safe_load(BASE_CONFIG.read_text())
    assert resolved_config()["stages"] == {key: None for key in STAGES}
    assert stage_lines(capsys.readouterr().err) == []


def test_alfworld_plus_spa_runs_spas_stages_and_says_it_replaced_the_warm_up(capsys):
    alfworld, spa = ROOT / "configs/alfworld.yaml", ROOT / "configs/methods/spa.yaml"
    stages = resolved_config(alfworld, spa)["stages"]
    assert stages["warmup"]["init_args"]["source"] == "random_moving"  # SPA's format warm-up, in SPA's format
    assert stages["warmup"] == resolved_config(ROOT / "configs/frozenlake.yaml", spa)["stages"]["warmup"]  # nothing of ALFWorld's is left
    assert stages["self_play"]["class_path"].endswith("SelfPlaySFT") and stages["rwml"] is None
    assert stage_lines(capsys.readouterr().err) == [f"stages.warmup: {spa} replaces the one from {alfworld}"]


def test_alfworld_plus_rwml_removes_the_warm_up_and_says_so(capsys):
    """RWML's fit plays the world-model task, where the environment's warm-up cannot run (its
    triplets are written by the RWML stage), so rwml.yaml turns it off, in one printed line."""
    alfworld, rwml = ROOT / "configs/alfworld.yaml", ROOT / "configs/methods/rwml.yaml"
    stages = resolved_config(alfworld, rwml)["stages"]
    assert stages["warmup"] is None and stages["self_play"] is None and stages["rwml"]["class_path"].endswith("RWMLData")
    assert stages["rwml"]["init_args"]["seed"] is None  # follows the run's seed (a list merge once carried the warm-up's seed 0 over)
    assert stage_lines(capsys.readouterr().err) == [f"stages.warmup: {rwml} removes the one from {alfworld}"]


def test_an_overlay_that_adds_stages_keeps_the_rest_and_prints_nothing(capsys):
    frozenlake = resolved_config(ROOT / "configs/frozenlake.yaml", ROOT / "configs/methods/spa.yaml")["stages"]
    assert frozenlake["warmup"] is not None and frozenlake["self_play"] is not None
    alfworld = resolved_config(ROOT / "configs/alfworld.yaml", ROOT / "configs/algorithms/rloo.yaml", ROOT / "configs/objectives/vanilla.yaml")["stages"]
    assert alfworld["warmup"]["init_args"]["source"] == "expert" and alfworld["warmup"]["init_args"]["cache_dir"] == "runs/warmup-cache"
    assert stage_lines(capsys.readouterr().err) == []


def test_an_overlay_changes_only_the_stage_keys_it_sets():
    """spa_sft1.yaml and rwml_no_subsampling.yaml set one key of a stage; the line names it."""
    spa, sft1 = "configs/methods/spa.yaml", "configs/methods/spa_sft1.yaml"
    assert stage_replacements(["configs/frozenlake.yaml", spa, sft1]) == [f"stages.self_play: {sft1} changes epochs of the one from {spa}"]
    rwml, ablation = "configs/methods/rwml.yaml", "configs/methods/rwml_no_subsampling.yaml"
    assert stage_replacements([rwml, ablation]) == [f"stages.rwml: {ablation} changes keep_easy of the one from {rwml}"]
    assert stage_replacements(["configs/alfworld.yaml", "configs/scale/paper.yaml"]) == [
        "stages.warmup: configs/scale/paper.yaml removes the one from configs/alfworld.yaml"]


def test_stage_lines_name_what_a_later_file_did(tmp_path):
    def overlay(name: str, text: str) -> str:
        (tmp_path / name).write_text(text)
        return str(tmp_path / name)

    env = overlay("env.yaml", "stages:\n  warmup:\n    class_path: paw_lightning.callbacks.BehaviourCloningWarmup\n    init_args: {epochs: 2, seed: 3}\n")
    same = overlay("same.yaml", "stages:\n  warmup:\n    init_args: {epochs: 2}\n")
    other = overlay("other.yaml", "stages:\n  warmup:\n    class_path: paw_lightning.callbacks.SelfPlaySFT\n    init_args: {episodes: 4}\n")
    assert stage_replacements([env, same]) == []  # the values it already had
    assert stage_replacements([env, other]) == [f"stages.warmup: {other} replaces the one from {env} (keeping its epochs, seed)"]
    assert stage_replacements([other]) == []  # a stage no earlier file set


def test_a_command_line_override_of_a_stage_prints_nothing(capsys):
    stages = resolved_config(ROOT / "configs/alfworld.yaml", overrides=("--stages.warmup=null",))["stages"]
    assert stages["warmup"] is None
    assert stage_lines(capsys.readouterr().err) == []


def test_the_trainer_runs_the_stages_first_in_their_order():
    """Stages go first, in STAGES order (warm-up, self-play SFT, RWML's data stage), then the
    user's trainer.callbacks, then the CLI's always-present callbacks."""
    from jsonargparse import Namespace
    from lightning.pytorch import Callback

    from paw_lightning.callbacks import BehaviourCloningWarmup, RWMLData
    from paw_lightning.cli import PawCLI

    cli = PawCLI.__new__(PawCLI)  # only what _instantiate_trainer reads: no parse, no model
    warmup, rwml, users, always = BehaviourCloningWarmup(), RWMLData(), Callback(), Callback()
    cli.subcommand, cli.trainer_defaults, cli.save_config_callback = "fit", {}, None
    cli.config_init = Namespace(fit=Namespace(stages=Namespace(rwml=rwml, self_play=None, warmup=warmup)))
    cli.trainer_class = lambda **kwargs: kwargs
    trainer = cli._instantiate_trainer({"callbacks": [users], "enable_progress_bar": False}, [always])
    assert list(STAGES) == ["warmup", "self_play", "rwml"]
    assert trainer["callbacks"] == [warmup, rwml, users, always]

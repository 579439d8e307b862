"""SPA's ablation overlays (configs/methods/spa_*.yaml) change only what they name."""
from __future__ import annotations

import pytest

from paw_lightning.cli import resolved_config
from paw_lightning.envs import make_env_factory

from helpers import ROOT

GRID_GAMES = {"frozenlake": ["configs/frozenlake.yaml"], "sokoban": ["configs/frozenlake.yaml", "configs/sokoban.yaml"],
              "sudoku": ["configs/frozenlake.yaml", "configs/sudoku.yaml"]}
SPA = "configs/methods/spa.yaml"


def resolved(*paths: str) -> dict:
    return resolved_config(*(ROOT / p for p in paths))


def first_observation(data: dict, seed: int) -> str:
    return make_env_factory(data["env"], **data["env_kwargs"])().reset(seed)[0]


@pytest.mark.parametrize("game", GRID_GAMES)
def test_no_coordinates_drops_only_the_sentence(game):
    """The same tasks, the grid unchanged, the coordinate sentence gone."""
    with_sentence = resolved(*GRID_GAMES[game], SPA)["data"]
    without = resolved(*GRID_GAMES[game], SPA, "configs/methods/spa_no_coordinates.yaml")["data"]
    assert without["env"] == with_sentence["env"] == game
    for seed in range(5):
        full, grid = first_observation(with_sentence, seed), first_observation(without, seed)
        assert " at (" in full and " at (" not in grid
        assert full.startswith(grid + "\n")


def test_randsft_replaces_self_play_with_random_action_sft():
    stages = resolved("configs/frozenlake.yaml", SPA, "configs/methods/spa_randsft.yaml")["stages"]
    assert stages["self_play"] is None and stages["rwml"] is None
    warmup = stages["warmup"]
    assert warmup["class_path"] == "paw_lightning.callbacks.BehaviourCloningWarmup"
    assert warmup["init_args"]["source"] == "random_valid" and warmup["init_args"]["epochs"] == 5
    assert warmup["init_args"]["cache_dir"] is None  # not SPA's cached format warm-up


def test_spa_warms_the_format_up_on_moves_that_change_the_state():
    warmup = resolved("configs/frozenlake.yaml", SPA)["stages"]["warmup"]
    assert warmup["class_path"].endswith("BehaviourCloningWarmup") and warmup["init_args"]["source"] == "random_moving"


def test_sft1_changes_only_the_self_play_epochs():
    spa = resolved("configs/frozenlake.yaml", SPA)
    one = resolved("configs/frozenlake.yaml", SPA, "configs/methods/spa_sft1.yaml")
    assert one["stages"]["self_play"]["init_args"]["epochs"] == 1 and spa["stages"]["self_play"]["init_args"]["epochs"] == 5
    one["stages"]["self_play"]["init_args"]["epochs"] = 5
    assert one == spa

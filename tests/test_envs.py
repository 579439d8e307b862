"""The grid games (FrozenLake, Sokoban) and the environment registry."""
from __future__ import annotations

import functools
import inspect
import pickle
import sys
import types
from collections import Counter

import pytest

from paw_lightning.envs import EnvError, FrozenLakeEnv, SokobanEnv, TextEnv, make_env_factory


def play(env, plan: list[str]) -> tuple[float, bool, dict]:
    """Step through ``plan``; every step but the last must leave the episode running."""
    total, done, info = 0.0, False, {}
    for t, action in enumerate(plan):
        assert not done, f"episode ended early at step {t}"
        _, reward, done, info = env.step(action)
        assert info["action_recognised"]
        total += reward
    return total, done, info


@pytest.mark.parametrize("make", [FrozenLakeEnv, SokobanEnv])
def test_generation_is_seeded(make):
    env = make()
    maps = [env.reset(seed)[0] for seed in range(60)]
    assert maps == [env.reset(seed)[0] for seed in range(60)]
    assert [make().reset(seed)[0] for seed in range(5)] == maps[:5]  # fresh instance, same maps
    assert len(set(maps)) >= 55


@pytest.mark.parametrize(
    "make",
    [
        FrozenLakeEnv,
        functools.partial(FrozenLakeEnv, size=6, hole_prob=0.35),
        SokobanEnv,
        functools.partial(SokobanEnv, num_boxes=2),
    ],
)
def test_every_level_is_solvable_and_the_plan_wins(make):
    env = make()
    assert isinstance(env, TextEnv)
    for seed in range(60):
        obs, info = env.reset(seed)
        assert info["admissible_actions"] == ["Up", "Down", "Left", "Right"] and not info["won"]
        assert "X" in obs if isinstance(env, SokobanEnv) else "P" in obs
        plan = env.solve()
        assert plan, f"seed {seed}: a fresh level needs at least one move"
        total, done, info = play(env, plan)
        assert (total, done, info["won"]) == (1.0, True, True)
        assert env.solve() == []
        with pytest.raises(EnvError):
            env.step("Up")


def test_frozenlake_render_and_coordinates():
    env = FrozenLakeEnv()
    obs, info = env.load_map(["P_O_", "____", "_O__", "___G"])
    holes = "goal (G) is at (3,3); holes (O) are at (0,2), (2,1)."
    assert obs == f"P_O_\n____\n_O__\n___G\nPlayer (P) is at (0,0); {holes}"
    assert "(row,col), zero-indexed from the top-left" in info["task"]
    assert env.step("Up")[0] == obs  # the border leaves the player in place
    obs, reward, done, info = env.step("right")
    assert obs.startswith("_P") and (reward, done) == (0.0, False)
    obs, reward, done, info = env.step("Right")
    assert obs == f"__X_\n____\n_O__\n___G\nPlayer (X) is at (0,2); {holes}"
    assert (reward, done, info["won"]) == (0.0, True, False)


def test_frozenlake_goal_renders_check():
    env = FrozenLakeEnv()
    env.load_map(["_O", "PG"])
    obs, reward, done, info = env.step("Right")
    assert obs == "_O\n_√\nPlayer (√) is at (1,1); goal (G) is at (1,1); hole (O) is at (0,1)."
    assert (reward, done, info["won"]) == (1.0, True, True)


def test_slippery_is_reproducible_and_varies_across_episodes():
    env = FrozenLakeEnv(slippery=True)

    def trajectory(seed, episode):
        env.reset(seed, episode)
        taken = []
        for _ in range(8):
            obs, _, done, info = env.step("Down")
            taken.append((obs, info["executed_action"]))
            if done:
                break
        return taken

    runs = {episode: trajectory(3, episode) for episode in range(8)}
    assert runs == {episode: trajectory(3, episode) for episode in range(8)}
    assert len({str(run) for run in runs.values()}) > 1
    assert {env.reset(3, e)[0] for e in range(8)} == {env.reset(3, 0)[0]}  # one map per group


def test_slippery_directions_follow_gym_probabilities():
    env = FrozenLakeEnv(slippery=True)
    taken = Counter()
    for episode in range(600):
        env.load_map(["___", "_P_", "__G"], episode=episode)
        taken[env.step("Up")[3]["executed_action"]] += 1
    assert set(taken) == {"Up", "Left", "Right"}
    assert all(150 <= n <= 250 for n in taken.values()), taken


def test_sokoban_render_and_push_rules():
    env = SokobanEnv()
    obs, info = env.load_map(["######", "#____#", "#_X__#", "#_P__#", "#_O__#", "######"])
    assert obs == (
        "######\n#____#\n#_X__#\n#_P__#\n#_O__#\n######\n"
        "Player (P) is at (3,2); box (X) is at (2,2); target (O) is at (4,2)."
    )
    assert "(row,col), zero-indexed" in info["task"]
    assert env.step("Up")[0].startswith("######\n#_X__#\n#_P__#\n")  # push
    blocked = env.step("Up")[0]  # the box is against the wall: nothing moves
    assert blocked.startswith("######\n#_X__#\n#_P__#\n")
    env.step("Down")
    obs, reward, done, _ = env.step("Down")  # the player stands on the target
    assert obs == (
        "######\n#_X__#\n#____#\n#____#\n#_S__#\n######\n"
        "Player (S) is at (4,2); box (X) is at (1,2); target (O) is at (4,2)."
    )
    assert (reward, done) == (0.0, False)
    with pytest.raises(EnvError, match="cannot be solved"):
        env.solve()  # the box is stuck in a corner


def test_sokoban_box_cannot_push_box_and_wins_on_target():
    env = SokobanEnv()
    env.load_map(["#######", "#PXX_O#", "#####O#", "#######"])
    assert env.step("Right")[0].startswith("#######\n#PXX_O#")  # two boxes in a row do not move
    env.load_map(["#####", "#PXO#", "#####"])
    obs, reward, done, info = env.step("Right")
    assert obs == (
        "#####\n#_P√#\n#####\n"
        "Player (P) is at (1,2); box (√) is at (1,3); target (O) is at (1,3)."
    )
    assert (reward, done, info["won"]) == (1.0, True, True)


@pytest.mark.parametrize("make", [FrozenLakeEnv, SokobanEnv])
def test_unrecognised_action_changes_nothing(make):
    env = make()
    first, _ = env.reset(1)
    obs, reward, done, info = env.step("jump over it")
    assert obs == f"Invalid action 'jump over it': valid actions are Up, Down, Left, Right.\n{first}"
    assert (reward, done, info["action_recognised"], info["won"]) == (0.0, False, False, False)
    assert env.step("  " + env.solve()[0].upper() + "\n")[3]["action_recognised"]


def test_bad_maps_and_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown symbol"):
        FrozenLakeEnv().load_map(["P?", "_G"])
    with pytest.raises(ValueError, match="as many targets as boxes"):
        SokobanEnv().load_map(["#####", "#PXX#", "#O__#", "#####"])
    with pytest.raises(ValueError, match="size"):
        SokobanEnv(size=4)
    with pytest.raises(EnvError):
        FrozenLakeEnv().step("Up")


def test_registry_builds_picklable_factories():
    factory = make_env_factory("frozenlake", size=5, slippery=True)
    env = pickle.loads(pickle.dumps(factory))()
    assert isinstance(env, FrozenLakeEnv) and (env.size, env.slippery) == (5, True)
    dotted = make_env_factory("paw_lightning.envs.sokoban.SokobanEnv", num_boxes=2)()
    assert isinstance(dotted, SokobanEnv) and dotted.num_boxes == 2


def test_registry_errors_are_one_line_value_errors():
    with pytest.raises(ValueError) as err:
        make_env_factory("frozenlak")
    assert str(err.value) == (
        "unknown environment 'frozenlak': choose one of alfworld, frozenlake, search_qa, sokoban, sudoku, webshop, world_model, "
        "or give a dotted path 'package.module.Class'"
    )
    with pytest.raises(ValueError, match="env_kwargs.sise: not an argument of the frozenlake environment"):
        make_env_factory("frozenlake", sise=4)
    with pytest.raises(ValueError, match="cannot import"):
        make_env_factory("paw_lightning.envs.nowhere.Env")
    with pytest.raises(ValueError, match="not an environment class"):
        make_env_factory("functools.partial")


@pytest.mark.parametrize("layers, message", [
    ([("data.env_kwargs", {"hole_prob": 2})], "data.env_kwargs.hole_prob = 2: must be a number >= 0 and < 1"),
    ([("data.env_kwargs", {"size": 1})], "data.env_kwargs.size = 1: must be an integer >= 2"),
    ([("data.env_kwargs", {"size": "four"})], "data.env_kwargs.size = 'four': must be an integer >= 2"),
    ([("data.env_kwargs", {"layout": "diagonal"})], "data.env_kwargs.layout = 'diagonal': must be one of 'random', 'corners'"),
    ([("data.env_kwargs", {"size": 3}), ("data.evaluation.env_kwargs", {"hole_prob": -0.1})],
     "data.evaluation.env_kwargs.hole_prob = -0.1: must be a number >= 0 and < 1"),
    ([("data.env_kwargs", {"observation": "coordinates"}), ("data.evaluation.env_kwargs", {"coordinates": False})],  # only the merged pair is wrong
     "data.evaluation.env_kwargs: FrozenLake observation='coordinates' with coordinates=False would show nothing"),
])
def test_environment_arguments_are_checked_with_their_keys(layers, message):
    from paw_lightning.envs import check_env_config

    with pytest.raises(ValueError) as err:
        check_env_config("frozenlake", layers)
    assert str(err.value) == message


def test_every_registered_environment_declares_typed_arguments():
    """Each registered constructor's arguments are annotated (the parse-time check reads them), and
    its defaults pass the check."""
    import typing

    from paw_lightning.envs import ENV_REGISTRY, check_env_config, resolve_env_class

    for name in ENV_REGISTRY:
        cls = resolve_env_class(name)
        hints = typing.get_type_hints(cls.__init__)
        assert set(inspect.signature(cls).parameters) <= set(hints), name
        required = {"directory": "triplets"} if name == "world_model" else {}
        check_env_config(name, [("data.env_kwargs", required)])
    with pytest.raises(ValueError, match="data.env_kwargs: the world_model environment needs directory"):
        check_env_config("world_model", [("data.env_kwargs", {})])


def test_a_users_environment_is_type_checked_but_not_built(monkeypatch):
    from paw_lightning.envs import check_env_config

    built = []

    class Costly:
        def __init__(self, rate: float = 0.5):
            built.append(rate)

        def reset(self, seed, episode=0): ...

        def step(self, response): ...

    module = types.ModuleType("users_envs")
    module.Costly = Costly
    monkeypatch.setitem(sys.modules, "users_envs", module)
    check_env_config("users_envs.Costly", [("data.env_kwargs", {"rate": 0.1})])
    assert built == []
    with pytest.raises(ValueError, match="data.env_kwargs.rate = 'fast': must be a number"):
        check_env_config("users_envs.Costly", [("data.env_kwargs", {"rate": "fast"})])

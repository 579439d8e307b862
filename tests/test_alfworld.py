"""ALFWorld: the offline generator, the official-data loader and ``AlfWorldEnv``.

The generated games of one session (one per task type) are written once into a temporary
cache and shared by the tests; the official-format tests read the small committed tree
``tests/fixtures/alfworld/json_2.1.1`` (rebuilt by ``tests/fixtures/alfworld/make_fixture.py``).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys

import pytest

from paw_lightning.envs import EnvError, EnvPool, make_env_factory
from paw_lightning.envs.alfworld import layouts as L
from paw_lightning.envs.alfworld.env import AlfWorldEnv, official_games
from paw_lightning.envs.alfworld.generator import (
    ID_BUCKETS,
    SPLITS,
    TASK_TYPES,
    GameStore,
    GeneratorConfig,
    Verifier,
    draw_game,
    game_files,
    sample_spec,
    task_options,
)

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "alfworld")
TASK_DIR = re.compile(r"^(?P<type>[a-z_]+)-(?P<obj>[A-Za-z]+)-None-(?P<recep>[A-Za-z]+)-(?P<scene>\d+)$")


def single_type(task_type: str, **kwargs) -> GeneratorConfig:
    """The generator config ``AlfWorldEnv(task_types=[task_type])`` uses."""
    return GeneratorConfig(seed=0, task_mix=((task_type, 1.0),), **kwargs)


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> str:
    """A generated-games cache holding game 0 of the train split for every task type."""
    root = str(tmp_path_factory.mktemp("alfworld_cache"))
    for task_type in TASK_TYPES:
        GameStore(single_type(task_type), root).entry("train", 0)
    return root


def facts(problem: str, predicate: str) -> list[list[str]]:
    return [m.split() for m in re.findall(rf"\({predicate} ([^()]*)\)", problem)]


def play(env: AlfWorldEnv, actions: list[str]) -> list[tuple[str, float, bool, dict]]:
    return [env.step(a) for a in actions]


# --------------------------------------------------------------------- generator


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_generated_game_is_valid_and_in_official_layout(cache_dir, task_type):
    entry = GameStore(single_type(task_type), cache_dir).entry("train", 0)
    game_dir = os.path.dirname(entry["gamefile"])
    split_dir, task_dir, trial = os.path.relpath(game_dir, os.path.join(game_dir, "..", "..", "..")).split(os.sep)
    assert split_dir == "train" and trial.startswith("trial_")
    match = TASK_DIR.match(task_dir)
    assert match and match["type"] == task_type

    with open(entry["gamefile"]) as f:
        game = json.load(f)
    with open(os.path.join(game_dir, "traj_data.json")) as f:
        traj = json.load(f)
    assert set(game) >= {"pddl_domain", "grammar", "pddl_problem", "solvable", "walkthrough"}
    assert game["solvable"] is True and game["walkthrough"]
    params = traj["pddl_params"]
    assert traj["task_type"] == task_type and params["object_target"] == match["obj"]
    assert (params["parent_target"] or params["toggle_target"]) == match["recep"]
    assert f"Your task is to: {entry['task_desc']}." in game["grammar"] and "UNKNOWN GOAL" not in game["grammar"]

    # every object sits where ALFRED's rules allow; the target never starts in its goal type
    problem = game["pddl_problem"].split("(:goal")[0]
    otype = {o: t[: -len("Type")] for o, t in facts(problem, "objectType")}
    rtype = {r: t[: -len("Type")] for r, t in facts(problem, "receptacleType")}
    placed = facts(problem, "inReceptacle")
    assert len(placed) == len(otype)
    for obj, rec in placed:
        if otype[obj] in L.LAMPS:
            assert rtype[rec] in L.LAMP_HOLDERS
        else:
            assert L.can_hold(rtype[rec], otype[obj]), (otype[obj], rtype[rec])
        if otype[obj] == params["object_target"] and params["parent_target"]:
            assert rtype[rec] != params["parent_target"]
    targets = [o for o, t in otype.items() if t == params["object_target"]]
    assert len(targets) >= (2 if task_type == "pick_two_obj_and_place" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_planner_walkthrough_wins_every_generated_game_through_env(cache_dir, task_type):
    env = AlfWorldEnv(split="train", source="generated", task_types=[task_type], max_generated=1, cache_dir=cache_dir)
    assert env.source == "generated" and env.n_games == 1
    obs, info = env.reset(seed=7)  # 7 % 1 == 0: the cached game
    walkthrough = env.walkthrough()
    assert info["task_type"] == task_type and obs.endswith(f"Your task is to: {info['task']}")
    results = play(env, walkthrough)
    for _, reward, done, step_info in results[:-1]:
        assert reward == 0.0 and not done and step_info["action_recognised"]
    _obs, reward, done, last = results[-1]
    assert (reward, done, last["won"]) == (10.0, True, True)
    env.close()


@pytest.mark.slow
def test_seeded_generator_is_deterministic(cache_dir):
    config = single_type("look_at_obj_in_light")
    spec, plan = draw_game(config, "train", 0, Verifier())
    with open(os.path.join(cache_dir, f"generated-{config.key()}", "index", "train", "000000.json")) as f:
        cached = json.load(f)
    game, _traj = game_files(spec, plan, {})
    with open(GameStore(config, cache_dir).entry("train", 0)["gamefile"]) as f:
        assert json.load(f) == game  # a fresh draw in a fresh process state == the cached files
    assert cached["relpath"].split(os.sep)[1] == spec.task_dir
    # the cheap part (task + scene) is a pure function of the RNG stream
    for seed in range(20):
        fp = L.load_floor_plan(random.Random(seed).choice(L.ALL_FLOOR_PLANS))
        for task_type in TASK_TYPES:
            a = sample_spec(random.Random(seed), fp, task_type)
            b = sample_spec(random.Random(seed), fp, task_type)
            assert (a is None and b is None) or a.signature() == b.signature()
    assert GeneratorConfig(seed=1).key() != GeneratorConfig(seed=0).key()


@pytest.mark.slow
def test_splits_use_their_floor_plans_and_never_share_a_game():
    config = single_type("look_at_obj_in_light")
    verifier = Verifier()
    ood = set(config.ood_floor_plans)
    assert ood == set(L.DEFAULT_OOD_FLOOR_PLANS) and not ood & set(config.floor_plans("train"))
    for split in SPLITS:
        spec, _ = draw_game(config, split, 3, verifier)
        assert (spec.floor_plan in ood) == (split == "eval_out_of_distribution")
        if split != "eval_out_of_distribution":
            bucket = int(hashlib.sha256(spec.signature().encode()).hexdigest(), 16) % ID_BUCKETS
            assert (bucket == 0) == (split == "eval_in_distribution")


def test_sampled_scenes_follow_alfred_rules():
    checked = set()
    for seed in range(60):
        rng = random.Random(seed)
        fp = L.load_floor_plan(rng.choice(L.ALL_FLOOR_PLANS))
        for task_type in TASK_TYPES:
            spec = sample_spec(rng, fp, task_type)
            if spec is None:
                assert not task_options(fp, task_type)
                continue
            checked.add(task_type)
            assert fp.room in L.GOALS_VALID[task_type]
            receptacles = {r.id: r.type for r in fp.receptacles}
            for _, otype, rid in spec.objects:
                assert otype in L.LAMPS or L.can_hold(receptacles[rid], otype)
                if otype == spec.object_target and spec.parent_target:
                    assert receptacles[rid] != spec.parent_target
            appliance = {"pick_clean_then_place_in_recep": {"SinkBasin", "BathtubBasin"},
                         "pick_heat_then_place_in_recep": {"Microwave"}, "pick_cool_then_place_in_recep": {"Fridge"}}
            assert spec.parent_target not in appliance.get(task_type, ())
            if task_type == "look_at_obj_in_light":
                assert spec.toggle_target in fp.lamps and not spec.parent_target
    assert checked == set(TASK_TYPES)


# --------------------------------------------------------------------- official tree


@pytest.mark.slow
@pytest.mark.parametrize("split", list(SPLITS))
def test_official_format_games_load_and_win(split):
    env = AlfWorldEnv(split=split, data_path=FIXTURE, source="official")
    assert env.source == "official" and env.n_games == (2 if split == "train" else 1)
    obs, info = env.reset(seed=0)
    assert "Your task is to: " in obs
    assert info["gamefile"].startswith(os.path.join(FIXTURE, "json_2.1.1", SPLITS[split]))
    *_, (_obs, reward, done, last) = play(env, env.walkthrough())
    assert (reward, done, last["won"]) == (10.0, True, True)
    env.reset(seed=0)  # the planner from the current state (quick in these small rooms) wins too
    *_, (_obs, reward, done, last) = play(env, env.expert_plan())
    assert (reward, done, last["won"]) == (10.0, True, True)


def test_official_loader_filters_and_auto_detects(monkeypatch):
    root = os.path.join(FIXTURE, "json_2.1.1")
    assert [t for _, t in official_games(root, "train", TASK_TYPES)] == ["pick_and_place_simple"] * 2
    assert official_games(root, "train", ("look_at_obj_in_light",)) == ()
    env = AlfWorldEnv(split="train", data_path=FIXTURE, task_types=["look_at_obj_in_light"])
    with pytest.raises(EnvError, match="no playable ALFWorld games"):
        env.reset(0)
    monkeypatch.setenv("ALFWORLD_DATA", FIXTURE)
    assert AlfWorldEnv(split="eval_in_distribution").source == "official"
    assert AlfWorldEnv(split="eval_in_distribution", source="generated").source == "generated"
    monkeypatch.setenv("ALFWORLD_DATA", os.path.join(FIXTURE, "missing"))
    assert AlfWorldEnv().source == "generated"
    with pytest.raises(ValueError, match="no official ALFWorld"):
        AlfWorldEnv(source="official")


@pytest.mark.slow
def test_reset_step_semantics():
    env = AlfWorldEnv(split="train", data_path=FIXTURE)
    with pytest.raises(EnvError, match="reset"):
        env.step("look")
    obs, info = env.reset(seed=1, episode=3)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-")
    assert info["task"] == obs.split("Your task is to: ")[1] and info["task"].endswith(".")
    assert set(info) >= {"task", "admissible_actions", "won", "task_type", "gamefile", "game_index"}
    assert "help" not in info["admissible_actions"] and "look" in info["admissible_actions"]
    assert not info["won"] and info["game_index"] == 1

    obs, reward, done, info = env.step("<think>hmm</think> fly to the moon")
    assert (obs, reward, done, info["action_recognised"]) == ("Nothing happens.", 0.0, False, False)
    obs, reward, done, info = env.step("help")
    assert info["action_recognised"] and "Available commands" in obs and not done
    goto = next(a for a in info["admissible_actions"] if a.startswith("go to "))
    obs, reward, done, info = env.step(goto)
    assert obs.startswith(f"You arrive at {goto[len('go to '):]}.") and info["action_recognised"]

    _obs, info0 = env.reset(seed=1)  # a reset replays the same game from its start
    with open(info0["gamefile"]) as f:
        walkthrough = json.load(f)["walkthrough"]
    *_, (_o, reward, done, _i) = play(env, walkthrough)
    assert (reward, done) == (10.0, True)
    with pytest.raises(EnvError):
        env.step("look")


@pytest.mark.slow
def test_alfworlds_own_tools_run_on_generated_games(monkeypatch):
    """alfworld's AlfredTWEnv finds the games and its hand-coded expert plays one to a win."""
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredExpert, AlfredInfos, AlfredTWEnv
    from textworld.envs import PddlEnv

    root = os.path.join(FIXTURE, "json_2.1.1")
    config = {
        "env": {"goal_desc_human_anns_prob": 0, "task_types": [1, 2, 3, 4, 5, 6]},
        "dataset": {"data_path": f"{root}/train", "num_train_games": -1, "num_eval_games": -1},
    }
    assert AlfredTWEnv(config, train_eval="train").num_games == 2

    random.seed(0)  # the expert breaks ties with the global RNG
    env = AlfredExpert(AlfredInfos(AlfredDemangler(PddlEnv(textworld.EnvInfos(admissible_commands=True, won=True)))))
    gamefile = min(f for f, _ in official_games(root, "train", TASK_TYPES))
    argv = list(sys.argv)
    env.load(gamefile)
    state = env.reset()
    for _ in range(40):
        if state["won"]:
            break
        state, _, _ = env.step(state["extra.expert_plan"][0])
    sys.argv[:] = argv
    assert state["won"]


@pytest.mark.slow
def test_registry_builds_alfworld_lazily():
    code = "import sys, paw_lightning, paw_lightning.envs; print('textworld' in sys.modules, 'alfworld' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    factory = make_env_factory("alfworld", split="train", data_path=FIXTURE)
    assert isinstance(factory(), AlfWorldEnv)
    with pytest.raises(ValueError, match="not an argument of the alfworld environment"):
        make_env_factory("alfworld", splitt="train")
    with pytest.raises(ValueError, match="unknown ALFWorld split"):
        AlfWorldEnv(split="valid_seen")


@pytest.mark.slow
def test_alfworld_runs_in_a_worker_pool():
    factory = make_env_factory("alfworld", split="train", data_path=FIXTURE)
    with EnvPool(factory, size=2, num_workers=1) as pool:
        (_, info0), (_, info1) = pool.reset_many([(0, 0, 0), (1, 1, 0)])
        assert "error" not in info0 and info0["task"] != info1["task"]
        _, reward, done, info = pool.step(0, "look")
        assert info["action_recognised"] and reward == 0.0 and not done


class LookEngine:
    """A policy that always answers ``look`` (always admissible in ALFWorld)."""

    def generate(self, prompts, temperature, seed, stop="</action>"):
        from paw_lightning.rollout.engine import Generation

        return [Generation([1], [2], "<think>see</think><action>look</action>") for _ in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["raise_at_step", "die_at_step"])
def test_a_crashing_alfworld_env_does_not_stop_a_collection(fault, caplog):
    """Game 0's environment raises (or kills its worker process) at step 2: that episode
    ends failed with the error recorded, the other plays on, and the pool serves the next
    collection with a replaced environment / worker."""
    from paw_lightning.rollout.collector import Collector
    from paw_lightning.rollout.prompts import PromptBuilder

    factory = make_env_factory(
        "paw_lightning.envs.faulty.FaultyEnv", inner="alfworld", split="train", data_path=FIXTURE, fault_seeds=[0], **{fault: 2}
    )
    with EnvPool(factory, size=2, num_workers=2) as pool:  # env i lives on worker i
        collector = Collector(pool, LookEngine(), PromptBuilder("alfworld", 2), max_steps=3, invalid_penalty=-0.1)
        broken, healthy = collector.collect([(0, 0), (1, 1)], group_size=1, temperature=1.0, seed=0, progress=False)
        assert len(broken.steps) == 2 and broken.steps[-1].done and not broken.won
        expected = "injected fault at step 2" if fault == "raise_at_step" else "worker process died"
        assert expected in broken.error
        assert healthy.error is None and len(healthy.steps) == 3
        assert all(s.action == "look" and s.reward == 0.0 for s in healthy.steps)
        assert healthy.task_type and healthy.steps[1].observation == healthy.steps[0].next_observation

        again = collector.collect([(0, 1)], group_size=2, temperature=1.0, seed=1, progress=False)
        assert all(t.error is None and len(t.steps) == 3 for t in again)


@pytest.mark.slow
def test_engine_speedups_change_no_output():
    """AlfWorldEnv (memoised translation and parsing) == alfworld's plain wrapper chain, step by step."""
    from paw_lightning.envs.alfworld import engine

    env = AlfWorldEnv(split="train", data_path=FIXTURE)
    plain = engine.make_text_env()
    rng = random.Random(0)
    argv = list(sys.argv)
    for seed in range(env.n_games):
        obs, info = env.reset(seed)
        plain.load(info["gamefile"])
        plain_obs, plain_info = plain.reset()
        assert obs == plain_obs
        assert info["admissible_actions"] == [c for c in plain_info["admissible_commands"] if c != "help"]
        for _ in range(12):
            action = rng.choice(info["admissible_actions"] + ["nonsense"])
            obs, _, done, info = env.step(action)
            plain_obs, _, plain_done, plain_info = plain.step(action)
            assert (obs, done) == (plain_obs, plain_done)
            assert info["admissible_actions"] == [c for c in plain_info["admissible_commands"] if c != "help"]
            if done:
                break
    sys.argv[:] = argv  # the plain chain's translator overwrites it


def test_generate_command_fills_the_cache_the_env_reads(tmp_path, capsys, monkeypatch):
    """``python -m paw_lightning.envs.alfworld.generate`` (its ``main``): one game of one task type
    into a cache, where the store of the same generator config then finds it without drawing."""
    from paw_lightning.envs.alfworld import generate, generator

    generate.main(["--split", "train", "--num-games", "1", "--task-types", "look_at_obj_in_light", "--cache-dir", str(tmp_path)])
    assert capsys.readouterr().out.startswith("train: 1 games ready in ")
    monkeypatch.setattr(generator, "draw_game", lambda *a: pytest.fail("the generated game was drawn again"))
    entry = GameStore(single_type("look_at_obj_in_light"), str(tmp_path)).entry("train", 0)
    assert os.path.isfile(entry["gamefile"]) and entry["gamefile"].startswith(str(tmp_path))

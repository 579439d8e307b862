"""Format-only demonstrations (``random_valid``), the compact prompt and FrozenLake's
coordinates-only observation and gym layout: the pieces of the learning benchmark."""
from __future__ import annotations

import os
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from paw_lightning.callbacks.warmup import BehaviourCloningWarmup
from paw_lightning.demonstrations import collect_demonstrations
from paw_lightning.envs import make_env_factory
from paw_lightning.envs.actions import parse_action
from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.model import LMConfig
from paw_lightning.rollout.prompts import PromptBuilder

ALFWORLD_FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "alfworld")


class Recording:
    """Wraps an environment and records, per step, the admissible actions of the state the
    action was chosen in and whether the environment recognised the action."""

    def __init__(self, env):
        self.env, self.admissible, self.recognised = env, [], []

    def reset(self, seed, episode=0):
        obs, info = self.env.reset(seed, episode)
        self._current = info["admissible_actions"]
        return obs, info

    def step(self, action):
        self.admissible.append(self._current)
        obs, reward, done, info = self.env.step(action)
        self.recognised.append(info.get("action_recognised"))
        self._current = info.get("admissible_actions", [])
        return obs, reward, done, info


ENVS = {
    "frozenlake": lambda: make_env_factory("frozenlake")(),
    "sokoban": lambda: make_env_factory("sokoban")(),
    "sudoku": lambda: make_env_factory("sudoku")(),
    "alfworld": lambda: make_env_factory("alfworld", split="train", data_path=ALFWORLD_FIXTURE)(),
}


@pytest.mark.parametrize("name", list(ENVS))
def test_random_valid_demonstrations_are_admissible_and_parse_back(name, tokenizer):
    recording = Recording(ENVS[name]())
    demos = collect_demonstrations(lambda: recording, tokenizer, PromptBuilder(name, 2), [0, 1], max_steps=6, source="random_valid", seed=3)
    assert len(demos) == len(recording.admissible) > 0
    for demo, admissible, recognised in zip(demos, recording.admissible, recording.recognised):
        assert demo.action in admissible and demo.action != "help"
        assert recognised is True
        assert parse_action(demo.response) == demo.action  # exactly the policy's format
        assert tokenizer.decode(demo.input_ids[demo.action_mask]) == demo.action
    again = collect_demonstrations(lambda: ENVS[name](), tokenizer, PromptBuilder(name, 2), [0, 1], max_steps=6, source="random_valid", seed=3)
    assert [d.action for d in again] == [d.action for d in demos]  # seeded


def test_random_valid_actions_are_spread_over_the_admissible_set(tokenizer):
    demos = collect_demonstrations(make_env_factory("frozenlake", hole_prob=0.0), tokenizer, PromptBuilder("frozenlake", 0), list(range(12)), max_steps=8, source="random_valid")
    counts = Counter(d.action for d in demos)
    assert set(counts) == {"Up", "Down", "Left", "Right"} and min(counts.values()) >= len(demos) // 8
    assert not all(d.won for d in demos)  # random play, unlike the expert


def test_random_moving_actions_always_change_the_state(tokenizer):
    """FrozenLake 3×3 from the top-left corner: Up and Left bump into the border there, and
    random_valid plays such moves; random_moving never does while a move exists, and still
    spreads over the moves that change the state."""
    factory = make_env_factory("frozenlake", size=3, hole_prob=0.0, layout="corners")
    moving = collect_demonstrations(factory, tokenizer, PromptBuilder("frozenlake", 0), list(range(12)), max_steps=8, source="random_moving", seed=1)
    valid = collect_demonstrations(factory, tokenizer, PromptBuilder("frozenlake", 0), list(range(12)), max_steps=8, source="random_valid", seed=1)

    def bumps(demos):
        env, count = factory(), 0
        for demo in demos:
            if demo.step == 0:
                obs, _ = env.reset(demo.task_seed, 0)
            after, _, _, _ = env.step(demo.action)
            count += after == obs
            obs = after
        return count

    assert bumps(moving) == 0 and bumps(valid) > len(valid) // 5
    assert set(Counter(d.action for d in moving)) == {"Up", "Down", "Left", "Right"}
    again = collect_demonstrations(factory, tokenizer, PromptBuilder("frozenlake", 0), list(range(12)), max_steps=8, source="random_moving", seed=1)
    assert [d.action for d in again] == [d.action for d in moving]  # seeded


def test_unknown_demonstration_source_is_a_clear_error(tokenizer):
    with pytest.raises(ValueError, match="unknown demonstration source 'random'.*expert, random_valid"):
        collect_demonstrations(make_env_factory("frozenlake"), tokenizer, PromptBuilder("frozenlake"), [0], source="random")
    with pytest.raises(ValueError, match="source must be one of expert, random_valid"):
        BehaviourCloningWarmup(source="random")


def test_warmup_cache_key_depends_on_source_reason_prompt_and_loaded_dtype(tmp_path):
    def key(source="expert", reason="r", style="verl", dtype=torch.float32):
        module = SimpleNamespace(lm_config=LMConfig(name_or_path="x", dtype="auto"), lm=torch.nn.Linear(2, 2, dtype=dtype))
        dm = SimpleNamespace(env_name="frozenlake", env_kwargs={}, rollout=SimpleNamespace(max_steps=6), prompt=PromptBuilder("frozenlake", 0, style))
        return BehaviourCloningWarmup(source=source, reason=reason, cache_dir=str(tmp_path)).cache_file(module, dm)

    assert key() == key()
    # dtype auto loads bfloat16 on one CPU and float32 on another: their warm-ups differ
    assert len({key(), key(source="random_valid"), key(reason="other"), key(style="compact"), key(dtype=torch.bfloat16)}) == 5


# ------------------------------------------------------------------- prompts
def test_compact_prompt_says_the_same_in_fewer_words():
    task, obs, actions = "Reach G.", "Player (P) is at (0,0).", ["Up", "Down", "help"]
    history = [("o1", "Up"), ("o2", "Down"), ("o3", "Up")]
    compact = PromptBuilder("frozenlake", 2, "compact")(task, obs, history, actions)
    assert compact == (
        "Reach G.\n"
        "Step 2: o2\nAction: Down\n"
        "Step 3: o3\nAction: Up\n"
        "Step 4: Player (P) is at (0,0).\n"
        "Admissible actions: ['Up', 'Down'].\n"
        "Reason briefly in <think> </think>, then give one admissible action in <action> </action>."
    )
    verl = PromptBuilder("frozenlake", 2)(task, obs, history, actions)
    assert len(compact) < len(verl) / 2
    assert PromptBuilder("frozenlake", 0, "compact")(task, obs, history, actions).startswith("Reach G.\nStep 4: ")
    with pytest.raises(ValueError, match="unknown prompt style 'short': choose one of verl, compact"):
        PromptBuilder("frozenlake", 2, "short")


# --------------------------------------------------------------- frozenlake
def test_coordinates_observation_is_the_full_observations_last_line():
    full, coords = FrozenLakeEnv(observation="full"), FrozenLakeEnv(observation="coordinates")
    for seed in range(5):
        (obs_full, info_full), (obs, info) = full.reset(seed), coords.reset(seed)
        assert obs == obs_full.splitlines()[-1] and obs.startswith("Player (P) is at ")
        assert "(O)" not in info["task"] and "hole" in info["task"] and "(O)" in info_full["task"]
        action = full.solve()[0]
        assert coords.step(action)[0] == full.step(action)[0].splitlines()[-1]
    with pytest.raises(ValueError, match="observation must be one of full, coordinates"):
        FrozenLakeEnv(observation="grid")


def test_corners_layout_is_gyms_start_and_goal_with_random_solvable_holes():
    env = FrozenLakeEnv(size=3, layout="corners", hole_prob=0.3)
    hole_sets = set()
    for seed in range(20):
        obs, _ = env.reset(seed)
        grid = obs.splitlines()[:3]
        assert grid[0][0] == "P" and grid[2][2] == "G"
        assert len(env.solve()) >= 4  # solvable; Manhattan distance 4
        hole_sets.add(frozenset((r, c) for r, row in enumerate(grid) for c, x in enumerate(row) if x == "O"))
    assert len(hole_sets) > 5  # a new map per task
    with pytest.raises(ValueError, match="layout must be one of random, corners"):
        FrozenLakeEnv(layout="gym")

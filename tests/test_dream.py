"""The dream evaluation (paw_lightning.rollout.dream) with scripted models: hand-computed numbers
on a 2 × 3 FrozenLake map, batching, and the environments' judges."""
from __future__ import annotations

import pytest
from torchmetrics.functional.text import char_error_rate

from paw_lightning.envs import EnvPool
from paw_lightning.envs.base import Outcome
from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.envs.sokoban import SokobanEnv
from paw_lightning.envs.sudoku import SudokuEnv
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.rollout.dream.imagine import ImaginedEpisode, ImaginedStep, imagine
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.dream.measures import DreamRecords, dream_metrics, edit_distance
from paw_lightning.rollout.dream.play import dream_evaluation
from paw_lightning.rollout.dream.replay import replay
from paw_lightning.rollout.dream.settings import DreamSettings
from paw_lightning.rollout.engine import Generation
from paw_lightning.rollout.prompts import PromptBuilder

MAP = ["P_G", "_O_"]  # start (0,0), goal (0,2), a hole at (1,1): Right, Right wins
O0 = "P_G\n_O_\nPlayer (P) is at (0,0); goal (G) is at (0,2); hole (O) is at (1,1)."
O1 = "_PG\n_O_\nPlayer (P) is at (0,1); goal (G) is at (0,2); hole (O) is at (1,1)."
O2 = "__√\n_O_\nPlayer (√) is at (0,2); goal (G) is at (0,2); hole (O) is at (1,1)."
PROMPT = PromptBuilder("frozenlake", history_length=1)


class FixedLake(FrozenLakeEnv):
    """FrozenLake whose every task is MAP."""

    def reset(self, seed: int, episode: int = 0):
        return self.load_map(MAP, episode)


def always(action: str):
    """A scripted policy that always answers ``action``."""
    return lambda prompts: [Generation([], [], f"<think>go</think><action>{action}</action>") for _ in prompts]


def perfect(transitions):
    """A scripted world model that predicts FrozenLake exactly: the state read from o_t, the action applied."""
    out = []
    for t in transitions:
        env = FrozenLakeEnv()
        rows = [line for line in t.observation.splitlines() if set(line) <= set("P_OG")]
        env.load_map(rows)
        out.append(env.step(t.action)[0])
    return out


def nothing_changes(transitions):
    return [t.observation for t in transitions]


def real_trajectory(env, actions, seed=0, group=0) -> Trajectory:
    obs, info = env.reset(seed)
    traj = Trajectory(group, group, seed, task=info["task"])
    for a in actions:
        nxt, reward, done, info = env.step(a)
        traj.steps.append(Step(obs, [], [], f"<action>{a}</action>", a, reward, nxt, done))
        obs = nxt
        if done:
            traj.won = info["won"]
            break
    return traj


def run(predict, horizon=3, act=always("Right"), env_class=FixedLake, seeds=(0,), trajectories=None) -> dict:
    pool = EnvPool(env_class, len(seeds))
    judge = Judge.for_env(env_class)
    trajectories = trajectories if trajectories is not None else [real_trajectory(env_class(), ["Right", "Right"])]
    records = dream_evaluation(pool, list(seeds), trajectories, act, predict, judge, PROMPT, horizon)
    pool.close()
    return dream_metrics(records)


def test_the_map_renders_as_written_here():
    env = FixedLake()
    assert env.reset(0)[0] == O0
    assert env.step("Right")[0] == O1
    assert env.step("Right")[0] == O2


def test_a_perfect_model_is_faithful_and_its_dream_comes_true():
    m = run(perfect)
    assert m["exact_at_1"] == m["exact_at_2"] == 1.0 and m["cer_at_1"] == m["cer_at_2"] == 0.0
    assert m["state_match_at_1"] == m["state_match_at_2"] == 1.0
    assert "exact_at_3" not in m  # the real trajectory has 2 steps: no 3-step prediction
    assert m["success"] == 1.0 == m["replay_success"]  # won inside the model = won in reality
    assert m["length"] == 2.0 and m["judged"] == 1.0
    assert m["first_divergence"] == 4.0 and m["never_diverged"] == 1.0  # H + 1


def test_a_model_that_predicts_nothing_changes_by_hand():
    m = run(nothing_changes)
    # fidelity along (o0, Right, o1, Right, o2): k=1 predicts o0 for o1 and o1 for o2; k=2 predicts o0 for o2
    assert m["exact_at_1"] == 0.0 and m["exact_at_2"] == 0.0
    assert m["state_match_at_1"] == 0.0 and m["state_match_at_2"] == 0.0
    # edits: o0→o1 3 (grid P_G/_PG: 2, (0,0)/(0,1): 1), o1→o2 4 (grid 2, (P)/(√) and (0,1)/(0,2): 2), o0→o2 4
    assert m["cer_at_1"] == pytest.approx(7 / (len(O1) + len(O2)))
    assert m["cer_at_2"] == pytest.approx(4 / len(O2))
    # the dream: o0 forever, never judged done, runs to H = 3; not won inside the model
    assert m["length"] == 3.0 and m["success"] == 0.0 and m["judged"] == 1.0
    # replay: Right, Right wins in reality (the third action is never sent), and reality differs at step 1
    assert m["replay_success"] == 1.0
    assert m["first_divergence"] == 1.0 and m["never_diverged"] == 0.0


def test_edit_distance_matches_torchmetrics_cer():
    pairs = [(O0, O1), (O1, O2), (O0, O2), ("", "abc"), ("kitten", "sitting")]
    assert [edit_distance(a, b) for a, b in pairs[:3]] == [3, 4, 4]
    edits = sum(edit_distance(p, t) for p, t in pairs)
    assert edits / sum(len(t) for _, t in pairs) == pytest.approx(float(char_error_rate([p for p, _ in pairs], [t for _, t in pairs])))


def test_replay_counts_a_dream_that_outlives_reality_as_diverging_after_the_real_end():
    ep = ImaginedEpisode(0, O0, [ImaginedStep("Right", "", O1), ImaginedStep("Right", "", O2), ImaginedStep("Up", "", O2)])
    pool = EnvPool(FixedLake, 1)
    (result,) = replay([ep], pool, horizon=3)
    assert result.won and result.first_divergence == 3  # o1, o2 come true; reality ended before step 3
    (short,) = replay([ImaginedEpisode(0, O0, ep.steps[:2])], pool, horizon=3)
    assert short.won and short.first_divergence == 4
    pool.close()


def test_the_dream_stops_at_an_observation_judged_final_and_counts_a_hole_as_lost():
    m = run(perfect, act=always("Down"))  # (0,0) → (1,0), then the border: (1,0) stays, never final, all true
    assert m["success"] == 0.0 and m["length"] == 3.0 and m["never_diverged"] == 1.0
    lake = ["PO_", "__G"]

    class HoleLake(FrozenLakeEnv):
        def reset(self, seed, episode=0):
            return self.load_map(lake, episode)

    trajectory = real_trajectory(HoleLake(), ["Right"])
    m = run(perfect, act=always("Right"), env_class=HoleLake, trajectories=[trajectory])
    assert m["length"] == 1.0 and m["success"] == 0.0 and m["replay_success"] == 0.0 and m["judged"] == 1.0


def score(predict, horizon, seeds, trajectories, act) -> DreamRecords:
    with EnvPool(FrozenLakeEnv, max(1, len(seeds))) as pool:
        return dream_evaluation(pool, seeds, trajectories, act, predict, Judge.for_env(FrozenLakeEnv), PROMPT, horizon)


def by_prompt(prompts):
    """A scripted policy whose action depends on its prompt only (so on nothing a batch changes)."""
    return [Generation([], [], f"<action>{('Up', 'Down', 'Left', 'Right')[len(p) % 4]}</action>") for p in prompts]


def flaky(transitions):
    """Perfect, except that every third observation (by its text) is predicted unchanged."""
    exact = perfect(transitions)
    return [t.observation if sum(map(ord, t.observation + t.action)) % 3 == 0 else p for t, p in zip(transitions, exact)]


def test_batching_gives_the_numbers_of_one_sample_at_a_time():
    seeds = [11, 12, 13, 14]
    env = FrozenLakeEnv(size=3, hole_prob=0.3)
    trajectories = []
    for g, seed in enumerate(seeds):
        env.reset(seed)
        trajectories.append(real_trajectory(env, env.solve() + ["Up"], seed, g))
    batched = score(flaky, 3, seeds, trajectories, by_prompt)
    merged = DreamRecords(3, True)
    for seed, traj in zip(seeds, trajectories):
        one = score(flaky, 3, [seed], [traj], by_prompt)
        merged.fidelity += one.fidelity
        merged.episodes += one.episodes
        merged.replays += one.replays
    assert sorted((r.k, r.predicted, r.real) for r in batched.fidelity) == sorted((r.k, r.predicted, r.real) for r in merged.fidelity)
    metrics = dream_metrics(batched)
    assert metrics == dream_metrics(merged)
    assert 0 < metrics["exact_at_1"] < 1  # the flaky model is neither perfect nor always wrong here


def test_environments_judge_predicted_observations():
    lake = FrozenLakeEnv()
    assert lake.judge(O2) == Outcome(done=True, won=True)
    assert lake.judge(O0) == Outcome(done=False, won=False)
    assert lake.judge("PX_\n__G\nPlayer (X) is at (0,1); goal (G) is at (1,2).") is None  # two players
    assert lake.judge("_X_\n__G\nPlayer (X) is at (0,1); goal (G) is at (1,2); hole (O) is at (0,1).") == Outcome(True, False)
    assert lake.parse_state(O0.replace("(0,0);", "(0,1);")) is None  # grid and sentence disagree
    assert lake.parse_state("Player (P) is at (0,0); goal (G) is at (0,2); hole (O) is at (1,1).") == lake.parse_state(O0)
    sokoban = SokobanEnv()
    obs, _ = sokoban.reset(3)
    assert sokoban.judge(obs) == Outcome(False, False)
    for action in sokoban.solve():
        obs = sokoban.step(action)[0]
    assert sokoban.judge(obs) == Outcome(True, True)
    assert sokoban.judge("nonsense") is None
    sudoku = SudokuEnv()
    obs, info = sudoku.reset(3)
    assert sudoku.judge(obs).admissible_actions == info["admissible_actions"] and not sudoku.judge(obs).done
    for action in sudoku.solve():
        obs = sudoku.step(action)[0]
    assert sudoku.judge(obs) == Outcome(True, True, [])
    assert sudoku.judge("1234\n3412\n21__\n43__") is not None and sudoku.judge("1234\n3412\n2143") is None


def test_an_environment_without_a_judge_is_not_judged_unless_it_declares_a_won_text():
    class Plain:
        pass

    class Winnable:
        won_text = "You won"

    assert not Judge.for_env(Plain).judges and Judge.for_env(Plain)("anything") is None
    judge = Judge.for_env(Winnable)
    assert judge.judges and not judge.reads_states
    assert judge("You won!") == Outcome(True, True) and judge("not yet") == Outcome(False, False)
    episodes = imagine([(0, "start", {"task": "t", "admissible_actions": []})], always("x"), lambda ts: ["go on"] * len(ts), Judge.for_env(Plain), PROMPT, 2)
    records = DreamRecords(2, False, [], episodes, [])
    m = dream_metrics(records)
    assert m["judged"] == 0.0 and "success" not in m and m["length"] == 2.0


def test_settings_are_off_by_default_and_checked():
    assert not DreamSettings().enabled and not DreamSettings(tasks=None).enabled and DreamSettings(tasks=2).enabled
    with pytest.raises(ValueError, match="horizon"):
        DreamSettings(horizon=0)
    with pytest.raises(ValueError, match="tasks"):
        DreamSettings(tasks=-1)

"""Prompts, action parsing, the collector loop and step-sample masks, on hand-built cases."""

import torch

from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.envs.actions import parse_action
from paw_lightning.model import LMConfig, load_model, load_tokenizer
from paw_lightning.rollout import engine as engine_lib
from paw_lightning.rollout.collector import Collector, Trajectory, Step
from paw_lightning.rollout.engine import Generation, GenerationEngine
from paw_lightning.rollout.prompts import EpisodeState, PromptBuilder
from paw_lightning.rollout.samples import build_buffer


def test_parse_action():
    assert parse_action("<think>go</think><action> Up </action>") == "Up"
    assert parse_action("<action>Left</action> then <action>Up</action>") == "Left"
    assert parse_action("<action>Up") is None
    assert parse_action("<action>  </action>") is None
    assert parse_action("Up") is None


def test_prompt_shows_last_k_steps_and_admissible_actions():
    build = PromptBuilder("FrozenLake", history_length=2)
    history = [("o0", "Up"), ("o1", "Down"), ("o2", "Left")]
    prompt = build("reach G", "o3", history, ["Up", "Down", "help"])
    assert "Your task is to: reach G" in prompt
    assert "already taken 3 step(s)" in prompt
    assert "[Observation 2:\no1\nAction 2: 'Down']" in prompt and "[Observation 3:\no2\nAction 3: 'Left']" in prompt
    assert "o0" not in prompt  # only the last K = 2 pairs
    assert "You are now at step 4 and your current observation is:\no3" in prompt
    assert "['Up', 'Down']" in prompt  # 'help' is never offered
    first = build("reach G", "o0", [], ["Up"])
    assert "Prior to this step" not in first and "step 1" in first


def test_episode_state_records_each_observation_with_the_action_taken_there():
    state = EpisodeState.start("o0", {"task": "reach G", "admissible_actions": ["Up", "Down"]})
    state.advance("Up", "o1", {"admissible_actions": ["Down"]})
    state.advance("Down", "o2", {"admissible_actions": ["Left"]})
    assert state.history == [("o0", "Up"), ("o1", "Down")]
    assert (state.observation, state.admissible_actions) == ("o2", ["Left"])
    build = PromptBuilder("FrozenLake", history_length=2)
    assert build.render(state) == build("reach G", "o2", [("o0", "Up"), ("o1", "Down")], ["Left"])


class ScriptedEngine:
    """Replies from a script, records every batched call."""

    def __init__(self, replies):
        self.replies = replies
        self.calls = []

    def generate(self, prompts, temperature, seed, stop="</action>"):
        self.calls.append(len(prompts))
        return [Generation([1, 2, 3], [4, 5], self.replies(p, len(self.calls) - 1)) for p in prompts]


def test_collector_batches_each_step_penalises_invalid_and_stops_at_done():
    # Map: player top-left, goal right of it. "Right" wins in one step; garbage is invalid.
    factory = make_env_factory("frozenlake")
    pool = EnvPool(factory, 4)

    def replies(prompt, call):
        return "<action>Right</action>" if "won't-match" in prompt else "I am thinking"

    engine = ScriptedEngine(replies)
    collector = Collector(pool, engine, PromptBuilder("FrozenLake"), max_steps=3, invalid_penalty=-0.1)
    trajs = collector.collect([(0, 11), (1, 12)], group_size=2, temperature=1.0, seed=0, progress=False)
    assert engine.calls == [4, 4, 4]  # one batched call per step with every active episode
    assert [t.group_id for t in trajs] == [0, 0, 1, 1] and [t.traj_id for t in trajs] == [0, 1, 2, 3]
    for traj in trajs:
        assert len(traj.steps) == 3 and traj.steps[-1].done and not traj.won
        assert all(s.action is None and s.reward == -0.1 for s in traj.steps)
        assert traj.invalid_steps == 3 and abs(traj.total_return + 0.3) < 1e-9
        # the env got the raw response and said so; the state did not change
        assert traj.steps[0].next_observation.startswith("Invalid action")
    pool.close()


def test_collector_drops_finished_episodes_from_the_batch():
    factory = make_env_factory("frozenlake")
    env = factory()
    obs, _ = env.reset(5)
    plan = env.solve()
    pool = EnvPool(factory, 2)

    def replies(prompt, call):
        return f"<think>plan</think><action>{plan[call]}</action>" if call < len(plan) else "x"

    engine = ScriptedEngine(replies)
    collector = Collector(pool, engine, PromptBuilder("FrozenLake"), max_steps=len(plan) + 3, invalid_penalty=-0.1)
    trajs = collector.collect([(0, 5)], group_size=2, temperature=1.0, seed=0, progress=False)
    assert engine.calls == [2] * len(plan)  # both won on the last plan step, then nothing is generated
    for traj in trajs:
        assert traj.won and traj.total_return == 1.0 and [s.action for s in traj.steps] == plan
        assert traj.steps[0].observation == obs
    pool.close()


def test_engine_cuts_at_stop_string_and_eos(tiny_model_dir):
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    engine = GenerationEngine(model=None, tokenizer=tokenizer, max_new_tokens=8)
    ids = tokenizer.encode("<think>a</think><action>Up</action>xyz", add_special_tokens=False)
    cut = engine._cut(ids)
    assert tokenizer.decode(cut) == "<think>a</think><action>Up</action>"
    eos = tokenizer.eos_token_id
    assert engine._cut([5, 6, eos, eos, eos]) == [5, 6, eos]
    pad = tokenizer.pad_token_id
    assert pad != eos
    assert engine._cut([5, 6, pad]) == [5, 6] and engine._cut([5, 6, pad, pad]) == [5, 6]  # a finished row's padding
    assert engine._cut([5, pad, 6, 7]) == [5, pad, 6, 7]  # a pad token sampled inside the response is one of its tokens
    assert engine._cut([pad, pad]) == [pad]  # never empty: the row's first token was sampled
    tokenizer.pad_token = tokenizer.eos_token  # SmolLM2's: the pad is the end-of-turn token, which ends the response and stays
    assert engine._cut([5, 6, eos, eos, eos]) == [5, 6, eos] and engine._cut([5, eos]) == [5, eos]


def test_stop_criterion_fires_on_the_stop_string_and_is_built_once(tiny_model_dir, monkeypatch):
    cfg = LMConfig(name_or_path=str(tiny_model_dir))
    tokenizer = load_tokenizer(cfg)
    built = []
    real = engine_lib.StopStringCriteria
    monkeypatch.setattr(engine_lib, "StopStringCriteria", lambda *a: built.append(a) or real(*a))
    monkeypatch.setattr(engine_lib, "_STOP_CRITERIA", engine_lib.weakref.WeakKeyDictionary())
    engine = GenerationEngine(load_model(cfg), tokenizer, max_new_tokens=3)
    for seed in range(3):  # one rollout step each, as the collector calls it
        engine.generate(["go up", "go left"], temperature=1.0, seed=seed)
    GenerationEngine(engine.model, tokenizer, max_new_tokens=3).generate(["go"], temperature=1.0, seed=0)  # the next rollout
    assert len(built) == 1  # not once per generate call (HF's stop_strings would rebuild it every time)
    criterion = engine_lib.stop_criterion(tokenizer, "</action>")
    rows = [tokenizer.encode(text, add_special_tokens=False) for text in ("<action>Up</action>", "<action>Up</action> and on")]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])  # left-padded, as generate sees them
    assert criterion(ids, scores=None).tolist() == [True, False]


def test_step_sample_layout_and_masks(tiny_model_dir):
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    prompt_ids = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
    response = tokenizer.encode("<action>Up</action>", add_special_tokens=False)
    step = Step("o0", prompt_ids, response, "<action>Up</action>", "Up", 0.5, "AB", True)
    traj = Trajectory(group_id=3, traj_id=7, task_seed=1, steps=[step])
    buffer = build_buffer([traj], tokenizer)
    ids = buffer.input_ids[0]
    text = tokenizer.decode(ids)
    # [prompt][response][end of assistant turn + next user header][observation]
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<action>Up</action><|im_end|>\n<|im_start|>user\nAB"
    amask, omask = buffer.action_mask[0], buffer.obs_mask[0]
    assert tokenizer.decode(ids[amask]) == "<action>Up</action>"
    assert tokenizer.decode(ids[omask]) == "AB"
    assert amask.sum() == len(response) and omask.sum() == 2 and not (amask & omask).any()
    assert buffer.info.group_ids.tolist() == [3] and buffer.info.rewards.tolist() == [0.5]
    assert buffer.info.anchor_obs == ["o0"]
    batch = buffer.collate([0, 0])
    assert batch["input_ids"].shape == (2, len(ids)) and int(batch["keep_from"]) == len(prompt_ids)


def test_response_ending_in_eos_is_not_closed_twice(tiny_model_dir):
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    response = tokenizer.encode("<action>Up</action>", add_special_tokens=False) + [tokenizer.eos_token_id]
    step = Step("o0", [5], response, "", "Up", 0.0, "B", True)
    buffer = build_buffer([Trajectory(0, 0, 0, [step])], tokenizer)
    assert tokenizer.decode(buffer.input_ids[0][1:]) == "<action>Up</action><|im_end|>\n<|im_start|>user\nB"
    assert buffer.action_mask[0].sum() == len(response)  # the end-of-turn token is part of a_t

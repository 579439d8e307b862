"""RWML (METHODS.md §4) end to end: the world-model task environment, triplets, the data stage
(filter SFT, easy subsampling, weights restored) and both stages of the method on the tiny model."""
from __future__ import annotations

import contextlib
import json

import pytest
import torch

from paw_lightning.callbacks import RWMLData
from paw_lightning.cli import main
from paw_lightning.data import RolloutDataModule, RolloutSettings
from paw_lightning.embedding import SentenceEmbedder
from paw_lightning.envs import EnvError, EnvPool, make_env_factory
from paw_lightning.envs.world_model import Triplet, WorldModelEnv, read_triplets, write_triplets
from paw_lightning.rollout.collector import Collector, Step, Trajectory
from paw_lightning.rollout.engine import Generation, chat_prompt_ids
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.triplets import triplets_from_trajectories

from helpers import ROOT, make_module, metric_history, mlflow_runs, tiny_args

DRAWER = Triplet("open the drawer", "You see a closed drawer.", "open drawer 1", "You open the drawer 1. It is empty.", [("You are in a room.", "go to drawer 1")])


@pytest.fixture()
def triplet_dir(tmp_path):
    write_triplets(tmp_path / "train.jsonl", [DRAWER, Triplet("t", "o", "look", "You see a red apple on the table.")])
    return tmp_path


def test_prediction_rewarded_by_embedding_distance(triplet_dir):
    """The true next observation earns 1, unrelated text 0, a response without <next_state> 0
    (and is not a recognised action); one step ends the episode with the true observation."""
    env = WorldModelEnv(str(triplet_dir), tau_d=0.2)
    rewards = {}
    for name, response in {"true": f"<think>it opens</think><next_state>{DRAWER.next_observation}</next_state>",
                           "unrelated": "<think>hm</think><next_state>A red apple lies on the table.</next_state>",
                           "untagged": f"<think>it opens</think>{DRAWER.next_observation}"}.items():
        observation, info = env.reset(2)  # seed mod 2 = triplet 0
        assert observation.startswith("The agent's task: open the drawer") and "'open drawer 1'" in observation and info["admissible_actions"] == []
        next_observation, rewards[name], done, info = env.step(response)
        assert done and next_observation == DRAWER.next_observation and info["won"] == (rewards[name] == 1.0)
        assert info["action_recognised"] == (name != "untagged")
    assert rewards == {"true": 1.0, "unrelated": 0.0, "untagged": 0.0}
    with pytest.raises(EnvError, match="step"):
        env.step("<next_state>x</next_state>")  # one step per task


def test_exact_match_is_the_score_and_the_embedder_is_blind_to_grid_states(tmp_path):
    """``info["score"]``: 1 for the true next observation up to whitespace, 0 for another one. On
    FrozenLake the embedded MiniLM cannot tell states apart: a prediction that the player stays
    where it was, wrong in every triplet here, is within τ_d = 0.2 of the truth."""
    env = make_env_factory("frozenlake", size=4, slippery=False)()
    start = env.reset(0)[0]

    def after(action: str) -> str:
        env.reset(0)
        return env.step(action)[0]

    moved = [Triplet("reach the goal", start, a, after(a)) for a in ("Right", "Down")]
    assert all(t.next_observation != start for t in moved)
    write_triplets(tmp_path / "train.jsonl", moved)
    wm = WorldModelEnv(str(tmp_path), tau_d=0.2)
    scores = []
    for prediction in (moved[0].next_observation.replace("\n", " \n "), start):
        wm.reset(0)
        scores.append(wm.step(f"<think>x</think><next_state>{prediction}</next_state>")[3]["score"])
    assert scores == [1.0, 0.0]
    assert wm.wrong_copy_reward_rate(moved) == 1.0
    assert WorldModelEnv(str(tmp_path), tau_d=0.001).wrong_copy_reward_rate(moved) == 0.0


def test_reward_follows_the_threshold(triplet_dir):
    """A paraphrase at cosine distance d earns 1 exactly when d < τ_d (τ_d just above and below d)."""
    paraphrase = "The drawer 1 is open now and it is empty."
    true, pred = SentenceEmbedder()([DRAWER.next_observation, paraphrase])
    distance = 1 - float(true @ pred)
    assert 0.02 < distance < 0.5
    for tau, expected in ((distance + 0.01, 1.0), (distance - 0.01, 0.0)):
        env = WorldModelEnv(str(triplet_dir), tau_d=tau)
        env.reset(0)
        assert env.step(f"<next_state>{paraphrase}</next_state>")[1] == expected


def test_bad_triplet_files_name_the_fix(tmp_path):
    with pytest.raises(EnvError, match="RWMLData callback collects them"):
        WorldModelEnv(str(tmp_path)).reset(0)
    (tmp_path / "eval.jsonl").write_text('{"task": "t"}\n')
    with pytest.raises(EnvError, match=r"eval.jsonl:1 is not a triplet"):
        WorldModelEnv(str(tmp_path), split="eval").reset(0)
    with pytest.raises(ValueError, match="unknown world-model split"):
        WorldModelEnv(str(tmp_path), split="test")


def test_triplets_keep_the_last_h_steps_and_skip_invalid_actions():
    steps = [Step(f"o{t}", [], [], f"text{t}", None if t == 1 else f"a{t}", 0.0, f"o{t + 1}", t == 3) for t in range(4)]
    triplets = triplets_from_trajectories([Trajectory(0, 0, 7, steps, task="the task")], history_length=2)
    assert [(t.observation, t.action, t.next_observation) for t in triplets] == [("o0", "a0", "o1"), ("o2", "a2", "o3"), ("o3", "a3", "o4")]
    assert [t.history for t in triplets] == [[], [("o0", "a0"), ("o1", "text1")], [("o1", "text1"), ("o2", "a2")]]
    assert all(t.task == "the task" for t in triplets)


class FixedPrediction:
    """A sampler that predicts the same next observation for every prompt."""

    def __init__(self, tokenizer, prediction: str):
        self.tokenizer, self.text = tokenizer, f"<think>same</think><next_state>{prediction}</next_state>"
        self.prompts: list[str] = []

    def generate(self, prompts, temperature, seed, stop="</action>"):
        assert stop == "</next_state>"
        self.prompts += prompts
        return [Generation(chat_prompt_ids(self.tokenizer, p), [], self.text) for p in prompts]


def test_collector_hands_the_world_model_task_the_whole_response(triplet_dir, tiny_model_dir):
    module = make_module(tiny_model_dir)
    sampler = FixedPrediction(module.tokenizer, DRAWER.next_observation)
    with EnvPool(make_env_factory("world_model", directory=str(triplet_dir)), 2) as pool:
        (traj,) = Collector(pool, sampler, PromptBuilder("world_model", style="rwml"), 1, invalid_penalty=0.0).collect([(0, 0)], 1, 1.0, seed=0)
    assert traj.steps[0].action == DRAWER.next_observation and traj.steps[0].reward == 1.0 and traj.won
    assert "within <next_state> </next_state>" in sampler.prompts[0] and "The agent now takes the action: 'open drawer 1'" in sampler.prompts[0]


def rwml_datamodule(directory, seed: int | None = None) -> RolloutDataModule:
    kwargs = {"directory": str(directory), "source": "frozenlake", "source_kwargs": {"size": 4, "slippery": False}}
    return RolloutDataModule(env="world_model", env_kwargs=kwargs, rollout=RolloutSettings(prompt_style="rwml", max_steps=1, max_new_tokens=8), seed=seed, progress=False)


@pytest.mark.parametrize("keep_easy,start_from_filter", [(0.0, False), (1.0, True)])
def test_data_stage_subsamples_easy_triplets_and_restores_the_weights(tiny_model_dir, tmp_path, monkeypatch, capsys, keep_easy, start_from_filter):
    """Random FrozenLake triplets; the filter "model" predicts one fixed grid for every triplet, so
    a candidate is easy exactly when that grid is within τ_d = 0.1 of its true next observation.
    p = 0: the kept triplets are exactly the others; p = 1: all. The LoRA weights return to
    their start unless ``start_from_filter``; the filter SFT trained on the 10% split."""
    module = make_module(tiny_model_dir)
    fixed = make_env_factory("frozenlake", size=4, slippery=False)().reset(0)[0]
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: FixedPrediction(module.tokenizer, fixed))
    before = {n: p.detach().clone() for n, p in module.lm.named_parameters() if p.requires_grad}
    updates = module.offline_updates
    stage = RWMLData(tasks=6, episodes_per_task=2, eval_tasks=2, max_steps=4, actions="random_valid", samples=3, keep_easy=keep_easy,
                     epochs=1, lr=1e-2, start_from_filter=start_from_filter, progress=False)
    stats = stage.prepare(module, rwml_datamodule(tmp_path), contextlib.nullcontext)
    candidates, kept = read_triplets(tmp_path / "candidates.jsonl"), read_triplets(tmp_path / "train.jsonl")
    assert len(read_triplets(tmp_path / "filter.jsonl")) == round(0.1 * stats["triplets"]) and len(candidates) + round(0.1 * stats["triplets"]) == stats["triplets"]
    vectors = SentenceEmbedder()([fixed] + [t.next_observation for t in candidates])
    easy = [1 - float(vectors[0] @ v) < 0.1 for v in vectors[1:]]
    assert 0 < sum(easy) < len(easy)  # both kinds are present
    assert stats["easy_fraction"] == pytest.approx(sum(easy) / len(easy)) and stats["filter_reward_rate"] == pytest.approx(sum(easy) / len(easy))
    expected = candidates if keep_easy == 1.0 else [t for t, e in zip(candidates, easy) if not e]
    assert kept == expected and stats["kept"] == len(expected)
    changed = [not torch.equal(before[n], p) for n, p in module.lm.named_parameters() if p.requires_grad]
    assert any(changed) == start_from_filter and stage.losses  # the filter SFT ran either way
    # the weights' version moves at the filter SFT and again when they are put back: an engine's copy follows
    assert module.offline_updates - updates == (1 if start_from_filter else 2)
    out = capsys.readouterr().out
    assert f"RWML filter SFT: {round(0.1 * stats['triplets'])} triplets with their true next observation, 1 epoch, " in out
    assert stats["wrong_copy_reward_rate"] == 1.0 and "warning: RWML's reward (τ_d 0.2, embedder 'embedded') rewards the wrong prediction" in out


def test_data_stage_follows_the_run_seed_unless_pinned(tiny_model_dir, tmp_path, monkeypatch):
    """Seeds of a sweep collect triplets of different tasks; an explicit seed collects the same."""
    module = make_module(tiny_model_dir)
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: FixedPrediction(module.tokenizer, "anything"))

    def held_out(run_seed, **pinned):
        stage = RWMLData(tasks=2, episodes_per_task=1, eval_tasks=2, max_steps=2, actions="random_valid", samples=1, keep_easy=1.0, epochs=1, progress=False, **pinned)
        directory = tmp_path / f"{run_seed}-{pinned}"
        stage.prepare(module, rwml_datamodule(directory, seed=run_seed), contextlib.nullcontext)
        return [t.observation for t in read_triplets(directory / "eval.jsonl")]

    assert held_out(1) != held_out(2)
    assert held_out(1, seed=7) == held_out(2, seed=7)


@pytest.mark.slow
def test_rwml_then_policy_rl_end_to_end(tiny_model_dir, tmp_path, monkeypatch):
    """configs/methods/rwml.yaml on the tiny model (the data stage, GRPO on predictions, validation on
    held-out triplets), then policy RL on FrozenLake from its last.ckpt."""
    monkeypatch.chdir(tmp_path)
    small = ["--trainer.max_epochs=1", "--trainer.check_val_every_n_epoch=1", "--data.rollout.max_new_tokens=12", "--data.evaluation.groups=2", "--stages.rwml.init_args.tasks=4",
             "--stages.rwml.init_args.eval_tasks=2", "--stages.rwml.init_args.samples=2", "--stages.rwml.init_args.epochs=1"]
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/methods/rwml.yaml"), *small, f"--checkpoint.dirpath={tmp_path / 'rwml'}",
                            f"--data.env_kwargs.directory={tmp_path / 'triplets'}")])
    client, (run,) = mlflow_runs(tmp_path, "rwml")
    assert metric_history(client, run, "rwml/triplets")[0] >= 10 and len(metric_history(client, run, "rwml/kept")) == 1
    assert len(metric_history(client, run, "val/episode/success_rate")) == 1  # the held-out reward rate
    report = json.loads((tmp_path / "triplets" / "eval.jsonl").read_text().splitlines()[0])
    assert set(report) == {"task", "observation", "action", "next_observation", "history"}
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "--trainer.max_epochs=1", f"--model.init_weights={tmp_path / 'rwml' / 'last.ckpt'}")])
    client, (policy_run,) = mlflow_runs(tmp_path, "frozenlake")
    assert metric_history(client, policy_run, "train/loss")


def test_no_subsampling_overlay_changes_only_keep_easy():
    from paw_lightning.cli import resolved_config

    rwml = resolved_config(ROOT / "configs/frozenlake.yaml", ROOT / "configs/methods/rwml.yaml")
    ablation = resolved_config(ROOT / "configs/frozenlake.yaml", ROOT / "configs/methods/rwml.yaml", ROOT / "configs/methods/rwml_no_subsampling.yaml")
    assert rwml["stages"]["rwml"]["init_args"]["keep_easy"] == 0.1 and ablation["stages"]["rwml"]["init_args"]["keep_easy"] == 1.0
    ablation["stages"]["rwml"]["init_args"]["keep_easy"] = 0.1
    assert ablation == rwml


def test_data_stage_that_keeps_nothing_says_why(tiny_model_dir, tmp_path, monkeypatch):
    """τ_d = 2 rewards every prediction: every candidate is easy, and with p = 0 none would be kept."""
    module = make_module(tiny_model_dir)
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: FixedPrediction(module.tokenizer, "anything"))
    stage = RWMLData(tasks=2, episodes_per_task=1, eval_tasks=1, max_steps=4, actions="random_valid", samples=2, tau_d=2.0, keep_easy=0.0, epochs=1, progress=False)
    with pytest.raises(ValueError, match=r"all \d+ candidates were easy and none was kept \(keep_easy=0.0\)"):
        stage.prepare(module, rwml_datamodule(tmp_path), contextlib.nullcontext)

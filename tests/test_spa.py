"""SPA's format (METHODS.md §5): the self-play rewrite puts the true states in place of the
model's beliefs, and demonstrations in SPA's format train exactly the response's tokens."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from paw_lightning.callbacks import SelfPlaySFT
from paw_lightning.cli import main
from paw_lightning.data import RolloutDataModule, RolloutSettings
from paw_lightning.demonstrations import collect_demonstrations
from paw_lightning.envs import make_env_factory
from paw_lightning.envs.actions import parse_action
from paw_lightning.rollout.engine import Generation, chat_prompt_ids
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.spa import spa_response, with_true_states

from helpers import ROOT, make_module, tiny_args


def test_beliefs_are_replaced_by_the_true_states():
    believed = "<think><observation>P at (0,0)</observation>\n<prediction>P at (0,1)</prediction>Go right.</think><answer>Right</answer>"
    rewritten = with_true_states(believed, "P at (1,0)", "P at (2,0)")
    assert rewritten == "<think><observation>P at (1,0)</observation><prediction>P at (2,0)</prediction>Go right.</think><answer>Right</answer>"
    assert parse_action(rewritten, "answer") == "Right"
    assert with_true_states("<think>no beliefs</think><answer>Right</answer>", "a", "b") is None  # no state spans
    assert with_true_states("<think><observation>x</observation><prediction>y</prediction></think>", "a", "b") is None  # no answer
    assert with_true_states(believed, r"P \1 at (1,0)", "b").startswith(r"<think><observation>P \1 at (1,0)<")  # states are text, not patterns


def test_spa_prompt_asks_for_the_format():
    prompt = PromptBuilder("sokoban", 2, "spa")
    text = prompt("push the box", "#P#", [], ["Up"])
    assert prompt.action_tag == "answer" and "<observation> </observation>" in text and "<answer> </answer>" in text


def test_spa_demonstrations_train_the_true_states_and_mask_the_prompt(tokenizer):
    """Random admissible actions in SPA's format (the paper's RandSFT): each sample's loss covers
    exactly the response with o_t and o_{t+1}, and the action mask exactly the action."""
    factory = make_env_factory("frozenlake", observation="coordinates")
    demos = collect_demonstrations(factory, tokenizer, PromptBuilder("frozenlake", 1, "spa"), [0], max_steps=3, source="random_valid", reason="Move.")
    env = factory()
    obs, _ = env.reset(0, 0)
    for demo in demos:
        next_obs, *_ = env.step(demo.action)
        assert demo.response == spa_response(obs, next_obs, demo.action, "Move.")
        assert tokenizer.decode(demo.input_ids[demo.loss_mask]) == demo.response + tokenizer.eos_token
        assert tokenizer.decode(demo.input_ids[: demo.prompt_length]).count(demo.prompt.splitlines()[-1]) == 1  # the prompt, unmasked
        assert not demo.loss_mask[: demo.prompt_length].any()
        assert tokenizer.decode(demo.input_ids[demo.action_mask]) == demo.action
        obs = next_obs


class ScriptedSPA:
    """A policy that always answers Right in SPA's format with wrong beliefs."""

    def __init__(self, tokenizer, text="<think><observation>wrong</observation>\n<prediction>wrong too</prediction>ok</think><answer> Right </answer>"):
        self.tokenizer, self.text = tokenizer, text

    def generate(self, prompts, temperature, seed, stop="</action>"):
        assert stop == "</answer>"  # the collector stops at SPA's answer tag
        return [Generation(chat_prompt_ids(self.tokenizer, p), [], self.text) for p in prompts]


def spa_datamodule():
    return RolloutDataModule(env="frozenlake", env_kwargs={"observation": "coordinates"}, rollout=RolloutSettings(max_steps=2, prompt_style="spa"), progress=False)


def test_self_play_steps_become_sft_samples_with_the_true_states(tiny_model_dir, monkeypatch):
    module = make_module(tiny_model_dir)
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: ScriptedSPA(module.tokenizer))
    sft = SelfPlaySFT(episodes=2, seed=0)
    demos = sft.demonstrations_for_rank(module, spa_datamodule())
    assert {d.step for d in demos} == {0, 1} and len({d.task_seed for d in demos}) == 2  # every step played is kept
    env = make_env_factory("frozenlake", observation="coordinates")()
    for demo in demos:
        if demo.step == 0:
            obs, _ = env.reset(demo.task_seed, 0)
        next_obs, *_ = env.step("Right")
        assert demo.response == f"<think><observation>{obs}</observation><prediction>{next_obs}</prediction>ok</think><answer>Right</answer>"
        assert module.tokenizer.decode(demo.input_ids[demo.loss_mask]) == demo.response + module.tokenizer.eos_token
        obs = next_obs


def test_self_play_episodes_follow_the_run_seed_unless_pinned(tiny_model_dir, monkeypatch):
    """Seeds of a sweep self-play different tasks; an explicit seed plays the same ones."""
    module = make_module(tiny_model_dir)
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: ScriptedSPA(module.tokenizer))

    def tasks(sft, run_seed):
        datamodule = RolloutDataModule(env="frozenlake", env_kwargs={"observation": "coordinates"}, rollout=RolloutSettings(max_steps=1, prompt_style="spa"), seed=run_seed, progress=False)
        return sorted(d.task_seed for d in sft.demonstrations_for_rank(module, datamodule))

    assert tasks(SelfPlaySFT(episodes=4), 1) != tasks(SelfPlaySFT(episodes=4), 2)
    assert tasks(SelfPlaySFT(episodes=4), 1) == tasks(SelfPlaySFT(episodes=4), 1)
    assert tasks(SelfPlaySFT(episodes=4, seed=7), 1) == tasks(SelfPlaySFT(episodes=4, seed=7), 2)


def test_self_play_refuses_what_it_cannot_learn_from(tiny_model_dir, monkeypatch):
    module = make_module(tiny_model_dir)
    monkeypatch.setattr(module, "sampler", lambda max_new_tokens, token_stats=False: ScriptedSPA(module.tokenizer, "<think>no beliefs</think><answer>Right</answer>"))
    with pytest.raises(ValueError, match=r"none of the policy's \d+ responses used SPA's format"):
        SelfPlaySFT(episodes=2).demonstrations_for_rank(module, spa_datamodule())
    trainer = SimpleNamespace(datamodule=RolloutDataModule(env="frozenlake"))
    with pytest.raises(ValueError, match="prompt_style=spa"):
        SelfPlaySFT().on_fit_start(trainer, module)


@pytest.mark.slow
def test_spa_recipe_stops_with_one_line_when_the_policy_ignores_the_format(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """configs/methods/spa.yaml end to end on the tiny random model: the format warm-up runs,
    then self-play finds no SPA transcript and the fit ends with one error line (exit 2)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/methods/spa.yaml"), "--trainer.max_epochs=1",
                                "--data.rollout.max_new_tokens=16")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: self-play SFT: none of the policy's" in err and "Traceback" not in err


class ScriptedSPAIds(ScriptedSPA):
    """ScriptedSPA with the response's token ids, so RL can train on its rollouts."""

    def generate(self, prompts, temperature, seed, stop="</action>"):
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        return [Generation(chat_prompt_ids(self.tokenizer, p), ids, self.text) for p in prompts]


@pytest.mark.slow
def test_spa_recipe_end_to_end(tiny_model_dir, tmp_path, monkeypatch):
    """configs/methods/spa.yaml with a policy that writes SPA's format: the format warm-up,
    the self-play SFT on the rewritten transcripts (its loss falls over its 5 epochs), then RL."""
    from paw_lightning.module import PaWModule

    from helpers import metric_history, mlflow_runs

    monkeypatch.setattr(PaWModule, "sampler", lambda self, max_new_tokens, token_stats=False: ScriptedSPAIds(self.tokenizer))
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/methods/spa.yaml"), "--trainer.max_epochs=1", "--data.rollout.max_new_tokens=16")])
    client, (run,) = mlflow_runs(tmp_path)
    warmup, spa = metric_history(client, run, "warmup/loss"), metric_history(client, run, "spa/loss")
    assert len(warmup) == 3 and len(spa) == 5 and spa[-1] < spa[0]
    assert metric_history(client, run, "train/loss") and metric_history(client, run, "train/episode/invalid_rate") == [0.0]

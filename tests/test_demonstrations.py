"""Per-task-type metrics, expert demonstrations and the behaviour-cloning warm-up
(FrozenLake, tiny model)."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from paw_lightning.callbacks.warmup import BehaviourCloningWarmup
from paw_lightning.data import RolloutDataModule, RolloutSettings
from paw_lightning.demonstrations import collate, collect_demonstrations, play_expert, sft_loss, token_logprobs
from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.metrics import episode_metrics
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule
from paw_lightning.rollout.collector import Collector, Step, Trajectory
from paw_lightning.rollout.engine import Generation, chat_prompt_ids
from paw_lightning.rollout.prompts import PromptBuilder

SEEDS = [3, 11, 42]


# ------------------------------------------------------------------ metrics
def _traj(task_type, won, i=0):
    step = Step("o", [1], [2], "r", "go", 10.0 if won else 0.0, "o2", True)
    return Trajectory(0, i, 0, steps=[step], won=won, task_type=task_type)


def test_success_rate_per_task_type_uses_alfworld_short_names():
    trajs = [
        _traj("pick_and_place_simple", True), _traj("pick_and_place_simple", False),
        _traj("pick_two_obj_and_place", True), _traj("pick_heat_then_place_in_recep", False),
        _traj("my_custom_type", True), _traj(None, False),
    ]  # fmt: skip
    metrics = episode_metrics(trajs)
    per_type = {k: v for k, v in metrics.items() if k.startswith("success_rate/")}
    assert per_type == {"success_rate/pick": 0.5, "success_rate/pick2": 1.0, "success_rate/heat": 0.0, "success_rate/my_custom_type": 1.0}
    assert metrics["success_rate"] == 3 / 6


def test_no_per_type_metrics_without_task_types():
    assert not any("/" in k for k in episode_metrics([_traj(None, True)]))


# ----------------------------------------------------------- demonstrations
def test_demonstration_responses_and_masks(tokenizer):
    demos = collect_demonstrations(make_env_factory("frozenlake"), tokenizer, PromptBuilder("frozenlake", 2), SEEDS)
    assert {d.task_seed for d in demos} == set(SEEDS)
    for d in demos:
        response = d.input_ids[d.loss_mask]
        assert d.loss_mask[d.prompt_length :].all() and not d.loss_mask[: d.prompt_length].any()
        assert response[-1].item() == tokenizer.eos_token_id
        text = tokenizer.decode(response[:-1])
        assert text == f"<think>The task requires this step next.</think><action>{d.action}</action>" == d.response
        assert tokenizer.decode(d.input_ids[d.action_mask]) == d.action in ("Up", "Down", "Left", "Right")
        assert d.won  # the BFS expert wins every non-slippery map
    assert len(demos) > len(SEEDS)  # multi-step episodes


def test_demonstration_prompt_is_the_collectors_prompt(tokenizer):
    """Replay the expert's actions through the Collector with a scripted engine: every prompt
    it renders (chat-templated ids) equals the demonstration's prompt, history included."""
    factory, prompt = make_env_factory("frozenlake"), PromptBuilder("frozenlake", 1)
    demos = play_expert(factory(), tokenizer, prompt, SEEDS[0])
    assert len(demos) >= 3  # so the history window is exercised

    class Scripted:
        def __init__(self):
            self.t = 0

        def generate(self, prompts, temperature, seed, stop="</action>"):
            gens = [Generation(chat_prompt_ids(tokenizer, p), [], f"<action>{demos[self.t].action}</action>") for p in prompts]
            self.t += 1
            return gens

    collector = Collector(EnvPool(factory, 1), Scripted(), prompt, max_steps=20, invalid_penalty=-0.1)
    (traj,) = collector.collect([(0, SEEDS[0])], 1, 1.0, 0, progress=False)
    assert traj.won and len(traj.steps) == len(demos)
    for step, demo in zip(traj.steps, demos):
        assert step.prompt_ids == demo.input_ids[: demo.prompt_length].tolist()
        assert step.action == demo.action


def test_environment_without_expert_is_a_clear_error(tokenizer):
    class NoExpert:
        def reset(self, seed, episode=0):
            return "o", {"task": "t", "admissible_actions": ["a"], "won": False}

        def step(self, action):
            return "o", 0.0, False, {"task": "t", "admissible_actions": ["a"], "won": False}

    with pytest.raises(ValueError, match="walkthrough\\(\\).*solve\\(\\)"):
        play_expert(NoExpert(), tokenizer, PromptBuilder("x"), 0)


# -------------------------------------------------------------------- warm-up
def _action_logprob(module, demos) -> float:
    with torch.no_grad():
        batch = collate(demos, module.tokenizer.pad_token_id)
        return (token_logprobs(module.lm, batch) * batch["action_mask"]).sum().item()


def test_warmup_fits_demonstrations_and_changes_only_lora(tiny_model_dir):
    torch.manual_seed(0)  # the LoRA initialisation
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)))
    module.configure_model()
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1), progress=False)
    warmup = BehaviourCloningWarmup(demonstrations=2, epochs=8, lr=1e-2, batch_size=2, progress=False)
    demos = warmup.demonstrations_for_rank(module, datamodule)
    before = {n: p.detach().clone() for n, p in module.lm.named_parameters()}
    with torch.no_grad():
        loss_before = sft_loss(module.lm, collate(demos, module.tokenizer.pad_token_id))[0].item()
    action_before = _action_logprob(module, demos)

    losses = warmup.warm_up(module, datamodule)

    with torch.no_grad():
        loss_after = sft_loss(module.lm, collate(demos, module.tokenizer.pad_token_id))[0].item()
    assert len(losses) == 8 and losses[-1] < losses[0], losses
    assert loss_after < loss_before * 0.95, (loss_before, loss_after)
    assert _action_logprob(module, demos) > action_before
    after = dict(module.lm.named_parameters())
    lora = [n for n, p in after.items() if p.requires_grad]
    assert lora and all("lora_" in n for n in lora)
    assert any(not torch.equal(after[n], before[n]) for n in lora)
    assert all(torch.equal(p, before[n]) for n, p in after.items() if not p.requires_grad)
    assert all(p.grad is None for p in module.lm.parameters())  # nothing left for the trainer's optimizer


def test_warmup_in_one_demonstration_micro_batches_trains_the_same_weights(tiny_model_dir):
    """With ``micro_batch_rows: 1`` every forward of the warm-up has one unpadded demonstration,
    and the epoch losses and the trained LoRA weights are those of whole batches."""
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1), progress=False)

    def warm_up(rows: int | None):
        torch.manual_seed(0)
        module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)), micro_batch_rows=rows)
        module.configure_model()
        forwards = []
        module.lm.register_forward_pre_hook(lambda _, args, kwargs: forwards.append(kwargs["input_ids"].shape), with_kwargs=True)
        warmup = BehaviourCloningWarmup(demonstrations=3, epochs=2, lr=1e-2, batch_size=3, progress=False)
        losses = warmup.warm_up(module, datamodule)
        return losses, {n: p.detach() for n, p in module.lm.named_parameters() if p.requires_grad}, forwards

    whole_losses, whole, whole_forwards = warm_up(None)
    split_losses, split, split_forwards = warm_up(1)
    assert max(rows for rows, _ in whole_forwards) == 3
    assert {rows for rows, _ in split_forwards} == {1} and len(split_forwards) == sum(rows for rows, _ in whole_forwards)
    assert len({width for _, width in split_forwards}) > 1  # demonstrations of several lengths, each unpadded
    torch.testing.assert_close(split_losses, whole_losses, rtol=1e-5, atol=0)
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("epoch, ckpt_path", [(1, None), (0, "last.ckpt")])
def test_warmup_skips_resumed_runs(epoch, ckpt_path, monkeypatch):
    warmup = BehaviourCloningWarmup()
    monkeypatch.setattr(warmup, "warm_up", lambda *a, **k: pytest.fail("warm-up ran on a resumed fit"))
    warmup.on_fit_start(SimpleNamespace(current_epoch=epoch, ckpt_path=ckpt_path), None)



def test_warmup_cache_trains_once_and_every_later_fit_starts_from_the_same_weights(tiny_model_dir, tmp_path, monkeypatch):
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1), progress=False)
    trainer = SimpleNamespace(current_epoch=0, ckpt_path=None, datamodule=datamodule, logger=None, is_global_zero=True,
                              precision_plugin=SimpleNamespace(forward_context=contextlib.nullcontext))

    def fit_start(seed: int, epochs: int = 2, init_weights: str | None = None):
        torch.manual_seed(seed)  # a different LoRA initialisation per run
        module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)), init_weights=init_weights)
        module.configure_model()
        warmup = BehaviourCloningWarmup(demonstrations=2, epochs=epochs, lr=1e-2, batch_size=2, progress=False, cache_dir=str(tmp_path / "cache"))
        calls = []
        train = warmup.warm_up
        monkeypatch.setattr(warmup, "warm_up", lambda *a, **k: calls.append(1) or train(*a, **k))
        warmup.on_fit_start(trainer, module)
        return {n: p.detach().clone() for n, p in module.lm.named_parameters() if p.requires_grad}, len(calls), warmup.losses

    first, trained, losses = fit_start(seed=0)
    assert trained == 1 and len(list((tmp_path / "cache").glob("warmup-frozenlake-*.pt"))) == 1
    second, trained_again, cached_losses = fit_start(seed=1)
    assert trained_again == 0 and cached_losses == losses
    assert all(torch.equal(second[n], first[n]) for n in first)  # the seed-1 LoRA init was replaced by the cached weights
    _, trained_other, _ = fit_start(seed=1, epochs=1)  # another setting: another file, trained afresh
    assert trained_other == 1 and len(list((tmp_path / "cache").glob("warmup-frozenlake-*.pt"))) == 2
    # a fit that starts from other weights (e.g. an RWML stage's) warms up from them instead of loading
    # the cache of a fit that started from the base model, which would silently discard them
    earlier = str(next((tmp_path / "cache").glob("warmup-frozenlake-*.pt")))
    from_earlier, trained_from, _ = fit_start(seed=1, init_weights=earlier)
    assert trained_from == 1 and len(list((tmp_path / "cache").glob("warmup-frozenlake-*.pt"))) == 3
    assert any(not torch.equal(from_earlier[n], first[n]) for n in first)
    again, trained_again, _ = fit_start(seed=2, init_weights=earlier)  # the same start: the cache applies
    assert trained_again == 0 and all(torch.equal(again[n], from_earlier[n]) for n in first)

def test_token_logprobs_equal_a_full_log_softmax_at_the_loss_positions(tiny_model_dir):
    """The memory-saving path (logits from the first loss position, log-softmax only where the
    loss reads) gives exactly the log-probs of a plain full-sequence log-softmax."""
    torch.manual_seed(0)
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)))
    module.configure_model()
    datamodule = RolloutDataModule(env="frozenlake", rollout=RolloutSettings(max_steps=3, history_length=1), progress=False)
    demos = BehaviourCloningWarmup(demonstrations=2, progress=False).demonstrations_for_rank(module, datamodule)
    batch = collate(demos, module.tokenizer.pad_token_id)
    with torch.no_grad():
        fast = token_logprobs(module.lm, batch)
        logits = module.lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    full = logits[:, :-1].log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    mask = batch["loss_mask"].bool()
    assert mask.sum() > 0 and torch.equal(fast[~mask], torch.zeros_like(fast[~mask]))
    torch.testing.assert_close(fast[:, 1:][mask[:, 1:]], full[mask[:, 1:]], rtol=1e-5, atol=1e-5)

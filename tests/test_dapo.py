"""DAPO's rollout side: dynamic sampling (rollout/dynamic_sampling.py, through the data module on
a scripted policy and the one-step target environment of tests/learning_env.py), overlong
filtering (a response cut by max_new_tokens gets no policy loss) and the soft overlong
punishment (rollout/overlong.py), against hand-computed values; one tiny fit of the recipe.

The scripted policy answers by the task's target: ``Left`` every episode wins (an all-wins
group), ``Right`` every episode loses, ``Up`` / ``Down`` only episode 0 wins (returns 1, 0: a
group with a signal). Task targets of the data seeds used below (groups 2, group size 2, so
round r ≥ 1's k-th group on rank 0 of 1 has id 2 + 2r + k; ``derive_seed(seed, "train", 0, id)``):

    seed 12: ids 0, 1 → Left, Up;  id 4 → Up
    seed 0:  ids 0, 1 → Right, Left;  ids 4, 5 → Right, Left;  ids 6, 7 → Up, Right;  id 8 → Left
"""
from __future__ import annotations

import contextlib
import re
from types import SimpleNamespace

import pytest
import torch

from paw_lightning.cli import main
from paw_lightning.data import EvaluationSettings, RolloutDataModule, RolloutSettings
from paw_lightning.metrics import episode_metrics
from paw_lightning.module import policy_mask
from paw_lightning.objectives import PolicyObjective
from paw_lightning.rollout.collector import Step, Trajectory, derive_seed
from paw_lightning.rollout.dynamic_sampling import DynamicSampling, has_signal
from paw_lightning.rollout.engine import Generation, GenerationEngine
from paw_lightning.rollout.overlong import overlong_penalty, punish_overlong
from paw_lightning.rollout.played import PlayedEpisodes
from paw_lightning.scale import distributed
from paw_lightning.update import prepare_update

from helpers import ROOT, mlflow_runs, rollout, tiny_args
from learning_env import TargetActionEnv


def target_of(task_seed: int) -> str:
    return TargetActionEnv().reset(task_seed)[0].removeprefix("Target: ")


def by_target(target: str, episode: int) -> bool:
    return target == "Left" or (target in ("Up", "Down") and episode == 0)


class ScriptedPolicy:
    """The data module's ``Policy`` with a scripted engine: row i of a batch is episode
    i mod G of its group (one-step episodes: every episode is active at the one step);
    ``wins(target, episode)`` says whether it answers the target."""

    records_token_stats = False
    trains_world_model = False

    def __init__(self, tokenizer, group_size: int, wins=by_target, truncated: bool = False):
        self.tokenizer, self.group_size, self.wins, self.truncated = tokenizer, group_size, wins, truncated
        self.calls: list[int] = []  # prompts per generate call

    def sampler(self, max_new_tokens: int, token_stats: bool = False):
        return self

    def generating(self):
        return contextlib.nullcontext()

    def generate(self, prompts, temperature, seed, stop="</action>"):
        self.calls.append(len(prompts))
        out = []
        for i, prompt in enumerate(prompts):
            target = re.search(r"Target: (\w+)", prompt).group(1)
            answer = target if self.wins(target, i % self.group_size) else "Wrong"
            out.append(Generation([1, 2], [3, 4], f"<action>{answer}</action>", truncated=self.truncated and i % 2 == 1))
        return out


def datamodule(tokenizer, seed: int, max_extra_rounds: int = 3, wins=by_target, **rollout):
    """A data module on the target environment, attached to a stand-in trainer at epoch 0 whose
    policy is a :class:`ScriptedPolicy`; its ``rounds`` record each round's (group id, task seed) pairs."""
    settings = RolloutSettings(groups=2, group_size=2, max_steps=1, dynamic_sampling=DynamicSampling(True, max_extra_rounds), **rollout)
    dm = RolloutDataModule(env="learning_env.TargetActionEnv", rollout=settings, evaluation=EvaluationSettings(fixed=None), seed=seed, progress=False)  # a scripted policy: no fixed set
    policy = ScriptedPolicy(tokenizer, settings.group_size, wins, truncated=settings.mask_truncated)
    dm.trainer = SimpleNamespace(current_epoch=0, lightning_module=policy, max_epochs=5, max_steps=-1, global_step=0)
    dm.rounds = []
    episodes = dm._episodes

    def recording(split, tasks, *args):
        dm.rounds.append(list(tasks))
        return episodes(split, tasks, *args)

    dm._episodes = recording
    return dm, policy


def groups(played: PlayedEpisodes) -> list[int]:
    return sorted({t.group_id for t in played.trajectories})


# ------------------------------------------------------------------------ dynamic sampling
def test_an_all_wins_group_is_dropped_and_a_new_task_takes_its_place(tokenizer):
    dm, _ = datamodule(tokenizer, seed=12)
    dm.train_dataloader()
    played = dm.played["train"]
    assert [[g for g, _ in tasks] for tasks in dm.rounds] == [[0, 1], [4]]  # one group missing: one more played
    assert [target_of(s) for tasks in dm.rounds for _, s in tasks] == ["Left", "Up", "Up"]
    assert groups(played) == [1, 4]  # group 0 (all won) is gone
    assert [t.traj_id for t in played.trajectories] == [0, 1, 2, 3]  # unique in the update
    assert sorted(t.total_return for t in played.trajectories) == [0.0, 0.0, 1.0, 1.0]
    assert len(played.samples) == 4 and played.samples.info.group_ids.tolist() == [1, 1, 4, 4]
    assert played.metrics["rollout/kept_group_fraction"] == pytest.approx(2 / 3)  # 2 of 3 groups played had a signal
    assert played.metrics["rollout/extra_rounds"] == 1.0
    assert played.metrics["perf/extra_rollout_s"] >= 0.0
    assert played.seconds >= played.metrics["perf/extra_rollout_s"]  # rollout_s includes the extra round
    assert played.response_tokens == 3 * 2 * 2  # every episode played: 3 groups × 2 episodes × 2 tokens
    # train/episode/* describes round 0 (groups 0, 1: Left won twice, Up once = 3/4), not the kept
    # groups 1 and 4 (2/4: a kept group of two always holds one win)
    assert sorted(t.group_id for t in played.policy_episodes) == [0, 0, 1, 1]
    assert episode_metrics(played.policy_episodes)["success_rate"] == 0.75
    assert episode_metrics(played.trajectories)["success_rate"] == 0.5


def test_extra_rounds_play_new_tasks_deterministic_in_seed_and_epoch(tokenizer):
    dm, _ = datamodule(tokenizer, seed=0)
    dm.train_dataloader()
    seeds = [s for tasks in dm.rounds for _, s in tasks]
    assert [[g for g, _ in tasks] for tasks in dm.rounds] == [[0, 1], [4, 5], [6, 7], [8]]  # the cap (3 extra rounds)
    assert seeds == [derive_seed(0, "train", 0, g) for g in (0, 1, 4, 5, 6, 7, 8)] and len(set(seeds)) == 7
    again, _ = datamodule(tokenizer, seed=0)
    again.train_dataloader()
    assert again.rounds == dm.rounds
    again.trainer.current_epoch = 1  # another iteration: other tasks
    again.rounds.clear()
    again.train_dataloader()
    assert not {s for tasks in again.rounds for _, s in tasks} & set(seeds)


def test_the_cap_keeps_what_there_is_and_says_so(tokenizer, capsys):
    """Seed 0: rounds 0 and 1 keep nothing, round 2 one group of two (Up). With 2 extra rounds
    allowed the update holds that one group; with 1, none was kept and the last round's groups train."""
    dm, _ = datamodule(tokenizer, seed=0, max_extra_rounds=2)
    dm.train_dataloader()
    assert groups(dm.played["train"]) == [6] and dm.played["train"].metrics["rollout/extra_rounds"] == 2.0
    assert dm.played["train"].metrics["rollout/kept_group_fraction"] == pytest.approx(1 / 6)
    line = capsys.readouterr().out.strip()
    assert line == ("dynamic sampling: 1 of 2 task groups have differing returns after 2 extra round(s) "
                    "(data.rollout.dynamic_sampling.max_extra_rounds); the update goes on with them")

    dm, _ = datamodule(tokenizer, seed=0, max_extra_rounds=1)
    dm.train_dataloader()
    assert len(dm.rounds) == 2 and groups(dm.played["train"]) == [4, 5]  # the last round's groups, all without a signal
    assert not any(has_signal([t for t in dm.played["train"].trajectories if t.group_id == g]) for g in (4, 5))
    line = capsys.readouterr().out.strip()
    assert line.startswith("dynamic sampling: 0 of 2 task groups have differing returns after 1 extra round(s)")
    assert line.endswith("the update goes on with them; 1 rank(s) with none train on their last round's groups")


def test_the_cap_line_names_the_fallback(tokenizer, capsys):
    dm, _ = datamodule(tokenizer, seed=0, max_extra_rounds=0)
    dm.train_dataloader()
    assert groups(dm.played["train"]) == [0, 1] and len(dm.rounds) == 1
    assert capsys.readouterr().out.strip().endswith("the update goes on with them; 1 rank(s) with none train on their last round's groups")


def test_no_extra_round_when_every_group_has_a_signal(tokenizer, capsys):
    dm, policy = datamodule(tokenizer, seed=12, wins=lambda target, episode: episode == 0)
    dm.train_dataloader()
    assert len(dm.rounds) == 1 and groups(dm.played["train"]) == [0, 1] and policy.calls == [4]
    assert dm.played["train"].metrics == {"rollout/kept_group_fraction": 1.0, "rollout/extra_rounds": 0.0, "perf/extra_rollout_s": 0.0}
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("mine_done, peer_missing, expected_calls", [
    (True, [1, 1, 0], [4, 0, 0]),   # this rank kept its 2 groups at once; the peer needs 2 more rounds
    (False, [0, 0], [4, 4, 4]),     # this rank keeps none (every episode loses); the peer is done
])
def test_ranks_play_the_same_number_of_rounds(tokenizer, monkeypatch, capsys, mine_done, peer_missing, expected_calls):
    """Rank 0 of 2, its peer simulated by the collectives: ``max_across_ranks`` of the groups still
    missing adds the peer's, and the collector's "any episode active" is always True (the peer
    plays its one step). Every round is played on this rank too, with an empty batch when it
    needs nothing, so its generate calls match the peer's: 3 rounds, 3 calls."""
    missing = list(peer_missing)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    monkeypatch.setattr(distributed, "max_across_ranks", lambda v: max(v, missing.pop(0)) if missing else v)
    monkeypatch.setattr(distributed, "any_across_ranks", lambda flag: True)
    monkeypatch.setattr(distributed, "gather_floats", lambda v: [float(v), 0.0])
    wins = (lambda target, episode: episode == 0) if mine_done else (lambda target, episode: False)
    settings = RolloutSettings(groups=4, group_size=2, max_steps=1, dynamic_sampling=DynamicSampling(True, max_extra_rounds=2))
    dm = RolloutDataModule(env="learning_env.TargetActionEnv", rollout=settings, evaluation=EvaluationSettings(fixed=None), seed=3, progress=False)
    policy = ScriptedPolicy(tokenizer, 2, wins)
    dm.trainer = SimpleNamespace(current_epoch=0, lightning_module=policy, max_epochs=5, max_steps=-1, global_step=0)
    dm.train_dataloader()
    played = dm.played["train"]
    assert policy.calls == expected_calls and not missing
    assert played.metrics["rollout/extra_rounds"] == 2.0
    if mine_done:
        assert groups(played) == [0, 1]  # rank 0's share of 4 groups
    else:  # the cap: this rank trains on its last round's 2 groups, ids unique over ranks and rounds
        assert groups(played) == [4 + (2 * 2 + 0) * 2, 4 + (2 * 2 + 0) * 2 + 1] == [12, 13]
        assert "1 rank(s) with none" in capsys.readouterr().out


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="group_size >= 2"):
        RolloutDataModule(rollout=RolloutSettings(group_size=1, dynamic_sampling=DynamicSampling(enabled=True)))
    with pytest.raises(ValueError, match="oversample must be at least 1"):
        RolloutDataModule(rollout=RolloutSettings(dynamic_sampling=DynamicSampling(enabled=True, oversample=0.5)))
    with pytest.raises(ValueError, match="max_extra_rounds must be at least 0"):
        RolloutDataModule(rollout=RolloutSettings(dynamic_sampling=DynamicSampling(enabled=True, max_extra_rounds=-1)))
    RolloutDataModule(rollout=RolloutSettings(group_size=1))  # off: nothing to check
    assert [DynamicSampling(oversample=x).round_size(3) for x in (1.0, 1.5, 2.0)] == [3, 5, 6] and DynamicSampling().round_size(0) == 0


def test_oversampling_plays_more_groups_per_round_and_keeps_the_first(tokenizer):
    """oversample 2: round 0 plays 4 groups (ids 0, 1, then 2 + 0 + k for k = 2, 3 → 4, 5), the
    update takes the first 2 of those with a signal."""
    dm, _ = datamodule(tokenizer, seed=12)
    dm.rollout.dynamic_sampling = DynamicSampling(True, 3, oversample=2.0)
    dm.train_dataloader()
    assert [[g for g, _ in tasks] for tasks in dm.rounds] == [[0, 1, 4, 5]]  # seed 12: Left, Up, Up, … : 2 kept
    assert groups(dm.played["train"]) == [1, 4]


# ------------------------------------------------------------------------ overlong filtering
def test_the_engine_flags_responses_cut_by_the_budget(tokenizer):
    engine = GenerationEngine(model=None, tokenizer=tokenizer, max_new_tokens=4)
    ids = tokenizer.encode("abcd", add_special_tokens=False)
    assert len(ids) == 4  # one token per character
    assert engine.truncated(ids, "abcd", "</action>")  # the whole budget, no stop: cut
    assert not engine.truncated(ids[:3], "abc", "</action>")  # ended below the budget
    assert not engine.truncated(ids[:3] + [tokenizer.eos_token_id], "abc", "</action>")  # end of turn as the last token
    stop = tokenizer.encode("n>", add_special_tokens=False)
    assert not engine.truncated(ids[:2] + stop, "ab</action>", "</action>")  # the stop string as the last tokens


def test_generate_flags_the_rows_the_budget_cut(module):
    """The tiny random model rarely ends a response within 3 tokens: those rows are flagged, and
    every flag agrees with the rule."""
    engine = GenerationEngine(module.lm, module.tokenizer, max_new_tokens=3)
    with module.generating():
        generations = engine.generate(["go", "stop", "wait", "run"], temperature=1.0, seed=0)
    assert any(g.truncated for g in generations)
    for g in generations:
        ended = g.response_ids[-1] == module.tokenizer.eos_token_id or g.text.endswith("</action>")
        assert g.truncated == (len(g.response_ids) == 3 and not ended)


def test_truncated_steps_reach_the_samples_and_leave_the_policy_mask(tokenizer):
    dm, _ = datamodule(tokenizer, seed=12, mask_truncated=True)
    dm.train_dataloader()
    samples = dm.played["train"].samples
    assert samples.truncated.tolist() == [False, True, False, True]  # the scripted engine cut every odd row
    assert dm.played["train"].metrics["rollout/truncated_fraction"] == 0.5
    batch = samples.collate([0, 1, 2, 3])
    assert torch.equal(batch["policy_mask"], batch["action_mask"] & torch.tensor([True, False, True, False])[:, None])
    assert batch["policy_mask"][0].sum() == 2 and not batch["policy_mask"][1].any()


def test_a_truncated_response_gets_no_policy_loss_by_hand():
    """Two samples; sample 1 was cut by the budget. Sample 0: A = 1, two action tokens with ratios
    1.1 and 0.9 (inside [0.8, 1.28]), so the token-mean surrogate is −(1.1 + 0.9) / 2 = −1.0.
    Sample 1 (A = −2, three tokens, ratio 1.5) would add 3 · min(1.5 · −2, 1.28 · −2) = 3 · −3 = −9
    → −(2 − 9) / 5 = 1.4 without the mask; masked, it is out of the numerator and the denominator."""
    objective = PolicyObjective(kl_coef=0.0, clip_low=0.2, clip_high=0.28)
    action = torch.tensor([[False, True, True, False], [False, True, True, True]])
    old = torch.zeros(2, 4)
    new = torch.tensor([[0.0, 1.1, 0.9, 0.0], [0.0, 1.5, 1.5, 1.5]]).log()
    advantages = torch.tensor([1.0, -2.0])
    batch = {"action_mask": action, "policy_mask": action & torch.tensor([True, False])[:, None]}
    masked = objective(new, old, advantages, policy_mask(batch))
    assert masked.loss.item() == pytest.approx(-1.0)
    assert objective(new, old, advantages, action).loss.item() == pytest.approx(-(1.1 + 0.9 - 9.0) / 5)
    assert policy_mask({"action_mask": action}) is action  # no policy_mask: every action token


def test_masking_equals_leaving_the_samples_out_of_the_policy_loss(module):
    """Through the module: the loss and gradient of a batch whose truncated samples are masked equal
    those of the batch without them (advantages, π_old and π_ref from the same update)."""
    buffer = rollout(module)
    prepare_update(module.update_inputs(), buffer)
    cut = torch.zeros(len(buffer), dtype=torch.bool)
    cut[[1, 4, 9]] = True
    buffer.no_policy_loss = cut

    def loss_and_grads(indices):
        module.zero_grad(set_to_none=True)
        out = module.compute_loss(buffer.collate(indices))
        out.loss.backward()
        return out, [p.grad.clone() for p in module.parameters() if p.requires_grad]

    (masked, masked_grads), (without, without_grads) = loss_and_grads(list(range(len(buffer)))), loss_and_grads((~cut).nonzero().flatten().tolist())
    buffer.no_policy_loss = None
    unmasked, _ = loss_and_grads(list(range(len(buffer))))
    module.zero_grad(set_to_none=True)
    torch.testing.assert_close(masked.loss, without.loss, rtol=1e-5, atol=1e-7)
    for key in ("policy/loss", "policy/kl", "policy/advantage_mean"):
        torch.testing.assert_close(masked.metrics[key], without.metrics[key], rtol=1e-5, atol=1e-7)
    for a, b in zip(masked_grads, without_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert not torch.allclose(unmasked.loss, masked.loss)


def test_soft_overlong_punishment_by_hand():
    """L_max 10, L_cache 4: no penalty up to 6 tokens, then (6 − |y|) / 4, −1 at the budget."""
    assert [overlong_penalty(n, 10, 4) for n in (3, 6, 7, 8, 10, 11)] == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0]
    assert overlong_penalty(8, 10, 4, factor=0.5) == -0.25 and overlong_penalty(10, 10, 0) == 0.0
    traj = Trajectory(0, 0, 0, [Step("o", [1], [2] * 8, "r", None, -0.1, "o2", True, -0.1)])
    punish_overlong([traj], 10, 4)
    assert traj.steps[0].reward == pytest.approx(-0.6) and traj.steps[0].penalty == pytest.approx(-0.6)  # −0.1 invalid, −0.5 overlong


def test_the_punishment_enters_the_returns_dynamic_sampling_judges(tokenizer):
    """The scripted responses have 2 tokens; budget 3, L_cache 2: each step gets (1 − 2) / 2 = −0.5."""
    dm, _ = datamodule(tokenizer, seed=12, max_new_tokens=3, overlong_buffer=2)
    dm.train_dataloader()
    played = dm.played["train"]
    assert groups(played) == [1, 4]  # the all-wins group still has equal returns (0.5 each)
    assert sorted(t.total_return for t in played.trajectories) == [-0.5, -0.5, 0.5, 0.5]
    assert played.metrics["rollout/overlong_penalty_mean"] == -0.5
    with pytest.raises(ValueError, match="overlong_buffer must be between 0"):
        RolloutDataModule(rollout=RolloutSettings(max_new_tokens=8, overlong_buffer=9))


# ------------------------------------------------------------------------ the recipe
@pytest.mark.slow
def test_dapo_overlay_trains(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """A tiny fit with configs/algorithms/dapo.yaml: the untrained model's episodes all lose alike,
    so dynamic sampling reaches its cap and says so, and the run logs DAPO's metrics."""
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/algorithms/dapo.yaml"),
                           "-c", str(ROOT / "configs/objectives/vanilla.yaml"), "--trainer.max_epochs=1",
                           "--trainer.check_val_every_n_epoch=10", "--data.rollout.dynamic_sampling.max_extra_rounds=1")])
    client, (run,) = mlflow_runs(tmp_path)
    metrics = run.data.metrics
    for key in ("train/rollout/kept_group_fraction", "train/rollout/extra_rounds", "train/perf/extra_rollout_s",
                "train/rollout/truncated_fraction", "train/perf/rollout_s", "train/policy/clip_frac"):
        assert key in metrics, key
    assert "train/policy/kl" not in metrics  # DAPO has no KL term
    assert 0.0 <= metrics["train/rollout/kept_group_fraction"] <= 1.0 and metrics["train/rollout/extra_rounds"] in (0.0, 1.0)
    if metrics["train/rollout/kept_group_fraction"] == 0.0:  # the seeded run: every episode fails alike
        assert "dynamic sampling: 0 of 2 task groups have differing returns after 1 extra round(s)" in capsys.readouterr().out

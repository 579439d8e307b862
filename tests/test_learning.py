"""End to end, RL must raise the reward: a CI-sized learning test (about 20 s per seed on one CPU thread).

Setup (``SETTINGS``, ``WARMUP``):

- environment: ``tests/learning_env.py`` ``TargetActionEnv(targets=[Left])``, one step,
  observation ``Target: Left``, admissible ``Up``/``Down``/``Left``/``Right``; ``Left`` wins 1,
  anything else 0 (a four-armed bandit with one good arm). The copy task (all four targets)
  learned too slowly and unsteadily for CI: held-out success 0.19–0.59 after 30 updates.
- model: the tiny in-code Llama, weights drawn at std 0.3 (``build_tiny_model_dir(initializer_range=0.3)``).
- format warm-up: ``BehaviourCloningWarmup`` with ``source: random_valid`` (uniform admissible
  actions in the exact response format), so the first rollout wins about 1/4 (0.28, 0.31);
  the test asserts it is at most 0.5, so the rise is RL's, not the warm-up's.
- RL: vanilla GRPO without KL, 8 groups × 4 episodes per update, the whole update as one
  mini-batch (32 samples), 2 PPO epochs, AdamW lr 1e-3, temperature 1, 10 updates; one
  validation at the end on 16 held-out task seeds at temperature 0.4.

Asserted: the training return of the last 3 rollouts exceeds the first rollout's (played
before any update) by 0.4, and the held-out success at the end is at least 0.75.

Observed (train return: first rollout → mean of the last 3, then the held-out success at the
end; seeds 0 | 1). Each break is a one-line change of the source, applied for that run only:

  correct code                                           0.281 → 0.947, 1.00 | 0.312 → 0.968, 1.00  passes
  advantage sign: grpo_advantages returns -per_traj[…]   0.281 → -0.004, 0.00 | 0.312 → 0.000, 0.00 FAILS
  surrogate sign: `surrogate = agg(…)` (minus dropped)   0.281 → -0.002, 0.00 | 0.312 → -0.094, 0.00 FAILS
  action mask on the prompt: build_buffer sets
    `amask[:n_prompt] = True`                            0.281 → 0.249, 0.25 | 0.312 → 0.260, 0.12  FAILS
  action mask: compute_loss passes batch["obs_mask"]     0.281 → 0.249, 0.25 | 0.312 → 0.260, 0.12  FAILS
  aggregation: the advantage factored out of the token
    mean, `-agg(min(ρ, clip(ρ))) * adv.mean()`
    instead of `-agg(min(ρ·A, clip(ρ)·A))`               0.281 → 0.249, 0.25 | 0.312 → 0.260, 0.12  FAILS
  token sum instead of token mean (aggregate returns
    `total`)                                             0.281 → 0.978, 1.00 | 0.312 → 1.000, 1.00  passes
  action mask off by one (last prompt token in, eos out) 0.281 → 0.947, 1.00 | 0.312 → 0.968, 1.00  passes

The three "0.249 / 0.260" breaks leave the weights unchanged: a mask on the prompt gets no
gradient (``PaWModule.token_outputs`` has no logits before the mini-batch's shortest prompt),
vanilla RL's ``obs_mask`` is empty, and GRPO's advantages of a whole update average to 0.
That last one is why the update is a single mini-batch: with two mini-batches of 16 (and
1 PPO epoch) the factored-advantage break still learned (0.281 → 0.83: each half's mean
advantage is non-zero and grows with its wins, a batch-level REINFORCE). Not caught, by design: a token *sum* only
rescales the loss by a constant, which AdamW's step ignores (``tests/test_policy_objective.py``
checks ``aggregate``'s values), and the off-by-one mask keeps the action token in the loss.
"""
from __future__ import annotations

import functools
import statistics

import pytest
from paw_lightning.cli import main
from paw_lightning.testing import build_tiny_model_dir
from paw_lightning.training.format_drift import FormatDriftWatch

from helpers import ROOT, metric_history, mlflow_runs, tiny_args

TARGET = "Left"  # the one action that wins (tests/learning_env.py with targets=[TARGET])
WARMUP = """
stages:
  warmup:
    class_path: paw_lightning.callbacks.BehaviourCloningWarmup
    init_args: {source: random_valid, reason: ok, demonstrations: 32, epochs: 20, lr: 1.0e-2, batch_size: 8, seed: 0, progress: false}
"""
SETTINGS = (
    "--data.env=learning_env.TargetActionEnv", f"--data.env_kwargs={{targets: [{TARGET}]}}",
    "--data.rollout.max_steps=1", "--data.rollout.prompt_style=compact", "--data.rollout.history_length=0", "--data.rollout.max_new_tokens=12",
    "--data.rollout.groups=8", "--data.rollout.group_size=4", "--data.mini_batch_size=32", "--data.ppo_epochs=2", "--data.evaluation.groups=16",
    "--model.policy_objective.init_args.kl_coef=0", "--model.optimizer.init_args.lr=1.0e-3",
    "--trainer.max_epochs=10", "--trainer.check_val_every_n_epoch=10", "--trainer.logger.init_args.experiment_name=learning",
)  # fmt: skip


@pytest.fixture(scope="module")
def learnable_model_dir(tmp_path_factory):
    """The tiny test model with weights at std 0.3 (see ``build_tiny_model_dir``): learnable by LoRA."""
    return build_tiny_model_dir(tmp_path_factory.mktemp("learnable_tiny_model"), initializer_range=0.3)


def learning_run(model_dir, workdir, *extra: str) -> dict[str, list[float]]:
    overlay = workdir / "warmup.yaml"
    overlay.write_text(WARMUP)
    main(["fit", *tiny_args(model_dir, workdir, "-c", str(ROOT / "configs/objectives/vanilla.yaml"), "-c", str(overlay), *SETTINGS, *extra)])
    client, (run,) = mlflow_runs(workdir, "learning")
    keys = ("train/episode/success_rate", "train/episode/return_mean", "train/episode/invalid_rate", "val/episode/success_rate")
    return {key: metric_history(client, run, key) for key in keys}


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_rl_raises_the_reward(learnable_model_dir, tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    history = learning_run(learnable_model_dir, tmp_path, f"--seed_everything={seed}")
    returns, success, val = history["train/episode/return_mean"], history["train/episode/success_rate"], history["val/episode/success_rate"]
    first, last = returns[0], statistics.mean(returns[-3:])
    assert success[0] <= 0.5, f"the warm-up alone already wins {success[0]:.0%} of the first rollout: RL would have nothing to show"
    assert last >= first + 0.4, f"train return {first:.3f} before the first update -> {last:.3f} over the last 3 updates: {history}"
    assert val[-1] >= 0.75, f"held-out success after training {val[-1]:.0%}: {history}"


DRIFT = (  # a task nobody can win (every advantage 0 without the guard) and an entropy bonus that flattens every token, the format's too
    "--data.env_kwargs={targets: [Left], winnable: false}", "--data.rollout.invalid_penalty=0",
    "--model.policy_objective.init_args.entropy_coef=0.1",
)  # fmt: skip


@pytest.mark.slow
def test_the_format_guard_pulls_a_drifting_format_back(learnable_model_dir, tmp_path, monkeypatch, capsys):
    """The old recipe (no guard, no penalty) against the same run with ``invalid_advantage: -1``.
    Observed, train invalid rate per update (seeds 0 | 1): without the guard 0, 0, 0, .94, .81, .81,
    .84, .97, .81, 1.0 | 0, 0, .91, .97, .94, 1.0, .97, .91, .91, .88; with it 0, 0, 0, .94, .84,
    .75, .31, .09, .06, .03 | 0, 0, .91, .84, .75, .53, .31, .09, .06, 0. The run without the
    guard also prints the drift warning (its patience cut to 1 rise, the first jump)."""
    monkeypatch.setattr("paw_lightning.training.rollout_watch.FormatDriftWatch", functools.partial(FormatDriftWatch, patience=1))
    runs = {}
    for name, extra in {"old": (), "guard": ("--model.policy_objective.init_args.invalid_advantage=-1",)}.items():
        workdir = tmp_path / name
        workdir.mkdir()
        monkeypatch.chdir(workdir)
        runs[name] = learning_run(learnable_model_dir, workdir, *DRIFT, *extra)["train/episode/invalid_rate"]
        if name == "old":
            assert "warning: the policy's action format is drifting" in capsys.readouterr().out
    old, guard = (statistics.mean(runs[name][-3:]) for name in ("old", "guard"))
    assert max(runs["old"]) > 0.5, f"the entropy bonus no longer breaks the format: {runs}"
    assert old >= 0.6 and guard <= 0.2, f"invalid rate over the last 3 updates: {old:.2f} without the guard, {guard:.2f} with it: {runs}"

"""GiGPO's verl-agent switches (``episode_level``, ``penalty_mode``) against numbers computed by
hand, the ``gigpo_verl.yaml`` overlay, and the penalty's way from the collector to ``StepInfo``."""
from __future__ import annotations

import pytest
import torch
import yaml
from jsonargparse import ArgumentParser

from paw_lightning.cli import main
from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.model import LMConfig, load_tokenizer
from paw_lightning.objectives import GRPO, GiGPO, PolicyObjective, StepInfo
from paw_lightning.objectives.gigpo import discounted_returns, episode_advantages, penalised_step_returns
from paw_lightning.rollout.collector import Collector
from paw_lightning.rollout.engine import Generation
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.samples import build_buffer

from helpers import ROOT, mlflow_runs, tiny_args

# METHODS.md §2: one group, a 1-step win (R = 10) and a 3-step loss (R = 0). Every anchor is
# distinct, so every bucket is a singleton and A^S = 0: the estimator returns A^E alone.
#   per trajectory: mean 5, std sqrt((25 + 25) / 1) = 7.071068 -> ±0.707107
#   over steps: scores [10, 0, 0, 0], mean 2.5, deviations [7.5, -2.5, -2.5, -2.5],
#     squares 56.25 + 3 * 6.25 = 75, / 3 = 25, std 5 -> [1.5, -0.5, -0.5, -0.5]
WIN_AND_LONG_LOSS = StepInfo(
    group_ids=torch.zeros(4, dtype=torch.long),
    traj_ids=torch.tensor([0, 1, 1, 1]),
    step_ids=torch.tensor([0, 0, 1, 2]),
    rewards=torch.tensor([10.0, 0.0, 0.0, 0.0]),
    anchor_obs=["W0", "L0", "L1", "L2"],
)

# One group, γ = 0.95, two 3-step trajectories (p_t = the invalid-action penalty, e_t = r_t − p_t):
#   trajectory 0: anchors S K F, env rewards e = [0, 0, 10], its middle step invalid: p = [0, -0.1, 0],
#                 so r = [0, -0.1, 10]; R_env(τ) = 10, R(τ) = 9.9
#   trajectory 1: anchors S K K (stuck), e = r = [0, 0, 0], no penalty; R = 0
# Step returns, in_reward (penalty inside r_t, discounted into step 0):
#   R_2 = 10, R_1 = -0.1 + 0.95 * 10 = 9.4, R_0 = 0 + 0.95 * 9.4 = 8.93
# Step returns, after_discount (discount e, then add the step's own p):
#   env: R_2 = 10, R_1 = 0 + 0.95 * 10 = 9.5, R_0 = 0.95 * 9.5 = 9.025; + p: [9.025, 9.4, 10]
# Episode scores, after_discount: S_t = R_env(τ) + p_t = [10, 9.9, 10] and [0, 0, 0]
# Buckets: S {R_0 of τ0, 0}, K {R_1 of τ0, 0, 0}, F {10} (a singleton -> A^S = 0).
INVALID_MIDDLE = StepInfo(
    group_ids=torch.zeros(6, dtype=torch.long),
    traj_ids=torch.tensor([0, 0, 0, 1, 1, 1]),
    step_ids=torch.tensor([0, 1, 2, 0, 1, 2]),
    rewards=torch.tensor([0.0, -0.1, 10.0, 0.0, 0.0, 0.0]),
    anchor_obs=["S", "K", "F", "S", "K", "K"],
    penalties=torch.tensor([0.0, -0.1, 0.0, 0.0, 0.0, 0.0]),
)


def test_methods_example_per_trajectory_vs_over_steps():
    per_trajectory = GiGPO(eps=0.0)(WIN_AND_LONG_LOSS)
    over_steps = GiGPO(eps=0.0, episode_level="step")(WIN_AND_LONG_LOSS)
    torch.testing.assert_close(per_trajectory, torch.tensor([0.707107, -0.707107, -0.707107, -0.707107]))
    torch.testing.assert_close(over_steps, torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # the step-level A^E is GRPO's step level (the same code)
    assert torch.equal(GiGPO(omega=0.0, episode_level="step")(WIN_AND_LONG_LOSS), GRPO(level="step")(WIN_AND_LONG_LOSS))
    # a penalty-free StepInfo: after_discount changes nothing
    for level in ("trajectory", "step"):
        assert torch.equal(GiGPO(episode_level=level, penalty_mode="after_discount")(WIN_AND_LONG_LOSS),
                           GiGPO(episode_level=level)(WIN_AND_LONG_LOSS))


def test_penalty_after_discounting_step_returns():
    info = INVALID_MIDDLE
    in_reward = discounted_returns(info.rewards, info.traj_ids, info.step_ids, gamma=0.95)
    after = penalised_step_returns(info.env_rewards(), info.step_penalties(), info.traj_ids, info.step_ids, gamma=0.95)
    torch.testing.assert_close(in_reward, torch.tensor([8.93, 9.4, 10.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(after, torch.tensor([9.025, 9.4, 10.0, 0.0, 0.0, 0.0]))
    torch.testing.assert_close(info.env_rewards(), torch.tensor([0.0, 0.0, 10.0, 0.0, 0.0, 0.0]))


def test_penalty_after_discounting_mean_norm_per_trajectory():
    # step_norm mean_norm and no episode std, so every number is a plain difference.
    # in_reward: A^E over R(τ) = [9.9, 0]: mean 4.95 -> ±4.95
    #   A^S: S {8.93, 0} mean 4.465 -> ±4.465; K {9.4, 0, 0} mean 3.133333 -> [6.266667, -3.133333, -3.133333]; F -> 0
    #   A: τ0 [4.95 + 4.465, 4.95 + 6.266667, 4.95] = [9.415, 11.216667, 4.95]
    #      τ1 [-4.95 - 4.465, -4.95 - 3.133333, -4.95 - 3.133333] = [-9.415, -8.083333, -8.083333]
    # after_discount: A^E mean over R_env(τ) = [10, 0] is 5, applied to S_t: [5, 4.9, 5] and [-5, -5, -5]
    #   A^S: S {9.025, 0} mean 4.5125 -> ±4.5125; K and F as above
    #   A: τ0 [5 + 4.5125, 4.9 + 6.266667, 5] = [9.5125, 11.166667, 5]
    #      τ1 [-5 - 4.5125, -5 - 3.133333, -5 - 3.133333] = [-9.5125, -8.133333, -8.133333]
    kwargs = dict(step_norm="mean_norm", episode_norm_by_std=False)
    in_reward = GiGPO(**kwargs)(INVALID_MIDDLE)
    after = GiGPO(**kwargs, penalty_mode="after_discount")(INVALID_MIDDLE)
    torch.testing.assert_close(in_reward, torch.tensor([9.415, 11.216667, 4.95, -9.415, -8.083333, -8.083333]))
    torch.testing.assert_close(after, torch.tensor([9.5125, 11.166667, 5.0, -9.5125, -8.133333, -8.133333]))


def test_released_code_switches_together():
    # episode_level step + after_discount + mean_std_norm (gigpo_verl.yaml), eps = 0:
    #   A^E over the six scores S_t = [10, 9.9, 10, 0, 0, 0]: mean 29.9 / 6 = 4.983333,
    #     deviations [5.016667, 4.916667, 5.016667, -4.983333 x3],
    #     squares 25.166944 + 24.173611 + 25.166944 + 3 * 24.833611 = 149.008333, / 5 = 29.801667, std 5.459090
    #     -> [0.918957, 0.900638, 0.918957, -0.912851 x3]
    #   A^S: S {9.025, 0} -> ±0.707107; K {9.4, 0, 0}: mean 3.133333, std sqrt((39.271111 + 2 * 9.817778) / 2)
    #     = 5.427092 -> [1.154701, -0.577350, -0.577350]; F {10} -> 0
    #   A: τ0 [0.918957 + 0.707107, 0.900638 + 1.154701, 0.918957] = [1.626064, 2.055339, 0.918957]
    #      τ1 [-0.912851 - 0.707107, -0.912851 - 0.577350 x2] = [-1.619958, -1.490201, -1.490201]
    estimator = GiGPO(eps=0.0, episode_level="step", penalty_mode="after_discount")
    expected = torch.tensor([1.626064, 2.055339, 0.918957, -1.619958, -1.490201, -1.490201])
    torch.testing.assert_close(estimator(INVALID_MIDDLE), expected, atol=1e-5, rtol=0)


def test_after_discount_per_trajectory_statistics_and_equal_groups():
    # A^E alone (episode_advantages), per trajectory, with std (eps = 0):
    #   R_env(τ) = [10, 0]: mean 5, std 7.071068; S_t - 5 = [5, 4.9, 5, -5, -5, -5]
    #   -> [0.707107, 0.692965, 0.707107, -0.707107 x3]
    info = INVALID_MIDDLE
    adv = episode_advantages(info.trajectory_returns(info.env_rewards()), info.group_ids, info.traj_ids,
                             own_penalties=info.step_penalties(), eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([0.707107, 0.692965, 0.707107, -0.707107, -0.707107, -0.707107]))
    # Two failures, one with an invalid step: equal environment returns [0, 0] -> A^E = 0 per trajectory
    # (no 0/ε blow-up); over steps the scores [-0.1, 0, 0, 0] differ: mean -0.025, deviations
    # [-0.075, 0.025 x3], squares 0.005625 + 3 * 0.000625 = 0.0075, / 3 = 0.0025, std 0.05 -> [-1.5, 0.5, 0.5, 0.5]
    fails = StepInfo(
        group_ids=torch.zeros(4, dtype=torch.long), traj_ids=torch.tensor([0, 0, 1, 1]), step_ids=torch.tensor([0, 1, 0, 1]),
        rewards=torch.tensor([-0.1, 0.0, 0.0, 0.0]), anchor_obs=["a", "b", "c", "d"], penalties=torch.tensor([-0.1, 0.0, 0.0, 0.0]),
    )
    assert torch.equal(GiGPO(penalty_mode="after_discount")(fails), torch.zeros(4))
    torch.testing.assert_close(GiGPO(eps=0.0, episode_level="step", penalty_mode="after_discount")(fails),
                               torch.tensor([-1.5, 0.5, 0.5, 0.5]))


def _reference_released_code(info: StepInfo, gamma: float) -> torch.Tensor:
    """An independent, loop-by-loop statement of verl-agent's default GiGPO (cross-step episode
    statistics, penalty after discounting, mean_std_norm, eps = 0): score_i = Σ env rewards of
    its trajectory + p_i; R_i = discounted env return + p_i; a lone or all-equal set gives 0."""
    rows = list(range(len(info.rewards)))
    env, pen = info.env_rewards().tolist(), info.step_penalties().tolist()
    traj, step, group = info.traj_ids.tolist(), info.step_ids.tolist(), info.group_ids.tolist()

    def normalise(values, keys):
        out = []
        for i in rows:
            members = torch.tensor([values[j] for j in rows if keys[j] == keys[i]], dtype=torch.float64)
            equal = bool((members == members[0]).all())
            out.append(0.0 if equal else (values[i] - members.mean().item()) / members.std().item())
        return out

    score = [sum(env[j] for j in rows if traj[j] == traj[i]) + pen[i] for i in rows]
    ret = [sum(gamma ** (step[j] - step[i]) * env[j] for j in rows if traj[j] == traj[i] and step[j] >= step[i]) + pen[i] for i in rows]
    bucket = [(group[i], info.anchor_obs[i]) for i in rows]
    return torch.tensor([a + s for a, s in zip(normalise(score, group), normalise(ret, bucket))], dtype=torch.float64)


def test_released_code_matches_a_loop_reference():
    generator = torch.Generator().manual_seed(0)
    group, traj, step, env, pen, obs = [], [], [], [], [], []
    for t in range(8):
        length = int(torch.randint(1, 5, (1,), generator=generator))
        for k in range(length):
            group.append(t % 2)
            traj.append(t)
            step.append(k)
            env.append(10.0 * float(torch.rand(1, generator=generator)) if k == length - 1 else 0.0)
            pen.append(-0.1 if float(torch.rand(1, generator=generator)) < 0.3 else 0.0)
            obs.append(f"room {k}" if float(torch.rand(1, generator=generator)) < 0.7 else f"elsewhere {t} {k}")
    env_t, pen_t = torch.tensor(env, dtype=torch.float64), torch.tensor(pen, dtype=torch.float64)
    info = StepInfo(torch.tensor(group), torch.tensor(traj), torch.tensor(step), env_t + pen_t, obs, penalties=pen_t)
    expected = _reference_released_code(info, gamma=0.95)
    actual = GiGPO(eps=0.0, episode_level="step", penalty_mode="after_discount")(info)
    assert (expected != 0).sum() > len(expected) // 2  # mostly non-trivial buckets
    torch.testing.assert_close(actual, expected)


def test_bad_switches_are_rejected():
    with pytest.raises(ValueError, match="episode_level must be 'trajectory' or 'step'"):
        GiGPO(episode_level="steps")
    with pytest.raises(ValueError, match="penalty_mode must be 'in_reward' or 'after_discount'"):
        GiGPO(penalty_mode="reward")
    bad = StepInfo(INVALID_MIDDLE.group_ids, INVALID_MIDDLE.traj_ids, INVALID_MIDDLE.step_ids, INVALID_MIDDLE.rewards,
                   INVALID_MIDDLE.anchor_obs, penalties=torch.zeros(5))
    with pytest.raises(ValueError, match="one penalty per step sample"):
        GiGPO(penalty_mode="after_discount")(bad)


def _overlay_advantage(name: str) -> dict:
    return yaml.safe_load((ROOT / f"configs/algorithms/{name}.yaml").read_text())["model"]["policy_objective"]["init_args"]["advantage"]


def test_gigpo_verl_overlay_differs_from_gigpo_only_in_the_switches():
    verl, plain = _overlay_advantage("gigpo_verl"), _overlay_advantage("gigpo")
    assert verl["class_path"] == plain["class_path"] == "paw_lightning.objectives.GiGPO"
    extra = {k: v for k, v in verl["init_args"].items() if plain["init_args"].get(k) != v}
    assert extra == {"episode_level": "step", "penalty_mode": "after_discount"}
    header = [line for line in (ROOT / "configs/algorithms/gigpo_verl.yaml").read_text().splitlines() if line.startswith("#")]
    assert any("configs/algorithms/gigpo_verl.yaml" in line and "paw_lightning fit" in line for line in header)
    # the overlay's estimator instantiates through the PolicyObjective's YAML options
    parser = ArgumentParser()
    parser.add_class_arguments(PolicyObjective, "policy")
    cfg = parser.parse_object({"policy": {"kl_coef": 0.0, "advantage": verl}})
    adv = parser.instantiate_classes(cfg).policy.advantage
    assert isinstance(adv, GiGPO) and (adv.episode_level, adv.penalty_mode, adv.step_norm, adv.gamma) == ("step", "after_discount", "mean_std_norm", 0.95)


def test_gigpo_verl_overlay_composes_through_the_cli(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "-c", str(ROOT / "configs/frozenlake.yaml"), "-c", str(ROOT / "configs/algorithms/gigpo_verl.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    advantage = yaml.safe_load(capsys.readouterr().out)["model"]["policy_objective"]["init_args"]["advantage"]
    assert advantage["class_path"] == "paw_lightning.objectives.GiGPO"
    assert (advantage["init_args"]["episode_level"], advantage["init_args"]["penalty_mode"]) == ("step", "after_discount")


@pytest.mark.slow
def test_gigpo_verl_overlay_trains(tiny_model_dir, tmp_path, monkeypatch):
    # a tiny CPU fit: the collector's penalties reach the estimator and GiGPO logs its diagnostics
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(tiny_model_dir, tmp_path, "-c", str(ROOT / "configs/algorithms/gigpo_verl.yaml"),
                           "-c", str(ROOT / "configs/objectives/vanilla.yaml"), "--trainer.max_epochs=1",
                           "--trainer.check_val_every_n_epoch=10")])
    _, (run,) = mlflow_runs(tmp_path)
    for key in ("train/gigpo/anchor_group_size_mean", "train/policy/advantage_std"):
        assert key in run.data.metrics, key


class _ScriptedEngine:
    """The first response of every episode is invalid; then the moves of ``plan``."""

    def __init__(self, plan: list[str]):
        self.plan, self.calls = plan, 0

    def generate(self, prompts, temperature, seed, stop="</action>"):
        self.calls += 1
        text = "I am thinking" if self.calls == 1 else f"<action>{self.plan[self.calls - 2]}</action>"
        return [Generation([1, 2, 3], [4, 5], text) for _ in prompts]


def test_collector_keeps_the_penalty_apart_for_the_buffer(tiny_model_dir):
    # FrozenLake task 5 solved by its BFS plan (as in test_rollout), after one invalid first step:
    # step 0 r = -0.1 (penalty -0.1, env reward 0), then the plan's moves with no penalty, the last one wins (r = 1).
    factory = make_env_factory("frozenlake")
    env = factory()
    env.reset(5)
    plan = env.solve()
    pool = EnvPool(factory, 2)
    collector = Collector(pool, _ScriptedEngine(plan), PromptBuilder("FrozenLake"), max_steps=len(plan) + 3, invalid_penalty=-0.1)
    trajs = collector.collect([(0, 5)], group_size=2, temperature=1.0, seed=0, progress=False)
    pool.close()
    n = len(plan) + 1
    for traj in trajs:
        assert [s.action for s in traj.steps] == [None, *plan] and traj.won
        assert [s.penalty for s in traj.steps] == [-0.1] + [0.0] * len(plan)
        assert [s.reward for s in traj.steps] == [-0.1] + [0.0] * (len(plan) - 1) + [1.0]
    info = build_buffer(trajs, load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))).info
    penalties = torch.tensor(([-0.1] + [0.0] * len(plan)) * 2)
    torch.testing.assert_close(info.penalties, penalties)
    torch.testing.assert_close(info.env_rewards(), torch.tensor(([0.0] * (n - 1) + [1.0]) * 2))

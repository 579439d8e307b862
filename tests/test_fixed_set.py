"""The fixed held-out transitions (paw_lightning.fixed_set): what they hold, that they do not move
with the policy, that their metrics are what a direct forward gives, the cache and the
checkpoint, and that bf16-mixed learns the world model on them as float32 does."""
from __future__ import annotations

import math

import pytest
import torch
from lightning.pytorch import Callback

from paw_lightning.cli import PawCLI, main
from paw_lightning.demonstrations import REASON
from paw_lightning.envs import make_env_factory
from paw_lightning.evaluation import fixed_set_quality
from paw_lightning.fixed_set import FixedSet, FixedSetSettings, build_source, keep_spread, scripted_trajectories
from paw_lightning.objectives import WorldModelObjective
from paw_lightning.objectives.balancing import FixedLambda
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.rollout.prompts import PromptBuilder
from paw_lightning.rollout.samples import build_buffer

from helpers import make_module, metric_history, mlflow_runs, tiny_args


def frozenlake_sources(tokenizer, task_seeds=(11, 12, 13)):
    env, prompt = make_env_factory("frozenlake")(), PromptBuilder("FrozenLake", history_length=1)
    return {source: scripted_trajectories(env, tokenizer, prompt, list(task_seeds), source, seed=0, max_steps=4) for source in ("expert", "random")}


# ------------------------------------------------------------------ settings
@pytest.mark.parametrize("kwargs, message", [
    ({"sources": ["oracle"]}, "unknown source 'oracle'"),
    ({"sources": ["expert", "expert"]}, "at most once"),
    ({"sources": []}, "at least one"),
    ({"tasks": 0}, "tasks must be at least 1"),
    ({"transitions": 0}, "transitions must be at least 1"),
    ({"predict": -1}, "predict must be at least 0"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FixedSetSettings(**kwargs)


# ------------------------------------------------------------------ what the set holds
def test_scripted_sources_play_in_the_policy_format_and_repeat_exactly(tokenizer):
    first, again = frozenlake_sources(tokenizer), frozenlake_sources(tokenizer)
    assert [FixedSet("val", first, {}).state()] == [FixedSet("val", again, {}).state()]  # same seeds, same transitions
    env = make_env_factory("frozenlake")()
    for traj in first["expert"]:
        obs, _ = env.reset(traj.task_seed, 0)
        for k, step in enumerate(traj.steps):  # the expert's plan, replayed: every o_t and o_{t+1} is the environment's
            assert step.observation == obs and step.response == f"<think>{REASON}</think><action>{step.action}</action>"
            obs, _, done, _ = env.step(step.action)
            last = k == len(traj.steps) - 1
            assert step.next_observation == obs and step.done == last and (done or len(traj.steps) == 4 or not last)  # done: the episode's last step, as the collector marks it
    assert [len(t.steps) for t in first["random"]] and all(s.action for t in first["random"] for s in t.steps)


def test_keep_spread_keeps_n_steps_evenly_in_order():
    trajs = [Trajectory(g, g, g, [Step(f"o{g}{t}", [1], [2], "", "a", 0.0, "x", False) for t in range(n)]) for g, n in enumerate((3, 1, 4))]
    kept = keep_spread(trajs, 4)  # 8 steps, indices 0, 2.33→2, 4.67→5, 7
    assert [(t.group_id, [s.observation for s in t.steps]) for t in kept] == [(0, ["o00", "o02"]), (2, ["o21", "o23"])]
    assert keep_spread(trajs, 100) == trajs


def test_a_source_is_played_once_then_read_from_the_cache(tokenizer, tmp_path):
    plays = []

    def play(source, seeds):
        plays.append(seeds)
        return [Trajectory(0, 0, seeds[0], [Step("o", [1, 2], [3], "r", "a", 0.0, "next", True)])]

    settings = FixedSetSettings(tasks=2, cache_dir=str(tmp_path))
    first, key = build_source("val", "start_policy", settings, {"weights": "w1"}, play)
    again, same_key = build_source("val", "start_policy", settings, {"weights": "w1"}, play)
    assert len(plays) == 1 and key == same_key and [t.steps for t in again] == [t.steps for t in first]
    _, other = build_source("val", "start_policy", settings, {"weights": "w2"}, play)  # other starting weights: played again
    assert len(plays) == 2 and other != key
    fixed = FixedSet("val", {"start_policy": first}, {"start_policy": key})
    torch.save({"state": fixed.state()}, tmp_path / "state.pt")  # as a checkpoint holds it
    loaded = FixedSet.from_state(torch.load(tmp_path / "state.pt", weights_only=True)["state"])
    assert loaded.state() == fixed.state() and loaded.sources["start_policy"][0].steps[0].next_observation == "next"


# ------------------------------------------------------------------ the metrics
def test_fixed_set_metrics_equal_a_direct_forward(module, tokenizer):
    samples = {source: build_buffer(trajs, tokenizer) for source, trajs in frozenlake_sources(tokenizer).items()}
    with torch.no_grad():
        scores = fixed_set_quality(module.token_outputs, samples, batch_size=3, device="cpu", pad_token_id=tokenizer.eos_token_id)
        sums = {}
        for source, buffer in samples.items():
            nll = correct = n = first_nll = first_correct = 0.0
            for ids, obs in zip(buffer.input_ids, buffer.obs_mask):
                logp = torch.log_softmax(module.lm(ids[None]).logits[0].float(), -1)  # position j predicts token j + 1
                positions = obs.nonzero().flatten().tolist()
                for k, j in enumerate(positions):
                    token_nll, hit = -logp[j - 1, ids[j]].item(), int(logp[j - 1].argmax() == ids[j])
                    nll, correct, n = nll + token_nll, correct + hit, n + 1
                    if k == 0:
                        first_nll, first_correct = first_nll + token_nll, first_correct + hit
            firsts = sum(bool(o.any()) for o in buffer.obs_mask)
            sums[source] = (nll, correct, n, first_nll, first_correct, firsts)
            assert scores[f"{source}/nll"] == pytest.approx(nll / n, rel=1e-5)
            assert scores[f"{source}/token_acc"] == pytest.approx(correct / n)
            assert scores[f"{source}/first_token_nll"] == pytest.approx(first_nll / firsts, rel=1e-5)
            assert scores[f"{source}/first_token_acc"] == pytest.approx(first_correct / firsts)
            assert scores[f"{source}/transitions"] == len(buffer)
    total = [sum(v) for v in zip(*sums.values())]
    assert scores["all/nll"] == pytest.approx(total[0] / total[2], rel=1e-5) and scores["all/first_token_acc"] == pytest.approx(total[4] / total[5])


# ------------------------------------------------------------------ bf16-mixed
def _world_model_fit(tiny_model_dir, dtype: str, autocast: bool, steps: int = 30) -> tuple[float, float]:
    """Fixed-set NLL before and after ``steps`` AdamW steps of the world-model loss alone (CE,
    λ = 1) on FrozenLake's expert transitions, each forward under bfloat16 autocast or not."""
    module = make_module(tiny_model_dir, dtype=dtype)
    with torch.no_grad():  # the LoRA starts at zero, as a fresh fit's does
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.zero_()
    tokenizer = module.tokenizer
    samples = {"expert": build_buffer(frozenlake_sources(tokenizer, task_seeds=(21, 22, 23, 24))["expert"], tokenizer)}
    buffer = samples["expert"]
    objective = WorldModelObjective(alpha=1.0, balancer=FixedLambda(1.0))
    params = [p for p in module.lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-3)

    def nll() -> float:
        module.lm.eval()
        with torch.no_grad(), (torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.enable_grad()):
            value = fixed_set_quality(module.token_outputs, samples, 8, "cpu", tokenizer.eos_token_id)["expert/nll"]
        module.lm.train()
        return value

    before = nll()
    batch = buffer.collate(list(range(len(buffer))))
    for _ in range(steps):
        with (torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.enable_grad()):
            logprobs = module.token_outputs(batch)["logprobs"]
            loss = objective(logprobs, batch["obs_mask"], batch["group_ids"], torch.ones(len(buffer))).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return before, nll()


@pytest.mark.slow  # two short fits of the tiny model
def test_bf16_mixed_learns_the_world_model_as_float32_does(tiny_model_dir):
    """A regression test of the bf16 path: a world-model-only fit in bf16-mixed (a bfloat16 base,
    forwards under bfloat16 autocast, float32 LoRA and Adam: what ``dtype: auto`` runs on a CPU
    with AVX-512 BF16) lowers the fixed-set NLL by at least 0.7× what the same fit in float32 does
    (CPU autocast to bfloat16 runs on any x86 CPU)."""
    fp32_before, fp32_after = _world_model_fit(tiny_model_dir, "float32", autocast=False)
    bf16_before, bf16_after = _world_model_fit(tiny_model_dir, "bfloat16", autocast=True)
    assert fp32_before - fp32_after > 0.5, (fp32_before, fp32_after)  # the fit learns
    assert abs(bf16_before - fp32_before) < 0.05  # the same start, up to bfloat16's rounding
    assert bf16_before - bf16_after > 0.7 * (fp32_before - fp32_after), (bf16_before, bf16_after, fp32_before, fp32_after)


# ------------------------------------------------------------------ in a fit
class FixedSetsSeen(Callback):
    """The fixed samples each validation scored and the fixed-set metrics it logged."""

    def __init__(self):
        self.samples, self.metrics = [], []

    def on_validation_end(self, trainer, pl_module):
        fixed = trainer.datamodule.played["val"].fixed
        self.samples.append({s: [ids.clone() for ids in buffer.input_ids] for s, buffer in fixed.sources.items()})
        self.metrics.append({k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("val/wm_fixed/")})


def _fit(tiny_model_dir, workdir, *extra):
    workdir.mkdir()
    cli = PawCLI(args=tiny_args(tiny_model_dir, workdir, "--trainer.max_epochs=2", *extra), run=False)
    seen = FixedSetsSeen()
    cli.trainer.callbacks.append(seen)
    cli.trainer.fit(cli.model, cli.datamodule)
    return cli, seen


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(len(a[s]) == len(b[s]) and all(torch.equal(x, y) for x, y in zip(a[s], b[s])) for s in a)


@pytest.mark.slow  # three fits and a test of the tiny model
def test_the_fixed_set_does_not_move_with_the_policy(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    paw, paw_seen = _fit(tiny_model_dir, tmp_path / "paw")
    vanilla, vanilla_seen = _fit(tiny_model_dir, tmp_path / "vanilla", "--model.world_model_objective=null", "--model.optimizer.init_args.lr=0.01")
    unmeasured, _ = _fit(tiny_model_dir, tmp_path / "unmeasured", "--model.term_gradients_every=0")
    assert len(paw_seen.samples) == 2 and paw_seen.samples[0].keys() == {"expert", "random", "start_policy"}
    # one run's two validations, and two runs whose policies differ: the same transitions
    assert _same(paw_seen.samples[0], paw_seen.samples[1]) and _same(paw_seen.samples[0], vanilla_seen.samples[1])
    trained = {n: p for n, p in paw.model.lm.named_parameters() if p.requires_grad}
    assert any(not torch.equal(p, dict(vanilla.model.lm.named_parameters())[n]) for n, p in trained.items())  # the policies differ
    assert paw_seen.metrics[0]["val/wm_fixed/expert/nll"] != paw_seen.metrics[1]["val/wm_fixed/expert/nll"]  # the model moved on them
    # measuring the terms' gradients leaves training as it was, bit for bit
    assert all(torch.equal(p, dict(unmeasured.model.lm.named_parameters())[n]) for n, p in trained.items())
    client, runs = mlflow_runs(tmp_path / "paw")
    for key in ("val/wm_fixed/all/nll", "val/wm_fixed/start_policy/exact_match", "val/wm_onpolicy/nll", "train/grad/policy_norm", "train/grad/cosine"):
        assert len(metric_history(client, runs[0], key)) == 2, key
    assert all(math.isfinite(v) for v in metric_history(client, runs[0], "train/grad/wm_to_policy"))
    # ``test`` of the checkpoint scores the fit's own test set, restored from the checkpoint
    (ckpt,) = (tmp_path / "paw").glob("runs/**/last.ckpt")
    capsys.readouterr()
    cli = PawCLI(args=tiny_args(tiny_model_dir, tmp_path / "paw"), run=False)
    cli.trainer.test(cli.model, cli.datamodule, ckpt_path=str(ckpt))
    assert cli.datamodule.fixed["test"].state() == paw.datamodule.fixed["test"].state()
    assert "no stored" not in capsys.readouterr().err

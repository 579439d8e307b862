"""PaWModule pieces on the tiny model, without a Trainer."""
from __future__ import annotations

import contextlib
import math

import torch

import paw_lightning.module as module_lib
from paw_lightning.model import LMConfig
from paw_lightning.module import PaWModule
from paw_lightning.objectives import ClippedMAE, PolicyObjective
from paw_lightning.rollout.collector import Step, Trajectory
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.samples import build_buffer


def make_module(tiny_model_dir, **kwargs) -> PaWModule:
    module = PaWModule(lm=LMConfig(name_or_path=str(tiny_model_dir)), **kwargs)
    module.configure_model()
    with torch.no_grad():  # a non-zero adapter, so the reference policy differs from π_θ
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return module


def rollout(module, n_groups=2, steps=3):
    tok = module.tokenizer
    trajs = []
    for g in range(n_groups):
        for e in range(2):
            traj = Trajectory(g, 2 * g + e, g)
            for t in range(steps):
                response = tok.encode(f"<think>{'ab' * (t + e)}</think><action>Up</action>", add_special_tokens=False)
                traj.steps.append(Step(f"o{t}", chat_prompt_ids(tok, f"task {g} step {t}"), response, "", "Up", float(e), f"obs {g} {t}\n_P_", t == steps - 1))
            trajs.append(traj)
    return build_buffer(trajs, tok)


def test_world_model_segment_does_not_change_action_logprobs(tiny_model_dir):
    module = make_module(tiny_model_dir)
    buffer = rollout(module)
    full = buffer.collate([0])
    action = full["action_mask"][0]
    end = int(action.nonzero().max()) + 1  # cut right after the response: no world-model segment
    short = {**full, **{k: full[k][:, :end] for k in ("input_ids", "attention_mask", "action_mask", "obs_mask")}}
    with torch.no_grad():
        with_segment = module.token_outputs(full)["logprobs"][0, :end]
        without = module.token_outputs(short)["logprobs"][0]
    assert torch.allclose(with_segment[action[:end]], without[action[:end]], atol=1e-6)


class CountingReference:
    def __init__(self):
        self.calls = 0

    @contextlib.contextmanager
    def __call__(self, model):
        self.calls += 1
        with model.disable_adapter():
            yield


def test_kl_coef_zero_skips_the_reference_forward(tiny_model_dir, monkeypatch):
    for kl_coef, expected_calls in ((0.0, 0), (0.01, 3)):  # 12 samples / score_batch_size 4 = 3 forwards
        counter = CountingReference()
        monkeypatch.setattr(module_lib, "reference_policy", counter)
        module = make_module(tiny_model_dir, policy_objective=PolicyObjective(kl_coef=kl_coef), score_batch_size=4)
        buffer = rollout(module)
        module.prepare_update(buffer)
        assert counter.calls == expected_calls
        assert len(buffer.ref_logprobs) == (12 if kl_coef else 0)
        if kl_coef:  # the reference differs from π_θ once the adapter is non-zero
            assert not torch.allclose(buffer.ref_logprobs[0], buffer.old_logprobs[0])


def test_prepare_update_selects_the_top_alpha_transitions(tiny_model_dir):
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(alpha=0.75))
    buffer = rollout(module)
    module.prepare_update(buffer)
    entropy = buffer.action_entropy["full"]
    selected = buffer.wm_selected
    assert selected.sum() == math.ceil(0.75 * 12)
    assert entropy[selected].min() >= entropy[~selected].max()
    assert buffer.advantages.shape == (12,)
    # GRPO at trajectory level: returns per group are 0·3 = 0 and 1·3 = 3 → ±0.7071 on every step
    assert torch.allclose(buffer.advantages.abs(), torch.full((12,), 0.70710677), atol=1e-4)
    assert {"wm/entropy_p50", "wm/update_selected_fraction"} <= set(module.update_metrics)


def test_only_selected_transitions_keep_their_world_model_segment_and_the_loss_is_unchanged(tiny_model_dir):
    """The scoring pass runs on [prompt][response] and the transitions outside S_α lose their
    observation tokens; π_old, the loss and its gradient equal those of the full samples."""
    module = make_module(tiny_model_dir, world_model_objective=ClippedMAE(alpha=0.5, rho=1.0), policy_objective=PolicyObjective(kl_coef=0.01))
    module.wm_lambda = {0: 0.7, 1: 0.3}
    cut = rollout(module)
    module.prepare_update(cut)
    full = rollout(module)  # the same update without any cut: scored on the full samples, same selection
    module.score(full)
    full.advantages, full.wm_selected = cut.advantages, cut.wm_selected

    ends, selected = full.policy_lengths(), cut.wm_selected
    assert selected.sum() == 6
    for i in range(len(full)):
        assert len(cut.input_ids[i]) == (len(full.input_ids[i]) if selected[i] else ends[i])
        assert cut.obs_mask[i].any() == selected[i]
        assert len(cut.old_logprobs[i]) == len(cut.ref_logprobs[i]) == ends[i]
        assert torch.allclose(cut.old_logprobs[i], full.old_logprobs[i][: ends[i]], atol=1e-5)
        assert torch.allclose(cut.ref_logprobs[i], full.ref_logprobs[i][: ends[i]], atol=1e-5)
    assert sum(map(len, cut.input_ids)) < sum(map(len, full.input_ids))

    def loss_and_grads(buffer):
        module.zero_grad(set_to_none=True)
        out = module.compute_loss(buffer.collate(list(range(len(buffer)))))
        out.loss.backward()
        return out, [p.grad.clone() for p in module.parameters() if p.requires_grad]

    (cut_out, cut_grads), (full_out, full_grads) = loss_and_grads(cut), loss_and_grads(full)
    assert full_out.metrics["wm/loss"] > 0
    assert torch.allclose(cut_out.loss, full_out.loss, atol=1e-5)
    for key in ("wm/loss", "wm/selected_fraction", "wm/clipped_ratio", "policy/kl"):
        assert torch.allclose(torch.as_tensor(cut_out.metrics[key]), torch.as_tensor(full_out.metrics[key]), atol=1e-5), key
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(cut_grads, full_grads))


def test_free_running_prediction_is_scored_on_the_observation_length(tiny_model_dir, monkeypatch):
    """The world model never learns where an observation ends, so a prediction is cut to the true
    observation's token count before scoring: of a correct prediction that runs on and one with a
    wrong character, exact match is 1/2 and the corpus CER 1 edit / 22 target characters."""
    module = make_module(tiny_model_dir)
    buffer = rollout(module, n_groups=1, steps=1)  # 2 transitions, true next observation "obs 0 0\n_P_"
    observations = [buffer.input_ids[i][buffer.obs_mask[i]].tolist() for i in range(len(buffer))]
    garbage = module.tokenizer.encode(" and then more text", add_special_tokens=False)
    wrong = module.tokenizer.encode("obs 0 1\n_P_", add_special_tokens=False)
    budgets = []

    def generate_ids(self, prompt_ids, temperature, seed, max_new_tokens=None, stop=None):
        budgets.append(self.max_new_tokens)
        return [observations[0] + garbage, wrong + garbage]

    monkeypatch.setattr(module_lib.GenerationEngine, "generate_ids", generate_ids)
    metrics = module.predict_observations(buffer, n=2)
    assert budgets == [len(observations[0])]  # no more tokens than the longest true observation
    assert module.last_predictions == {0: "obs 0 0\n_P_", 1: "obs 0 1\n_P_"}
    assert metrics["exact_match"] == 0.5
    assert math.isclose(metrics["cer"], 1 / 22, abs_tol=1e-7)  # one substitution over both targets' 2 × 11 characters

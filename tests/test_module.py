"""PaWModule pieces on the tiny model, without a Trainer."""
from __future__ import annotations

import math

import torch

import paw_lightning.evaluation as evaluation_lib

from helpers import make_module, rollout


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

    monkeypatch.setattr(evaluation_lib.GenerationEngine, "generate_ids", generate_ids)
    metrics, predictions = module.predict_observations(buffer, n=2)
    assert budgets == [len(observations[0])]  # no more tokens than the longest true observation
    assert predictions == {0: "obs 0 0\n_P_", 1: "obs 0 1\n_P_"}
    assert metrics["exact_match"] == 0.5
    assert math.isclose(metrics["cer"], 1 / 22, abs_tol=1e-7)  # one substitution over both targets' 2 × 11 characters


def test_transitions_without_a_world_model_target_are_not_predicted(tiny_model_dir, monkeypatch):
    """A transition whose next observation is no world-model target (empty ``obs_mask``, e.g. search
    QA's verdict after an answer) is left out of the free-running prediction and its scores."""
    module = make_module(tiny_model_dir)
    buffer = rollout(module, n_groups=1, steps=1)
    buffer.obs_mask[0] = torch.zeros_like(buffer.obs_mask[0])
    target = buffer.input_ids[1][buffer.obs_mask[1]].tolist()
    contexts = []

    def generate_ids(self, prompt_ids, temperature, seed, max_new_tokens=None, stop=None):
        contexts.extend(prompt_ids)
        return [target]

    monkeypatch.setattr(evaluation_lib.GenerationEngine, "generate_ids", generate_ids)
    metrics, predictions = module.predict_observations(buffer, n=2)
    assert len(contexts) == 1 and list(predictions) == [1]
    assert metrics["exact_match"] == 1.0 and metrics["cer"] == 0.0

"""The dream through the real engine on the tiny model: the world model's contexts are the
training samples' (METHODS.md §1), and a whole dream evaluation runs and gives sane numbers."""
from __future__ import annotations

from helpers import sampled_buffer

from paw_lightning.envs import EnvPool, make_env_factory
from paw_lightning.envs.frozenlake import FrozenLakeEnv
from paw_lightning.rollout.dream.fidelity import k_step_fidelity
from paw_lightning.rollout.dream.judge import Judge
from paw_lightning.rollout.dream.lm import PolicyActor, WorldModelPredictor
from paw_lightning.rollout.dream.measures import dream_metrics
from paw_lightning.rollout.dream.play import dream_evaluation
from paw_lightning.rollout.engine import GenerationEngine
from paw_lightning.rollout.prompts import PromptBuilder

PROMPT = PromptBuilder("FrozenLake", history_length=1)  # as helpers.sampled_buffer plays


def test_fidelity_contexts_are_the_training_samples_contexts_when_the_predictions_are_true(module):
    """With an oracle that predicts the real o_{t+1} (``length_of`` holds it in fidelity), every
    context the world model sees, the re-rendered prompts of k ≥ 2 included, is exactly the tokens
    before the observation in that step's training sample."""
    buffer = sampled_buffer(module, token_stats=False)
    predictor = WorldModelPredictor(GenerationEngine(module.lm, module.tokenizer, 6), module.tokenizer)
    sample_context = {}
    i = 0
    for traj in buffer.trajectories:
        for t in range(len(traj.steps)):
            sample_context[(traj.traj_id, traj.steps[t].next_observation, t)] = buffer.input_ids[i][~buffer.obs_mask[i]].tolist()
            i += 1
    seen = []

    def oracle(transitions):
        seen.extend(predictor.context(tr) for tr in transitions)
        return [tr.length_of for tr in transitions]

    records = k_step_fidelity(buffer.trajectories, oracle, PROMPT, Judge.for_env(FrozenLakeEnv), 2, {t.task_seed: ["Up", "Down", "Left", "Right"] for t in buffer.trajectories})
    assert any(r.k == 2 for r in records)  # some trajectory has two steps: a re-rendered prompt was used
    assert all(r.predicted == r.real for r in records) and all(r.state_match for r in records)
    assert sorted(map(tuple, seen)) == sorted(tuple(sample_context[key]) for key in sample_context for _ in range(1 + (key[2] == 1)))


def test_a_tiny_model_dreams_through_the_engine(module):
    buffer = sampled_buffer(module, token_stats=False)
    engine = GenerationEngine(module.lm, module.tokenizer, max_new_tokens=6)
    factory = make_env_factory("frozenlake")
    pool = EnvPool(factory, 2)
    with module.generating():
        records = dream_evaluation(pool, [3, 8], buffer.trajectories, PolicyActor(engine, 0.7, 0, "</action>"),
                                   WorldModelPredictor(engine, module.tokenizer), Judge.for_env(factory), PROMPT, 2)
    pool.close()
    assert len(records.episodes) == len(records.replays) == 2
    assert all(1 <= len(e.steps) <= 2 for e in records.episodes)
    m = dream_metrics(records)
    assert {"exact_at_1", "cer_at_1", "state_match_at_1", "success", "replay_success", "first_divergence", "never_diverged", "judged"} <= set(m)
    assert m["episodes"] == 2 and m["judged"] == 1.0
    assert all(0.0 <= m[k] <= 1.0 for k in ("exact_at_1", "state_match_at_1", "success", "replay_success", "never_diverged"))
    assert 1.0 <= m["first_divergence"] <= 3.0
    for episode in records.episodes:  # a prediction is at most as many tokens as the observation before it
        shown = [episode.start] + [s.observation for s in episode.steps]
        for before, after in zip(shown, shown[1:]):
            assert len(module.tokenizer.encode(after, add_special_tokens=False)) <= len(module.tokenizer.encode(before, add_special_tokens=False))

"""Several ranks dream their shares and give the numbers of one process (2 CPU processes, gloo)."""
from __future__ import annotations

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from helpers import free_port

pytestmark = pytest.mark.slow  # 2 spawned processes

SEEDS = [11, 12, 13, 14]
SHARES = {0: [0, 1, 2], 1: [3]}  # uneven on purpose: the ranks' loops run different lengths


def _setup():
    from test_dream import flaky, by_prompt, real_trajectory  # scripted models and trajectories
    from paw_lightning.envs.frozenlake import FrozenLakeEnv

    env = FrozenLakeEnv(size=3, hole_prob=0.3)
    trajectories = []
    for g, seed in enumerate(SEEDS):
        env.reset(seed)
        trajectories.append(real_trajectory(env, env.solve() + ["Up"], seed, g))
    return flaky, by_prompt, trajectories


def _dream(indices, model_dir=None):
    from paw_lightning.envs import EnvPool
    from paw_lightning.envs.frozenlake import FrozenLakeEnv
    from paw_lightning.rollout.dream.judge import Judge
    from paw_lightning.rollout.dream.measures import dream_metrics
    from paw_lightning.rollout.dream.play import dream_evaluation
    from paw_lightning.rollout.prompts import PromptBuilder

    predict, act, trajectories = _setup()
    seeds = [SEEDS[i] for i in indices]
    if model_dir is not None:  # the tiny model through the engine, greedy: synced generation
        from helpers import make_module
        from paw_lightning.rollout.dream.lm import PolicyActor, WorldModelPredictor
        from paw_lightning.rollout.engine import GenerationEngine

        module = make_module(model_dir)
        engine = GenerationEngine(module.lm, module.tokenizer, max_new_tokens=6)
        act, predict = PolicyActor(engine, 0.0, 0, "</action>"), WorldModelPredictor(engine, module.tokenizer)
    pool = EnvPool(FrozenLakeEnv, len(seeds))
    records = dream_evaluation(pool, seeds, [trajectories[i] for i in indices], act, predict, Judge.for_env(FrozenLakeEnv),
                               PromptBuilder("frozenlake", history_length=1), 3)
    pool.close()
    return dream_metrics(records)


def _worker(rank: int, port: int, model_dir, results) -> None:
    import torch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        scripted = _dream(SHARES[rank])
        torch.manual_seed(0)  # the same LoRA weights on both ranks
        results[rank] = (scripted, _dream(SHARES[rank], model_dir))
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_the_numbers_of_one_process(tiny_model_dir):
    """Scripted models: exactly one process's numbers. The tiny model through the engine (synced
    generation, each rank its own number of episodes and steps): every collective pairs up and
    both ranks hold the same, global numbers."""
    results = mp.Manager().dict()
    mp.spawn(_worker, args=(free_port(), str(tiny_model_dir), results), nprocs=2, join=True)
    one = _dream([0, 1, 2, 3])
    assert results[0][0] == results[1][0] == one
    assert one["episodes"] == 4
    assert results[0][1] == results[1][1]
    assert results[0][1]["episodes"] == 4 and "exact_at_1" in results[0][1]

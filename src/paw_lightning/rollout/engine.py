"""Batched generation: all active environments' prompts of one step in one ``generate`` call.

Prompts are chat-templated, left-padded and sampled with a seed derived by the caller, so
a rollout is reproducible (and a resumed run replays the same rollouts). The response is
cut right after the first ``</action>`` (the stop string) or after the end-of-turn token.
Under FSDP2 every rank runs the same number of forward passes (``synced_gpus``), also a
rank whose environments have all finished (it generates for a dummy prompt).

The stop-string criterion is built once per tokenizer and stop string and reused: given
``stop_strings``, ``generate`` would rebuild HF's ``StopStringCriteria``, which reads the
whole vocabulary, at every step of every rollout (0.21 s per call for SmolLM2's 49k tokens on
a CPU; Qwen2.5 has 152k).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, StoppingCriteriaList, StopStringCriteria

from paw_lightning import distributed


_STOP_CRITERIA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer → {stop string → criterion}


def stop_criterion(tokenizer: PreTrainedTokenizerBase, stop: str) -> StopStringCriteria:
    """HF's criterion that ends a row once its text contains ``stop``, built once per
    tokenizer and stop string (it is stateless across ``generate`` calls)."""
    per_tokenizer = _STOP_CRITERIA.setdefault(tokenizer, {})
    if stop not in per_tokenizer:
        per_tokenizer[stop] = StopStringCriteria(tokenizer, [stop])
    return per_tokenizer[stop]


@dataclass
class Generation:
    """One sampled response: token ids of the chat-templated prompt and of the response."""

    prompt_ids: list[int]
    response_ids: list[int]
    text: str


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
    """

    def __init__(self, model, tokenizer: PreTrainedTokenizerBase, max_new_tokens: int):
        self.model = model
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens

    def generate(self, prompts: list[str], temperature: float, seed: int) -> list[Generation]:
        """Generate one response per prompt (an empty list is allowed: the rank then only keeps
        its peers' collectives going)."""
        prompt_ids = [chat_prompt_ids(self.tokenizer, p) for p in prompts]
        responses = self.generate_ids(prompt_ids, temperature, seed)
        return [Generation(ids, r, self.tokenizer.decode(r, skip_special_tokens=True)) for ids, r in zip(prompt_ids, responses)]

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], temperature: float, seed: int, max_new_tokens: int | None = None, stop: str | None = "</action>") -> list[list[int]]:
        """Continue each token sequence; returns the new tokens, cut after ``stop`` (if given)
        or after the end-of-turn token."""
        batch = prompt_ids or [[self.tokenizer.eos_token_id]]
        input_ids, attention_mask = self._left_pad(batch)
        device = next(self.model.parameters()).device
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 else {"do_sample": False}
        config = GenerationConfig(
            **sampling,
            max_new_tokens=max_new_tokens or self.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.tokenizer.eos_token_id,
        )
        stopping = StoppingCriteriaList([stop_criterion(self.tokenizer, stop)] if stop else [])
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                generation_config=config,
                stopping_criteria=stopping,
                synced_gpus=distributed.is_distributed(),
            )
        new_tokens = out[:, input_ids.shape[1] :].tolist()
        return [self._cut(row, stop) for row in new_tokens[: len(prompt_ids)]]

    def _left_pad(self, batch: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
        attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
        return input_ids, attention_mask

    def _cut(self, row: list[int], stop: str | None = "</action>") -> list[int]:
        """Keep tokens up to and including the first end-of-turn token or the token completing
        the stop string; everything after it is padding from finished rows."""
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        text = ""
        for i, token in enumerate(row):
            if token == eos:
                return row[: i + 1]
            if token == pad:
                return row[:i]
            if stop:
                text += self.tokenizer.decode([token])
                if stop in text[-(len(stop) + 32) :]:
                    return row[: i + 1]
        return row

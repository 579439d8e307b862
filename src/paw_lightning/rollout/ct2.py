"""CTranslate2 rollout engine: sampling on CPUs from an int8 (or float32) copy of the policy.

Before a rollout whose weights differ from the copy's (the global step moved), the LoRA update
is merged into a copy of the model (W + (α/r)·B·A), converted and loaded (``last_sync_seconds``).
Generation keeps the ``hf`` engine's contract (prompt ids, temperature, stop string, budget);
seeding differs: CTranslate2 seeds a generator once (#1757), so a sampler's first call seeds
all its calls. CTranslate2 decodes the part of a longer prompt beyond a batch's shortest one
token at a time, so a call is split by prompt length; ``workers`` copies (each on
``threads // workers`` threads) decode those calls at once, assigned deterministically and
seeded ``seed + worker``, so that sampling stays reproducible. The prefix a call's rows share
(a task group's first-step prompts) is CTranslate2's ``static_prompt``: forwarded once and its
state repeated across the rows (``share_prefixes``). With ``token_stats``, log-probs
and entropies come from the copy's logits at temperature 1 (π_engine). One process only (no FSDP2/DDP), no 4-bit base.
"""
from __future__ import annotations

import os
import tempfile
import types

import numpy as np
import torch

from paw_lightning.rollout.engine import GenerationEngine, RolloutEngine, merged_weights, stopped
from paw_lightning.rollout.prefix import shared_prefix_length

COMPUTE_TYPES = ("int8", "float32", "int8_float32")


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError as err:  # the engine is optional
        raise ImportError("model.engine CT2Engine needs the ctranslate2 package: pip install ctranslate2 (or use the default hf engine)") from err
    return ctranslate2


def convert(model: torch.nn.Module, tokenizer, output_dir: str, quantization: str) -> None:
    """Write ``model`` (an in-memory transformers model) as a CTranslate2 model to ``output_dir``.

    The converter calls ``gc.collect()`` after each decoder layer to free a model it loaded
    itself; here the model stays in memory either way, and in a training process (many live
    Python objects) each collection took 0.4 s: 12.4 of a 13.4 s conversion of the 30-layer
    SmolLM2-135M. The converter's module sees a ``gc`` whose ``collect`` does nothing while
    it converts."""
    from ctranslate2.converters import TransformersConverter
    from ctranslate2.converters import transformers as converter_module

    with tempfile.TemporaryDirectory() as config_dir:
        model.config.save_pretrained(config_dir)  # the converter reads the architecture from a config file

        class InMemory(TransformersConverter):
            def load_model(self, model_class, model_name_or_path, **kwargs):
                return model

            def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
                return tokenizer

        real_gc = converter_module.gc
        converter_module.gc = types.SimpleNamespace(collect=lambda *args, **kwargs: 0)
        try:
            InMemory(config_dir).convert(output_dir, quantization=quantization, force=True)
        finally:
            converter_module.gc = real_gc


class CT2Engine(RolloutEngine):
    """Selected with ``model.engine: {class_path: paw_lightning.rollout.ct2.CT2Engine}``.

    Args:
        compute_type: ``int8`` (default: the fastest on CPUs), ``float32`` (the same greedy
            tokens as ``hf``) or ``int8_float32``.
        threads: CPU threads of the engine, shared by its workers (0: torch's thread count).
        workers: copies decoding at once, each on ``threads // workers`` threads (default 2:
            a call's prompts of different lengths go to different copies).
        workdir: where the converted copy is written (default: a temporary directory).
        tis_cap: C of the truncated importance weight min(π_old / π_engine, C) on the policy
            loss; ``null``: no correction (``train/rollout/engine_kl`` is logged either way).
        share_prefixes: forward the prompt prefix that a call's rows share once (CTranslate2's
            ``static_prompt``; the same samples up to float rounding).
    """

    off_policy = True

    def __init__(self, compute_type: str = "int8", threads: int = 0, workers: int = 2, workdir: str | None = None, tis_cap: float | None = 2.0,
                 share_prefixes: bool = True):
        if compute_type not in COMPUTE_TYPES:
            raise ValueError(f"model.engine compute_type must be one of {', '.join(COMPUTE_TYPES)} (got {compute_type!r})")
        if tis_cap is not None and tis_cap < 1:
            raise ValueError(f"model.engine tis_cap must be at least 1 or null (got {tis_cap})")
        if workers < 1:
            raise ValueError(f"model.engine workers must be at least 1 (got {workers})")
        self.compute_type, self.threads, self.workers, self.workdir, self.tis_cap = compute_type, threads, workers, workdir, tis_cap
        self.share_prefixes = share_prefixes
        self.directory: str | None = None  # the converted copy

    def check(self, lm_config, world_size: int) -> None:
        """Refuse what the engine cannot serve, before anything heavy runs."""
        _ctranslate2()
        if world_size > 1:
            raise ValueError("model.engine CT2Engine runs in one process: use the hf engine with FSDP2/DDP")
        if lm_config.quantization:
            raise ValueError("model.engine CT2Engine needs an unquantized base model (model.lm.quantization: null)")

    def sync(self, lm, tokenizer) -> None:
        """Merge, convert and write the copy (loaded by each sampler)."""
        _ctranslate2()
        self.directory = self.directory or self.workdir or tempfile.mkdtemp(prefix="paw-ct2-")
        os.makedirs(self.directory, exist_ok=True)
        with torch.no_grad():
            convert(merged_weights(None, lm), tokenizer, self.directory, self.compute_type)  # a new copy: the converter modifies it

    def sampler(self, lm, tokenizer, max_new_tokens: int, token_stats: bool, version: object) -> CT2Sampler:
        """A sampler with the collector's interface on weights of ``version`` (synced first)."""
        self.refresh(lm, tokenizer, version)
        return CT2Sampler(self.directory, self.compute_type, self.threads, tokenizer, max_new_tokens, token_stats, self.workers, self.share_prefixes)


class CT2Sampler(GenerationEngine):
    """``GenerationEngine``'s interface on ``workers`` loaded copies of a converted model, loaded
    at the first call; worker ``j`` is seeded with that call's seed + ``j``."""

    def __init__(self, directory: str, compute_type: str, threads: int, tokenizer, max_new_tokens: int, token_stats: bool = False, workers: int = 1,
                 share_prefixes: bool = True):
        super().__init__(None, tokenizer, max_new_tokens, token_stats, share_prefixes)
        self.directory, self.compute_type, self.threads, self.workers = directory, compute_type, threads, workers
        self.generators: list = []

    def load(self, seed: int) -> None:
        """One generator (one worker thread) per worker. CTranslate2 seeds a thread's random
        stream from the global seed when that thread first samples, so each worker samples one
        token right after the global seed is set to ``seed + j``."""
        ct2 = _ctranslate2()
        threads = max(1, (self.threads or torch.get_num_threads()) // self.workers)
        prime = [[self.tokenizer.convert_ids_to_tokens(self.tokenizer.eos_token_id)]]
        for j in range(self.workers):
            generator = ct2.Generator(self.directory, device="cpu", compute_type=self.compute_type, intra_threads=threads)
            ct2.set_random_seed(seed + j)
            generator.generate_batch(prime, max_length=1, sampling_topk=0)
            self.generators.append(generator)

    def generate_ids(self, prompt_ids, temperature, seed, max_new_tokens=None, stop="</action>", token_stats=None):
        if not prompt_ids:
            return []
        torch_threads = torch.get_num_threads()
        try:
            return self._generate(prompt_ids, temperature, seed, max_new_tokens, stop, token_stats)
        finally:  # loading or running a generator leaves torch on its intra_threads (measured: 2 → 1)
            torch.set_num_threads(torch_threads)

    def _generate(self, prompt_ids, temperature, seed, max_new_tokens, stop, token_stats):
        tok = self.tokenizer
        texts = [""] * len(prompt_ids)

        def stop_row(step, row: int) -> bool:  # ends a row once its text contains the stop string
            if not stop:
                return False
            texts[row] += tok.decode([step.token_id])
            return stopped(texts[row], stop)

        if not self.generators:
            self.load(seed)
        rows: list[list[int]] = [[] for _ in prompt_ids]
        stats: list[tuple[list[float], list[float]]] = [([], [])] * len(prompt_ids)
        pending = []
        for worker, members in assign_calls(prompt_ids, len(self.generators)):
            shared = shared_prefix_length([prompt_ids[row] for row in members]) if self.share_prefixes else 0
            static = {"static_prompt": tok.convert_ids_to_tokens(prompt_ids[members[0]][:shared]), "cache_static_prompt": False} if shared else {}
            results = self.generators[worker].generate_batch(
                [tok.convert_ids_to_tokens(prompt_ids[row][shared:]) for row in members],
                asynchronous=True,  # each generator decodes its own calls in order, all generators at once
                max_length=max_new_tokens or self.max_new_tokens,
                sampling_topk=1 if temperature <= 0 else 0,  # 0: the full distribution
                sampling_temperature=max(temperature, 1e-6),
                include_prompt_in_result=False,
                end_token=[tok.eos_token_id],
                return_end_token=True,
                return_logits_vocab=token_stats is not None,
                callback=lambda step, members=members: stop_row(step, members[step.batch_id]),
                **static,  # forwarded once, its state repeated per row; not cached across calls (one state per prefix)
            )
            pending.append((members, results))
        for members, results in pending:
            for row, result in zip(members, results):
                result = result.result()
                rows[row] = self._cut(result.sequences_ids[0], stop)
                if token_stats is not None:
                    stats[row] = _token_stats(torch.from_numpy(np.asarray(result.logits[0])[: len(rows[row])]), rows[row])
        if token_stats is not None:
            token_stats += stats
        return rows


def assign_calls(prompt_ids: list[list[int]], workers: int) -> list[tuple[int, list[int]]]:
    """``(worker, rows)`` per generate call: one call per prompt length (CTranslate2 decodes the
    part of a longer prompt beyond a batch's shortest one token at a time: 2.4× slower on
    ALFWorld's prompts), longest first, each to the worker with the fewest prompt tokens so far
    (ties: the lowest index). Depends only on the prompts' lengths, so it is reproducible."""
    by_length: dict[int, list[int]] = {}
    for row, ids in enumerate(prompt_ids):
        by_length.setdefault(len(ids), []).append(row)
    load, calls = [0] * workers, []
    for length in sorted(by_length, reverse=True):
        worker = min(range(workers), key=lambda w: (load[w], w))
        load[worker] += length * len(by_length[length])
        calls.append((worker, by_length[length]))
    return calls


def _token_stats(logits: torch.Tensor, row: list[int]) -> tuple[list[float], list[float]]:
    """Each token's log-prob and its next-token distribution's entropy, at temperature 1."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, torch.tensor(row, dtype=torch.long)[:, None]).squeeze(-1)
    return chosen.tolist(), (-(logp.exp() * logp).nan_to_num().sum(-1)).tolist()

"""Continuous-batching rollout engine: transformers' own paged-KV-cache batching (no extra package).

The rollouts sample from the merged-LoRA copy of :class:`~paw_lightning.rollout.engine.HFEngine`
(``merge_lora``: W + (α/r)·B·A, rewritten when the weights' version moved) through
``model.init_continuous_batching`` (transformers ≥ 5.x, ``ContinuousBatchingManager``): each
request (row) is scheduled on its own, finished rows leave the batch at once and new ones are
prefilled beside decoding rows, with the keys and values in a paged cache. A call keeps the
``hf`` engine's contract (prompt ids in, new token ids out, ``stop`` string, budget, seed).

Deliberate simplifications and the limits of transformers' API, measured on 5.23:

- **Seeds.** transformers seeds one generator for the whole manager (``torch.manual_seed`` in
  its generation thread) and samples every step's rows with one ``torch.multinomial``: there is
  no per-request seed. A call seeds it with the call's seed, queues all its requests before the
  generation thread starts (so the batches, and the random numbers each row draws, depend only
  on the prompts, the seed and the cache size) and restores the caller's random state after.
  Samples are reproducible per call, but a row's tokens depend on the other rows of its call.
- **Stop strings.** transformers stops a request at EOS or its budget only. Each request here
  also ends, inside the generation loop, at the token that completes a stop string
  (:func:`_stop_request_class`), so the batch composition stays deterministic (cancelling from the
  caller's thread would not be).
- **Log-probs.** transformers' ``return_logprobs`` is the log-softmax of the *processed* logits
  (divided by the temperature) and it returns no entropy. With ``token_stats`` the engine runs
  one scoring forward over prompt + response on the same merged copy instead
  (:func:`score_responses`, ``score_rows`` rows at a time): untempered log π(a_i | ·) and the
  full-distribution entropy, as the ``hf`` engine records them; equal to the sampler's up to the
  rounding of a different attention kernel (paged vs. plain).
- **Shared prompts.** transformers' prefix caching shares only *complete* cache pages of a
  request whose pages are already written, so the rows of a task group prefilled in the same
  batch would each prefill the whole prompt. A call therefore first prefills each shared prefix
  once (:func:`~paw_lightning.rollout.prefix.plan_shared_prefixes`, one 2-token request per
  cluster: a request's pages are registered for reuse only while it has not finished; its
  samples are discarded), then queues the rows while the loop is paused, so that it takes them
  in one go; they reuse the prefix's complete pages (``page_size`` tokens each) and prefill the
  rest. ``share_prefixes: false`` skips this.
- **Cache size.** The cache holds every request of a call whole (no eviction, no CPU
  offloading: an evicted request would lose its stop-string state); one manager per call, so
  CUDA graphs (``cb_kwargs: {use_cuda_graph: true}``) are captured again at every call. The
  engine reaches into three attributes of transformers' manager (its ``input_queue``, its
  loop's wake-up event and stop status): requests are queued as :func:`_stop_request_class`
  objects, and a finished call stops the idle loop without its 0.1 s sleep.
- **Attention.** transformers switches the copy to FlashAttention 2 or 3 where the package is
  installed (and the copy is float16 or bfloat16). Without it, it runs SDPA over the packed
  rows of a step with one dense mask: each query meets the keys of every row of the batch, so
  attention grows with the batch squared, and CUDA graphs stay off.
- The generation thread does not inherit the caller's autocast: the copy computes in its own
  dtype. One process, unquantized base (as the merged copy).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import math
import types
from dataclasses import dataclass, field

import torch

from paw_lightning.rollout.engine import GenerationEngine, HFEngine, _token_stats, stopped
from paw_lightning.rollout.prefix import plan_shared_prefixes, position_ids


def _continuous_batching():
    """transformers' continuous-batching classes, or a clear error where the install lacks them."""
    try:
        from transformers import ContinuousBatchingConfig, GenerationConfig
        from transformers.generation.continuous_batching import RequestState
    except ImportError as err:
        import transformers

        raise ValueError(f"model.engine CBEngine needs transformers with continuous batching (5.x; installed: {transformers.__version__}): "
                         "upgrade transformers or use the hf engine") from err
    return ContinuousBatchingConfig, GenerationConfig, RequestState


class CBEngine(HFEngine):
    """Selected with ``model.engine: {class_path: paw_lightning.rollout.cb_engine.CBEngine}``.

    Args:
        page_size: tokens per page of the paged KV cache; a shared prefix is reused in whole pages.
        max_batch_tokens: the most tokens (prefill and decode) one forward processes.
        score_rows: rows per scoring forward of ``token_stats`` (its logits: rows × response
            length × vocabulary).
        share_prefixes: prefill each prefix that several rows of a call share once (module
            docstring).
        off_policy: treat the sampler as a different policy: π_old is recomputed by the trainer
            and TIS weights the loss by min(π_old / π_engine, ``tis_cap``). Default false: the
            merged copy is π_θ up to rounding (as ``HFEngine(merge_lora=true)``), so
            ``model.old_logprobs: rollout`` may read π_old from the engine.
        tis_cap: C of the truncated importance weight when ``off_policy``; ``null``: report the
            gap (``rollout/engine_kl``) only.
        cb_kwargs: further ``transformers.ContinuousBatchingConfig`` arguments, e.g.
            ``{use_cuda_graph: true}`` (captured again at every call: one manager per call) or
            ``{auto_switch_to_flash: false}`` (default: true for a float16/bfloat16 copy).
    """

    def __init__(self, page_size: int = 32, max_batch_tokens: int = 2048, score_rows: int = 8, share_prefixes: bool = True,
                 off_policy: bool = False, tis_cap: float | None = 2.0, cb_kwargs: dict | None = None):
        super().__init__(merge_lora=True, share_prefixes=share_prefixes)
        if page_size < 4 or max_batch_tokens < 1 or score_rows < 1:
            raise ValueError("model.engine CBEngine needs page_size ≥ 4, max_batch_tokens ≥ 1 and score_rows ≥ 1 "
                             f"(got {page_size}, {max_batch_tokens}, {score_rows})")
        if tis_cap is not None and tis_cap < 1:
            raise ValueError(f"model.engine tis_cap must be at least 1 or null (got {tis_cap})")
        self.cb_kwargs = dict(cb_kwargs or {})
        reserved = {"page_size", "max_batch_tokens", "num_blocks", "seed", "return_logprobs", "allow_block_sharing", "cpu_offload_space",
                    "safety_margin"} & set(self.cb_kwargs)
        if reserved:
            raise ValueError(f"model.engine cb_kwargs {sorted(reserved)} are set by the engine: use its own arguments")
        self.page_size, self.max_batch_tokens, self.score_rows = page_size, max_batch_tokens, score_rows
        self.off_policy, self.tis_cap = off_policy, tis_cap

    def check(self, lm_config, world_size: int) -> None:
        _continuous_batching()
        if world_size > 1 or lm_config.quantization:
            raise ValueError("model.engine CBEngine needs one process and an unquantized base model: with FSDP2/DDP or a 4-bit base use the hf engine")

    def sampler(self, lm, tokenizer, max_new_tokens: int, token_stats: bool, version: object) -> CBSampler:
        self.refresh(lm, tokenizer, version)
        return CBSampler(self, tokenizer, max_new_tokens, token_stats)


class CBSampler(GenerationEngine):
    """``GenerationEngine``'s interface on the engine's merged copy through continuous batching."""

    def __init__(self, engine: CBEngine, tokenizer, max_new_tokens: int, token_stats: bool = False):
        super().__init__(engine.merged, tokenizer, max_new_tokens, token_stats, engine.share_prefixes)
        self.engine = engine

    @torch.no_grad()
    def generate_ids(self, prompt_ids, temperature, seed, max_new_tokens=None, stop="</action>", token_stats=None):
        if not prompt_ids:
            return []
        budget = max_new_tokens or self.max_new_tokens
        outputs = self._generate(prompt_ids, temperature, seed, budget, stop)
        rows = [self._cut(out, stop) for out in outputs]
        if token_stats is not None:
            token_stats += score_responses(self.model, prompt_ids, rows, self.tokenizer.pad_token_id, self.engine.score_rows)
        return rows

    def _generate(self, prompt_ids: list[list[int]], temperature: float, seed: int, budget: int, stop) -> list[list[int]]:
        """The new tokens of each row, in the order of ``prompt_ids``."""
        ContinuousBatchingConfig, GenerationConfig, _ = _continuous_batching()
        engine, tok, model = self.engine, self.tokenizer, self.model
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature > 0 else {"do_sample": False}
        generation = GenerationConfig(**sampling, max_new_tokens=budget, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        plan = plan_shared_prefixes(prompt_ids) if self.share_prefixes else None
        rows_of = collections.Counter(plan.cluster_of if plan else [])  # a one-row cluster shares nothing: no warm-up
        prefixes = [p for c, p in enumerate(plan.prefixes if plan else []) if rows_of[c] > 1 and len(p) >= engine.page_size]
        pages = sum(math.ceil((len(ids) + budget) / engine.page_size) + 1 for ids in prompt_ids)
        pages += sum(math.ceil(len(p) / engine.page_size) + 2 for p in prefixes)
        config = ContinuousBatchingConfig(page_size=engine.page_size, num_blocks=pages, max_batch_tokens=engine.max_batch_tokens, seed=seed,
                                          allow_block_sharing=bool(prefixes), cpu_offload_space=0.0, safety_margin=0.0,
                                          **{"auto_switch_to_flash": _half(model), **engine.cb_kwargs})
        manager = model.init_continuous_batching(generation_config=generation, continuous_batching_config=config)
        StopRequest, stop_check = _stop_request_class(), _StopCheck(tok, stop)
        states = [StopRequest(request_id=f"row{i}", initial_tokens=list(ids), max_new_tokens=budget, eos_token_id=tok.eos_token_id,
                              stop_check=stop_check) for i, ids in enumerate(prompt_ids)]
        # 2 tokens: the pages of a request are registered for sharing only while it has not finished
        warmups = [StopRequest(request_id=f"prefix{c}", initial_tokens=list(p), max_new_tokens=2, eos_token_id=-1) for c, p in enumerate(prefixes)]
        device = model.device
        try:
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the manager seeds the global generators
                _queue(manager, warmups or states)  # queued before the thread starts: one deterministic first batch
                manager.start()
                results = _collect(manager, len(warmups or states))
                if warmups:  # each shared prefix is prefilled once; the rows then find its complete pages
                    with manager.pause():  # the loop takes all rows in one go: deterministic batches
                        _queue(manager, states)
                    results = _collect(manager, len(states))
        finally:
            _request_stop(manager)
            with _without_collections():
                manager.stop(block=True)
                manager.destroy()
        return [results[state.request_id] for state in states]


def _half(model) -> bool:
    """Whether transformers may switch the copy to FlashAttention where it is installed: its
    kernels take float16 and bfloat16 only, and the generation thread has no autocast."""
    return next(model.parameters()).dtype in (torch.float16, torch.bfloat16)


def _request_stop(manager) -> None:
    """Ask the idle generation loop to stop and wake it: ``stop`` alone leaves it asleep for up to
    0.1 s (its polling interval), most of a short call's fixed cost."""
    from transformers.generation.continuous_batching.continuous_api import BackgroundThreadStatus

    if manager.is_running():
        manager.background_thread_status.request_stop(BackgroundThreadStatus.FLUSH_AND_STOP, manager.distributed_helper.global_rank)
        manager._wake_up_loop.set()


@contextlib.contextmanager
def _without_collections():
    """transformers' ``stop`` runs ``gc.collect()`` twice (itself and its batch processor's
    ``__del__``): 1.2 of a 1.5 s call on the tiny model, more in a training process with many
    live objects. Its module sees a ``gc`` whose ``collect`` does nothing meanwhile (as
    :func:`paw_lightning.rollout.ct2.convert` does for CTranslate2's converter)."""
    from transformers.generation.continuous_batching import continuous_api

    real_gc = continuous_api.gc
    continuous_api.gc = types.SimpleNamespace(collect=lambda *args, **kwargs: 0)
    try:
        yield
    finally:
        continuous_api.gc = real_gc


def _queue(manager, states) -> None:
    """Queue requests directly (``add_request`` builds plain ``RequestState``\\ s), sorted as
    ``add_requests`` does for prefix sharing."""
    for state in sorted(states, key=lambda s: s.initial_tokens, reverse=True):
        manager.input_queue.put(state)
    manager._wake_up_loop.set()  # as add_request does: a waiting loop looks at the queue at once


def _collect(manager, count: int) -> dict[str, list[int]]:
    """Wait for ``count`` finished requests: request id → generated tokens; raises on a failure."""
    results: dict[str, list[int]] = {}
    while len(results) < count:
        out = manager.get_result(timeout=1)
        if out is None:
            if not manager.is_running():
                error = manager.background_thread_status.fatal_error
                raise RuntimeError(f"continuous batching stopped before every row finished: {error}")
            continue
        if out.error is not None:
            raise RuntimeError(f"continuous batching failed on {out.request_id}: {out.error}")
        if out.is_finished():
            results[out.request_id] = list(out.generated_tokens)
    return results


@dataclass
class _StopCheck:
    """Whether the text of a row's tokens so far ends with a stop string (the ``hf`` engine's
    ``_cut`` rule, token by token)."""

    tokenizer: object
    stop: object

    def __call__(self, text: str, token: int) -> tuple[str, bool]:
        if not self.stop:
            return text, False
        text += self.tokenizer.decode([token])
        return text, stopped(text, self.stop)


@functools.cache
def _stop_request_class():
    """``RequestState`` that also finishes at the token completing a stop string (checked in the
    generation thread, so the batches stay deterministic); made once, on first use."""
    _, _, RequestState = _continuous_batching()
    from transformers.generation.continuous_batching import RequestStatus

    @dataclass
    class StopRequest(RequestState):
        stop_check: _StopCheck | None = None
        text: str = field(default="", repr=False)

        def update_and_check_completion(self, token_id: int, logprob: float | None) -> bool:
            finished = super().update_and_check_completion(token_id, logprob)
            if finished or self.stop_check is None:
                return finished
            self.text, hit = self.stop_check(self.text, token_id)
            if hit:
                self.status = RequestStatus.FINISHED
            return hit

    return StopRequest


@torch.no_grad()
def score_responses(model, prompt_ids: list[list[int]], responses: list[list[int]], pad: int, rows: int) -> list[tuple[list[float], list[float]]]:
    """Each response token's untempered log-prob and its next-token distribution's entropy under
    ``model``, from one forward per ``rows`` rows laid out ``[pad][prompt][response][pad]``
    (positions count unmasked tokens, as ``generate`` does), the logits of the response
    positions only (``logits_to_keep``)."""
    stats = []
    device = next(model.parameters()).device
    for start in range(0, len(prompt_ids), rows):
        prompts, answers = prompt_ids[start : start + rows], responses[start : start + rows]
        width, length = max(map(len, prompts)), max(1, max(map(len, answers)))
        ids = torch.tensor([[pad] * (width - len(p)) + p + a + [pad] * (length - len(a)) for p, a in zip(prompts, answers)])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * (len(p) + len(a)) + [0] * (length - len(a)) for p, a in zip(prompts, answers)])
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=position_ids(mask).to(device),
                       logits_to_keep=length + 1).logits[:, :length]
        tokens = torch.tensor([a + [pad] * (length - len(a)) for a in answers])
        logprobs, entropies = _token_stats(tuple(logits.unbind(1)), tokens)
        stats += [(logprobs[i, : len(a)].tolist(), entropies[i, : len(a)].tolist()) for i, a in enumerate(answers)]
    return stats

"""Rollout and training throughput, peak memory and MFU of one model on one device.

Device: CUDA if available, else CPU. The model is loaded as training loads it
(``LMConfig`` + ``load_model``: base LM in ``--dtype`` with fresh LoRA adapters r=16,
alpha=32 on all linear layers), or with ``--random 1.5b`` built in code: a randomly
initialised Qwen2 model with Qwen2.5-1.5B's dimensions (no download), LoRA added with the
same ``LoraConfig`` as ``load_model``, and the test tokenizer built in code (only its
pad/eos ids are used: the token ids are random), so ``--random`` needs no model file.

Phases, each one warm-up iteration then ``--reps`` timed ones (median; CUDA synchronised):

- ``rollout``: ``model.generate`` (eval mode, KV cache) on ``--batch`` prompts of
  ``--prompt-tokens`` random token ids, sampling as ``GenerationEngine`` does (temperature 1,
  top-p 1, top-k off) with ``min_new_tokens = max_new_tokens = --new-tokens``, so every row
  generates exactly that many tokens (no EOS, no stop string: the engine's ``</action>``
  criterion and response cutting are left out; rollout_throughput.py measures those).
  tokens/s = batch × new tokens / time.
- ``train``: forward + backward + AdamW step on the LoRA parameters, on ``--train-batch``
  rows of ``--seq-len`` random token ids, no attention mask (as training passes for
  right-padded rows), loss = mean of −log p(x_t | x_<t) over the last ``--read-tokens``
  positions of each row (a sample's response and next observation; the prompt before them is
  read by no loss), taken as ``PaWModule`` takes it: ``read_log_softmax`` computes the logits
  and their float32 log-softmax only at the read positions (``--read-tokens 0``: every
  position, the full-vocabulary float32 log-softmax that ran the 1.5B out of memory at
  8 × 2048 on an 80 GB GPU). tokens/s = train batch × seq len / step time. ``--profile``
  prints the top kernels (CUDA; CPU ops on a CPU) of one more step by ``torch.profiler``.

Weights: bytes of the model's tensors (parameters, buffers and bitsandbytes' quantisation
constants; each storage once), not RSS: on CPU, quantising while loading leaves the read
float32 file pages and freed buffers in the RSS. ``--quantization nf4`` loads the base as
4-bit QLoRA weights (bitsandbytes) as training does; benchmarks/qlora_memory.py compares it
with the plain model side by side.

Peak memory: CUDA: ``torch.cuda.max_memory_allocated`` (weights included), reset before each
phase's warm-up. CPU: growth of the peak RSS over the RSS before the warm-up (weights
excluded: they are paged in before, since transformers may mmap them; freed heap pages are
returned to the OS first (glibc ``malloc_trim``) and the peak is reset per phase through
/proc/self/clear_refs, else ru_maxrss).

FLOPs (model FLOPs, so MFU, not HFU: the recomputation of ``--gradient-checkpointing`` is
not counted). N = weights of the base linear layers incl. the LM head (tied or not), not the
embeddings, not the LoRA adapters (r(in+out) per linear, ~1%). Attention score and value
matmuls: 2·2·n_layers·seq·d_attn per token for full attention, counted half for causal
(2·n_layers·seq·d_attn; d_attn = heads × head_dim = hidden here). Training, per token (the LM head's 2·N_head·3 counted only at the read positions):
forward 2N + A; backward 2N + 2A: the base weights are frozen, so a base GEMM's backward only
computes the input gradient (2N, not the 4N of input + weight gradients), while attention
has no weights and its backward is twice its forward. So a LoRA step is ≈ 4N + 3A per token,
not full fine-tuning's 6N + 3A; the 6N-convention figure (PaLM/Kaplan accounting) is printed
alongside for comparability. Rollout: forward only, 2(N − N_head) per forwarded position
(prompt + new − 1), 2·N_head per sampled token (generate computes the logits of the last
position only), causal attention over the whole sequence. MFU = model FLOP/s ÷ peak: from
``--peak-tflops``, else from the dense bf16 table below by ``torch.cuda.get_device_name()``
(for ``--dtype float32`` on a GPU pass ``--peak-tflops``); on a CPU without it, the measured
FLOP/s of a 2048³ matmul in ``--dtype`` with the benchmark's threads (``cpu_matmul_flops``).

    python benchmarks/train_throughput.py                            # embedded SmolLM2-135M
    python benchmarks/train_throughput.py --random 1.5b --gradient-checkpointing
    python benchmarks/train_throughput.py --model /path/to/model --dtype bfloat16 --peak-tflops 989
    python benchmarks/train_throughput.py --quantization nf4         # QLoRA base
    python benchmarks/train_throughput.py --dtype bfloat16 --bf16-mixed   # the main job's update on a CPU with AMX
    python benchmarks/train_throughput.py --batch 2 --prompt-tokens 32 --new-tokens 8 --train-batch 1 --seq-len 64 --reps 1   # smoke test
    python benchmarks/train_throughput.py --threads 1 ...             # busy CPU: 2 threads on 2 shared cores oversubscribe
"""
from __future__ import annotations

import argparse
import json
import resource
import shlex
import statistics
import sys
import time
import warnings

import torch
from machine import machine_load, release_freed_memory, reset_peak_rss, rss_bytes
from peft import LoraConfig, get_peft_model
from torch import nn
from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config
from transformers.utils import logging as hf_logging

from paw_lightning.model import LMConfig, load_model, load_tokenizer, read_log_softmax
from paw_lightning.testing import build_tiny_tokenizer

# Dense bf16 tensor-core peak, TFLOPS; the first key contained in the device name wins.
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.0, "H200 NVL": 835.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0}
# Qwen2.5-1.5B's published config.json dimensions.
RANDOM_CONFIGS = {"1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                           "vocab_size": 151936, "tie_word_embeddings": True, "rope_theta": 1e6, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6}}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="embedded", help="LMConfig.name_or_path (default: embedded)")
    p.add_argument("--random", choices=sorted(RANDOM_CONFIGS), help="randomly initialised Qwen2 model of this size instead of --model")
    p.add_argument("--batch", type=int, default=8, help="rollout batch (default: 8)")
    p.add_argument("--prompt-tokens", type=int, default=512, help="rollout prompt length (default: 512)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens generated per row (default: 128)")
    p.add_argument("--train-batch", type=int, default=4, help="training rows (default: 4)")
    p.add_argument("--seq-len", type=int, default=1024, help="training sequence length (default: 1024)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="default: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--gradient-checkpointing", action="store_true", help="LMConfig.gradient_checkpointing")
    p.add_argument("--bf16-mixed", action="store_true", help="both phases under bfloat16 autocast, as trainer.precision bf16-mixed runs them (the main job's)")
    p.add_argument("--quantization", choices=["nf4"], help="LMConfig.quantization: 4-bit QLoRA base (needs bitsandbytes; not with --random)")
    p.add_argument("--read-tokens", type=int, help="positions per row the loss reads, the last ones (default: seq-len // 4; 0: all)")
    p.add_argument("--profile", action="store_true", help="print the top kernels of one more training step (torch.profiler)")
    p.add_argument("--json", help="also write the figures to this JSON file (benchmarks/qlora_memory.py reads it)")
    p.add_argument("--reps", type=int, default=3, help="timed iterations per phase after one warm-up (default: 3)")
    p.add_argument("--peak-tflops", type=float, help="device peak for MFU (default: table by CUDA device name)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's choice)")
    args = p.parse_args()
    if args.quantization and args.random:
        p.error("--quantization loads the base through from_pretrained: use it with --model, not --random")
    return args


def build(args: argparse.Namespace, device: torch.device):
    """(PEFT model on ``device``, tokenizer, description)."""
    lm = LMConfig(name_or_path=args.model, dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing, quantization=args.quantization)
    if lm.quantization:  # quantised while loading onto the device
        return load_model(lm, device=device), load_tokenizer(lm), f"{args.model!r} NF4"
    if not args.random:
        return load_model(lm).to(device), load_tokenizer(lm), repr(args.model)
    return random_peft_model(args.random, lm, device), build_tiny_tokenizer(), f"random Qwen2 {args.random}"


def random_peft_model(shape: str, lm: LMConfig, device, tokenizer=None):
    """A randomly initialised Qwen2 model of ``shape`` (``RANDOM_CONFIGS``, seed 0) on ``device``
    in ``lm.dtype`` (``auto``: bfloat16), with LoRA added by ``lm``'s settings as ``load_model``
    adds it. Given a ``tokenizer``, its vocabulary size and special ids replace Qwen's (so its
    samples decode)."""
    config = dict(RANDOM_CONFIGS[shape])
    if tokenizer is not None:
        config.update(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(Qwen2Config(**config), dtype=getattr(torch, lm.dtype if lm.dtype != "auto" else "bfloat16"))
    if lm.gradient_checkpointing:  # as load_model does
        base.activation_checkpointing_enable({"use_reentrant": False})
        base.enable_input_require_grads()
    lora = LoraConfig(r=lm.lora_r, lora_alpha=lm.lora_alpha, lora_dropout=lm.lora_dropout, target_modules=lm.lora_target_modules, task_type="CAUSAL_LM")
    return get_peft_model(base, lora)


def model_sizes(model) -> dict:
    """N (base linear weights incl. LM head), N_head, LoRA weights, n_layers, d_attn."""
    base, config = model.get_base_model(), model.config
    linears = [m for name, m in base.named_modules() if isinstance(m, nn.Linear) and "lora_" not in name]
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    head = base.get_output_embeddings()
    return {"n": sum(m.in_features * m.out_features for m in linears), "head": head.in_features * head.out_features,  # not numel: 4-bit weights are packed
            "lora": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "layers": config.num_hidden_layers, "d_attn": config.num_attention_heads * head_dim}


def train_flops_per_token(s: dict, seq: int, weight_grads: bool, read_fraction: float = 1.0) -> float:
    """Forward 2N + A, backward 2N (+ 2N with weight gradients, the 6N convention) + 2A; the LM
    head's share of N only at the ``read_fraction`` of positions whose logits are computed."""
    attention = 2 * s["layers"] * seq * s["d_attn"]  # causal: half of 2·2·layers·seq·d_attn
    return (6 if weight_grads else 4) * (s["n"] - s["head"] * (1 - read_fraction)) + 3 * attention


def rollout_flops(s: dict, batch: int, prompt: int, new: int) -> float:
    positions = prompt + new - 1  # the last sampled token is never fed back
    attention = 2 * s["layers"] * s["d_attn"] * positions**2
    return batch * (2 * (s["n"] - s["head"]) * positions + 2 * s["head"] * new + attention)


class PeakMemory:
    """Peak memory of a phase: CUDA max allocated, or CPU peak-RSS growth."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    @staticmethod
    def _status_kib(key: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":"))

    def reset(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return
        release_freed_memory()  # freed heap pages back to the OS, or a phase reusing them would show no growth
        self.before = rss_bytes()
        try:
            reset_peak_rss()
            self.hwm = True
        except OSError:
            self.hwm = False

    def peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        peak = self._status_kib("VmHWM") if self.hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return max(peak * 1024 - self.before, 0)


def weight_bytes(model) -> int:
    """Bytes of every parameter, buffer and bitsandbytes quantisation state (absmax, code,
    the nested state of double quantisation), counting each storage once (tied weights)."""
    tensors = [*model.parameters(), *model.buffers()]
    for p in model.parameters():
        state = getattr(p, "quant_state", None)
        while state is not None:
            tensors += [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
            state = getattr(state, "state2", None)
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@torch.no_grad()
def page_in(model) -> None:
    """Read every weight once: on CPU, transformers maps the safetensors file and its pages
    become resident (and count as RSS) only when first touched, which is not a phase's cost."""
    for p in model.parameters():
        p.sum()


def timed(step, reps: int, device: torch.device, memory: PeakMemory) -> tuple[float, int]:
    """Median seconds of ``step(i)`` over ``reps`` runs after one warm-up, and the phase's peak memory."""
    memory.reset()
    times = []
    for i in range(reps + 1):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        step(i)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:]), memory.peak()


def rollout_step(model, tokenizer, args, device):
    ids = torch.randint(model.config.vocab_size, (args.batch, args.prompt_tokens), generator=torch.Generator().manual_seed(1)).to(device)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                              pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)

    @torch.no_grad()
    def step(i: int) -> torch.Tensor:
        torch.manual_seed(i)
        # synced_gpus: under FSDP2 (benchmarks/fsdp_generation.py) every rank runs every forward
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16_mixed):
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config, synced_gpus=torch.distributed.is_initialized())
        assert out.shape[1] == args.prompt_tokens + args.new_tokens, out.shape
        return out

    return step


def read_tokens(args) -> int:
    """Positions per training row whose next-token log-prob the loss reads (the last ones)."""
    if args.read_tokens is None:
        return max(args.seq_len // 4, 1)
    return args.seq_len - 1 if args.read_tokens == 0 else min(args.read_tokens, args.seq_len - 1)


def profile_top_kernels(step, device: torch.device, rows: int = 12) -> str:
    """The top ``rows`` entries of one ``step`` by self time: operators and, on CUDA, their
    kernels too (a GEMM shows as its ``aten::`` operator and as its kernel)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step(-1)
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def train_step(model, args, device):
    ids = torch.randint(model.config.vocab_size, (args.train_batch, args.seq_len), generator=torch.Generator().manual_seed(2)).to(device)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)

    keep_from = args.seq_len - read_tokens(args)
    read = torch.zeros_like(ids, dtype=torch.bool)
    read[:, max(keep_from, 1):] = True  # position t's token is predicted from t − 1
    mask = torch.ones_like(ids, dtype=torch.bool)

    def step(i: int) -> None:
        with torch.autocast(device.type, torch.bfloat16, enabled=args.bf16_mixed):
            logp, targets, _ = read_log_softmax(model, ids, mask, read, max(keep_from, 1))
        (-logp.gather(-1, targets[:, None]).mean()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


CPU_PEAK_SIZE = 2048


def cpu_matmul_flops(dtype: torch.dtype) -> float:
    """This CPU's measured limit: FLOP/s of a large square matmul in ``dtype`` (median of 5
    after 2 warm-ups), with the benchmark's threads. bfloat16 runs on AMX / AVX-512 BF16 where
    the CPU has them, else emulated (slower than float32)."""
    a, b = torch.randn(CPU_PEAK_SIZE, CPU_PEAK_SIZE, dtype=dtype), torch.randn(CPU_PEAK_SIZE, CPU_PEAK_SIZE, dtype=dtype)
    times = []
    for i in range(7):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * CPU_PEAK_SIZE**3 / statistics.median(times[2:])


def peak_flops(args, device) -> tuple[float | None, str]:
    if args.peak_tflops:
        return args.peak_tflops * 1e12, f"{args.peak_tflops:g} TFLOPS (--peak-tflops)"
    if device.type != "cuda":
        flops = cpu_matmul_flops(getattr(torch, args.dtype))
        return flops, f"{flops / 1e12:.3f} TFLOP/s measured (median of 5 {CPU_PEAK_SIZE}³ {args.dtype} matmuls, {torch.get_num_threads()} threads)"
    name = torch.cuda.get_device_name()
    key = next((k for k in PEAK_TFLOPS if k in name), None)
    if key is None:
        return None, f"unknown for {name!r}: pass --peak-tflops"
    return PEAK_TFLOPS[key] * 1e12, f"{PEAK_TFLOPS[key]:g} TFLOPS dense bf16 (table entry {key!r})"


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    args.dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model, tokenizer, label = build(args, device)
    sizes, peak = model_sizes(model), peak_flops(args, device)
    device_name = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads, {machine_load()})"
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"device: {device_name}; torch {torch.__version__}; peak: {peak[1]}")
    print(f"model: {label}, {args.dtype}{' under bf16 autocast' if args.bf16_mixed else ''}, gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}, loaded in {time.perf_counter() - start:.1f} s; "
          f"N = {sizes['n'] / 1e6:.1f} M linear weights (LM head {sizes['head'] / 1e6:.1f} M), LoRA {sizes['lora'] / 1e6:.2f} M, "
          f"{sizes['layers']} layers, d_attn {sizes['d_attn']}")

    weights = weight_bytes(model)
    print(f"weights held: {weights / 2**30:.3f} GiB (tensor bytes)")

    memory = PeakMemory(device)
    page_in(model)
    model.eval()
    gen_s, gen_mem = timed(rollout_step(model, tokenizer, args, device), args.reps, device, memory)
    model.train()
    train = train_step(model, args, device)
    train_s, train_mem = timed(train, args.reps, device, memory)

    gen_tokens, train_tokens = args.batch * args.new_tokens, args.train_batch * args.seq_len
    gen_flops = rollout_flops(sizes, args.batch, args.prompt_tokens, args.new_tokens) / gen_s
    read_fraction = read_tokens(args) / args.seq_len
    train_flops = [train_tokens * train_flops_per_token(sizes, args.seq_len, g, read_fraction) / train_s for g in (False, True)]

    def mfu(flops: float | None) -> str:
        return "n/a" if flops is None or peak[0] is None else f"{100 * flops / peak[0]:.1f}%"

    mem_kind = "peak alloc GiB" if device.type == "cuda" else "peak RSS growth GiB"
    rows = [("rollout", f"b{args.batch} {args.prompt_tokens}+{args.new_tokens}", gen_tokens / gen_s, gen_s, gen_mem, mfu(gen_flops), "-", gen_flops),
            ("train", f"b{args.train_batch} x {args.seq_len} r{read_tokens(args)}", train_tokens / train_s, train_s, train_mem, mfu(train_flops[0]), mfu(train_flops[1]), train_flops[0])]
    header = f"{'phase':<8}{'shape':>14}{'tokens/s':>11}{'median s':>10}{mem_kind:>21}{'TFLOP/s':>9}{'MFU (4N)':>10}{'MFU (6N conv.)':>16}"
    print("\n" + header + "\n" + "-" * len(header))
    for phase, shape, tok_s, seconds, mem, m4, m6, flops in rows:
        print(f"{phase:<8}{shape:>14}{tok_s:>11.1f}{seconds:>10.3f}{mem / 2**30:>21.2f}{flops / 1e12:>9.3f}{m4:>10}{m6:>16}")
    print(f"""
rollout: new tokens/s (every row generates exactly --new-tokens); its MFU counts forward FLOPs only (2N per position, the LM head
         only at sampled positions, causal attention); generation is memory-bound, so a low figure is expected
train:   tokens/s over all batch × seq-len tokens; TFLOP/s and MFU (4N) at 4N + 3A per token (frozen base: no weight gradients,
         A = causal attention 2·layers·seq·d_attn); MFU (6N conv.) at 6N + 3A, the full fine-tuning convention; recomputation
         under gradient checkpointing not counted (MFU, not HFU)
         (the LM head only at the r read positions of each row)
median of {args.reps} timed iterations after 1 warm-up per phase; at end: {machine_load()}""")
    kernels = profile_top_kernels(train, device) if args.profile else None
    if kernels:
        print("\ntop kernels of one training step (torch.profiler, by self time):\n" + kernels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": label, "dtype": args.dtype, "device": device_name, "weights_gib": weights / 2**30, "peak_includes_weights": device.type == "cuda",
                       **{f"{phase}_{key}": value for phase, _, tok_s, seconds, mem, _, _, _ in rows
                          for key, value in (("tokens_per_s", tok_s), ("seconds", seconds), ("peak_gib", mem / 2**30))},
                       "train_read_tokens": read_tokens(args), "train_mfu_4n": mfu(train_flops[0]), "train_mfu_6n": mfu(train_flops[1]),
                       "rollout_mfu": mfu(gen_flops), "peak": peak[1], "top_kernels": kernels}, f, indent=1)


if __name__ == "__main__":
    main()

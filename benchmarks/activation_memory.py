"""What one training forward keeps for its backward: bytes per token, by tensor shape.

The model is loaded as training loads it (``LMConfig`` + ``load_model``: the embedded 135M by
default, LoRA on every linear layer); one forward of ``--rows`` × ``--seq-len`` random token ids
through ``read_log_softmax`` (as ``PaWModule`` takes a step's log-probs: the vocabulary-sized
log-softmax only at the last ``--read-tokens`` positions of each row). A saved-tensor hook records
every tensor autograd saves, each storage once; the model's parameters are left out (they are
resident anyway). No backward runs. Counted, not timed, so the figures do not depend on the
machine's load; the process's peak during backward is higher (gradients of the activations).
The micro-batch budget ``model.micro_batch_tokens`` times the bytes per token printed here is
what one micro-batch of an update holds (docs/results/speed-and-memory.md#the-learning-benchmarks-memory).

    python benchmarks/activation_memory.py                                   # 4 x 256 tokens, float32
    python benchmarks/activation_memory.py --gradient-checkpointing          # layers recomputed in backward
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch

from paw_lightning.model import LMConfig, load_model, read_log_softmax

MIB = 2**20


def saved_for_backward(lm, rows: int, seq_len: int, read_tokens: int) -> Counter:
    """Bytes of the tensors one forward saves for backward, by shape (each storage counted once,
    parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in lm.parameters()}
    seen: set[int] = set()
    by_shape: Counter = Counter()

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.data_ptr() not in params:
            seen.add(storage.data_ptr())
            by_shape[tuple(t.shape)] += storage.nbytes()
        return t

    ids = torch.randint(0, lm.config.vocab_size, (rows, seq_len), generator=torch.Generator().manual_seed(0))
    read = torch.zeros(rows, seq_len, dtype=torch.bool)
    read[:, seq_len - read_tokens:] = True
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, targets, _ = read_log_softmax(lm, ids, torch.ones_like(ids), read, keep_from=seq_len - read_tokens - 1)
        logp.gather(-1, targets.unsqueeze(-1)).sum()
    return by_shape


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded", help="LMConfig.name_or_path")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--read-tokens", type=int, default=64, help="positions per row the loss reads (the last ones)")
    parser.add_argument("--gradient-checkpointing", action="store_true", help="LMConfig.gradient_checkpointing")
    parser.add_argument("--top", type=int, default=6, help="shapes to list")
    args = parser.parse_args(argv)
    if not 0 < args.read_tokens < args.seq_len:
        parser.error("--read-tokens must be between 1 and --seq-len - 1")
    lm = load_model(LMConfig(name_or_path=args.model, dtype=args.dtype, gradient_checkpointing=args.gradient_checkpointing))
    lm.train()
    by_shape = saved_for_backward(lm, args.rows, args.seq_len, args.read_tokens)
    tokens = args.rows * args.seq_len
    total = sum(by_shape.values())
    print(f"{args.model} ({args.dtype}, gradient checkpointing {'on' if args.gradient_checkpointing else 'off'}), "
          f"{args.rows} x {args.seq_len} tokens, {args.read_tokens} read per row:")
    print(f"saved for backward: {total / MIB:.0f} MiB = {total / tokens / 2**10:.0f} KiB per token "
          f"({total / tokens * 2048 / 2**30:.2f} GiB for a 2048-token micro-batch)")
    for shape, nbytes in by_shape.most_common(args.top):
        print(f"  {str(shape):<24} {nbytes / MIB:8.0f} MiB")


if __name__ == "__main__":
    main()

"""paw_lightning: RL for LLM agents in text environments with world-model co-training."""

import logging

__version__ = "0.1.0"

# peft imports bitsandbytes whenever it is installed; on a CPU with AVX512-BF16, bitsandbytes
# then warns at import that it cannot fetch an optional kernel from the Hugging Face hub
# (package `kernels`) and uses its own C++ kernel instead. That is the offline default here,
# so the line, printed by every command, only misleads.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")
)

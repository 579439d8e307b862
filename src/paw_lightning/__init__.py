"""paw_lightning: RL for LLM agents in text environments with world-model co-training."""

__version__ = "0.1.0"

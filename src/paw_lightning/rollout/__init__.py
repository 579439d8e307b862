"""Rollouts: batched generation, the multi-turn collector, prompts and step samples."""

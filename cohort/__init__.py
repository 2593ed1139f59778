"""cohort: online reinforcement learning from verifiable rewards for language models."""

__version__ = "0.1.0"

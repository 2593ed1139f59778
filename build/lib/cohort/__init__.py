"""cohort: online reinforcement learning from verifiable rewards for language models.

`cohort.train(config, reward_funcs=..., train_dataset=...)` is the Python API (cohort/api.py); it is imported on
first use, so `import cohort` (and the command line) stays light.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "train":
        from cohort.api import train  # torch, transformers and the trainer load only when the API is used

        return train
    raise AttributeError(f"module 'cohort' has no attribute {name!r}")

"""What validating a config returns: `RunPlan`, the resolved config, its batch plan and what validation read.

`cohort.plan.validate.validate_config(cfg)` never writes into `cfg`: the values it settles (`model.dtype = auto`, an
unset `engine.gpu_memory_utilization` under the GPU plan, and the one spelling `environment` read into its hub's field)
go into a new config, `RunPlan.config`, which the run then reads everywhere (the saved config.yaml included). What validation had to read from disk to check the
config (the model's directory, its tokenizer, the data and every prompt encoded as the trainer keeps them) travels
in `RunPlan.read`, so the trainer's setup (cohort/trainer/build_parts.py) reads none of it again: the tokenizer loads once
per process, the prompts are encoded once.

`read` is None when validation did not read those files: a config validated without its files (`check_files=False`),
a `tiny:*` model (its tokenizer is built with the model, on first use, by the setup), a model whose tokenizer could
not be read, and a plan handed to another process (`for_another_process`: a Ray actor gets the config and the batch
plan; a tokenizer and the prompts are this process's objects, and the actor's node reads its own files once).

`environment` (`RunEnvironment`) is each environment the config names, resolved once where validation checks it (the
tools section's functions and environment class, an OpenEnv server's schema, a verifiers environment and its tasks)
and used as it is by the setup and `cohort eval`; like `read`, it stays in this process.

Left out: the weights (validation never loads them) and the GPU memory plan (`cohort plan` prints it; the engine
reads its result from `config.engine.gpu_memory_utilization`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohort.config import CohortConfig
from cohort.plan.batch import BatchPlan
from cohort.plan.run_environment import RunEnvironment
from cohort.prompts import EncodedPrompts


@dataclass(frozen=True)
class RunInputs:
    """What validation read to check a config, for the trainer's setup to use as it is."""

    model_dir: Path | None  # the checkpoint directory the run loads; None for a Hub id (its weights are fetched by the run)
    tokenizer: Any  # the model's transformers tokenizer (loaded once, from the checkpoint or the Hub snapshot)
    prompts: EncodedPrompts  # the train and eval prompts kept under the run's limit, as token ids
    task_specs: list | None  # the built-in task's reward specs (None: the data is no built-in task); the run's reward
    # set is composed from them, the config and the environment (cohort/plan/run_rewards.py's `reward_specs`)


@dataclass(frozen=True)
class RunPlan:
    """A validated run: `config` (resolved: a new object, the caller's config untouched), `batch` (its batch
    arithmetic and mode), `read` (what validation read, or None: see the module docstring) and `environment` (each
    environment the config names, resolved once: cohort/plan/run_environment.py; None: the process resolves its own)."""

    config: CohortConfig
    batch: BatchPlan
    read: RunInputs | None = None
    environment: RunEnvironment | None = None

    def for_another_process(self, config: CohortConfig | None = None) -> RunPlan:
        """This plan without what this process read or resolved (a tokenizer, the encoded prompts, its environments),
        for a process that reads its own files once (a Ray actor); `config`: the config that process runs (default:
        this plan's)."""
        return dataclasses.replace(self, config=self.config if config is None else config, read=None, environment=None)

"""Which GPUs the rollout engine gets when it runs in its own process on this machine.

`engine_gpus(trainer_processes, tensor_parallel_size, visible)`: rank r of the
trainer trains on GPU r (`cohort.models.devices.resolve_device`), so a local
rollout server (engine.mode=local_server, and rank 0's vLLM child in a
multi-process run) takes the `tensor_parallel_size` GPUs after the trainer's;
with too few left it shares the first ones with the trainer, and the planner
then splits their memory as for a colocated engine. A plain decision, unit-tested
without a GPU; `cohort.rollout.server.app.LocalServer` turns it into the child's
CUDA_VISIBLE_DEVICES, `cohort.plan.validate` plans memory with it.

`training_processes(cfg)`: how many processes train together (torchrun's
WORLD_SIZE, else train.num_processes), the one rule both read.

Left out: several machines (Ray places its actors itself) and choosing GPUs by
their free memory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from cohort.config import CohortConfig


@dataclass(frozen=True)
class EngineGpus:
    """The GPUs a local server's vLLM gets, as this process numbers them, and whether the trainer uses them too."""

    devices: list[int]
    shared: bool  # True: no GPU is left beside the trainer's, so vLLM shares them (the planner splits their memory)


def engine_gpus(trainer_processes: int, tensor_parallel_size: int, visible: int) -> EngineGpus | None:
    """GPUs trainer_processes ... trainer_processes + tensor_parallel_size - 1 when they exist, else the first
    `tensor_parallel_size`, shared with the trainer. None: no GPU at all (the engine runs on the CPU), or fewer GPUs
    than tensor_parallel_size (validation refuses that)."""
    if visible == 0 or tensor_parallel_size > visible:
        return None
    if trainer_processes + tensor_parallel_size <= visible:
        return EngineGpus(list(range(trainer_processes, trainer_processes + tensor_parallel_size)), shared=False)
    return EngineGpus(list(range(tensor_parallel_size)), shared=True)


def visible_gpus() -> int:
    """GPUs this process sees (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def training_processes(cfg: CohortConfig) -> int:
    """Processes training together, one GPU each: torchrun's WORLD_SIZE when launched by it, else train.num_processes."""
    return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else cfg.train.num_processes

"""`TrainerState`: every counter of a training run, and the generation batch it trains on, in one value.

The Trainer (cohort/trainer/trainer.py) reads and advances it (its weight sync, cohort/trainer/weight_sync.py, the
version the engine holds); a checkpoint (cohort/trainer/checkpoint.py) saves it with `state_dict()` and restores it
with `load_state_dict()`; a step that fails is rewound to the `copy()` taken at its start (`rewind_to`). Nothing else
writes it.

Beside it, the rest of what a run's state is: `Checkpointed`, the one typed value a checkpoint writes and reads back
(cohort/trainer/checkpoint.py) and a failed step rewinds (cohort/trainer/failure.py): the parts, the `TrainerState` and
the `stateful_parts` by the names state.pt uses; and the process's random generators (`rng_state`).

What it holds:
- `step`: optimizer steps taken; `policy_version`: bumped by each optimizer step (every sampled token carries the
  version that sampled it); `synced_version`: the version the rollout engine holds (-1: nothing pushed yet; a
  restored state sets it to -1, since a fresh engine holds model.path's weights);
- `batch`: the generation batch the current steps train on, and `step_indices`: this step's completions within it
  (what the step's logs show). A batch serves `steps_per_generation` optimizer steps (the plan's
  train.steps_per_generation x algorithm.num_iterations); a checkpoint saved inside one keeps it, so the resumed run
  trains on the same completions, old and reference log-probs, the same runs (`RolloutBatch.runs`). Its `episodes`
  (the tool loop's or an agent's records) are saved as plain data (`record_to_state`: a `weights_only` load refuses
  the objects, and a live environment instance is never saved), so the steps after a resume inside a batch log
  completions.jsonl's conversations as the run would have.

Left out: the generation index (generation batches admitted, which seeds every completion's sampling). It is
advanced by the rollout scheduler when it admits a batch, so it is the scheduler's counter, saved in its own state
dict (cohort/rollout/scheduler.py). Also left out: what a part holds (optimizer moments, the sampler's position,
the KL controller's beta): each part saves its own state.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from cohort.rollout.base import record_from_state, record_to_state
from cohort.rollout.scheduler import Scheduler
from cohort.trainer.parts import TrainerParts
from cohort.trainer.rollout_batch import RolloutBatch
from cohort.trainer.sync_check import SyncCheck


@dataclass
class TrainerState:
    """The run's counters and current batch (module docstring)."""

    steps_per_generation: int  # optimizer steps one generation batch serves (the plan's optimizer_steps_per_generation)
    step: int = 0  # optimizer steps taken
    policy_version: int = 0  # bumped by each optimizer step
    synced_version: int = -1  # the policy version the engine holds (-1: not pushed yet)
    batch: RolloutBatch | None = None  # the generation batch the current steps train on
    step_indices: list[int] = field(default_factory=list)  # this step's completions within `batch`

    @property
    def mid_generation(self) -> bool:
        """Whether the next step trains on the current batch again (it serves more than the steps taken so far)."""
        return self.step % self.steps_per_generation != 0

    def state_dict(self) -> dict[str, Any]:
        """The counters, and the batch when the state is inside one (else None: the next step generates anew)."""
        keep = self.batch is not None and self.mid_generation
        return {"step": self.step, "policy_version": self.policy_version,
                "batch": batch_to_state(self.batch) if keep else None}

    def load_state_dict(self, state: dict[str, Any], device: torch.device | None = None) -> None:
        """Restore from `state_dict()`'s output (the batch's tensors onto `device`, the trainer's). The engine is
        taken to hold none of these weights (`synced_version` = -1): the next generation pushes them."""
        self.step, self.policy_version = int(state["step"]), int(state["policy_version"])
        self.batch = batch_from_state(state["batch"], device) if state["batch"] is not None else None
        self.synced_version = -1

    def copy(self) -> TrainerState:
        """A copy to rewind to (the batch shared: a step never changes a batch it did not make)."""
        return dataclasses.replace(self, step_indices=list(self.step_indices))

    def rewind_to(self, snap: TrainerState) -> None:
        """Back to `snap` (a `copy()` taken at a step's start): its counters and its batch."""
        self.step, self.policy_version, self.batch = snap.step, snap.policy_version, snap.batch


def batch_to_state(batch: RolloutBatch) -> dict[str, Any]:
    """A generation batch as plain tensors and lists (torch.load(weights_only=True) reads it back); its multi-turn
    records as each saves itself (`record_to_state`: no live instance, such as an environment, travels)."""
    out: dict[str, Any] = {"numpy": []}
    for f in dataclasses.fields(batch):
        if f.name == "streamed":
            continue  # (gradient sums live only until the batch's one step: never inside a checkpointed batch)
        value = getattr(batch, f.name)
        if f.name == "episodes" and value is not None:
            value = [record_to_state(e) if e is not None else None for e in value]
        if isinstance(value, np.ndarray):
            value = torch.from_numpy(value.copy())
            out["numpy"].append(f.name)
        out[f.name] = value
    return out


def batch_from_state(state: dict[str, Any], device: torch.device | None = None) -> RolloutBatch:
    """The saved batch, its tensors (advantages, log-probs, values) moved onto `device` (the trainer's)."""
    values = {k: (v.numpy() if k in state["numpy"] else _to_device(v, device)) for k, v in state.items() if k != "numpy"}
    if values.get("episodes") is not None:
        values["episodes"] = [record_from_state(e) if e is not None else None for e in values["episodes"]]
    return RolloutBatch(**values)


def _to_device(value: Any, device: torch.device | None) -> Any:
    if device is None:
        return value
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
        return [v.to(device) for v in value]
    return value


# --------------------------------------------------------------------------- the whole of a run's state


class Stateful(Protocol):
    """A part whose state a checkpoint holds: `state_dict()` (torch.load(weights_only=True) must read it back) and
    `load_state_dict(state)`."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def stateful_parts(parts: TrainerParts, sync_check: SyncCheck, scheduler: Scheduler) -> dict[str, Stateful]:
    """The trainer's parts whose state a checkpoint holds, by the name each is saved under in state.pt (renaming one
    renames its entry: cohort/trainer/checkpoint.py's `RENAMED_PARTS` reads the old name). Absent parts (no critic,
    say) are left out."""
    named = {"optimizer": parts.optimizer, "lr_schedule": parts.lr_schedule, "sampler": parts.sampler,
             "kl_controller": parts.kl_controller, "critic": parts.critic, "sync_check": sync_check,
             "rollout": scheduler}  # (trainer.scheduler; "scheduler" is an old lr_schedule's key)
    return {name: part for name, part in named.items() if part is not None}


@dataclasses.dataclass(frozen=True)
class Checkpointed:
    """Everything a checkpoint writes and reads back (cohort/trainer/checkpoint.py) and a failed step rewinds
    (cohort/trainer/failure.py), as the Trainer holds it (`Trainer.checkpointed()`)."""

    parts: TrainerParts  # the policy (under LoRA: its adapter), the tokenizer, the device, the processes, run_dir
    state: TrainerState  # the counters and the current batch
    stateful: dict[str, Stateful]  # every other part with state, by the name saved under (`stateful_parts`)
    generation_batch_size: int  # the plan's: a checkpoint saved inside a batch resumes only under the same one
    keep: int  # run.keep_checkpoints: how many checkpoints `save_checkpoint` leaves


def rng_state() -> dict[str, Any]:
    """The process's random generators (python, numpy, torch's CPU and CUDA): saved and rewound with the counters."""
    np_state = np.random.get_state()
    state = {"python": random.getstate(), "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()`'s output."""
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])

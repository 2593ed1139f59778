"""Whether the machine can hold the run: the memory estimate against the machine's memory, refused with the fixes.

- `host_rows(cfg, plan, facts)`: what the host holds when the run trains on the CPU: the training process's peak
  (`memory_estimate`) and, with vLLM on this machine (engine.mode colocate or local_server), its CPU share
  (`cpu_engine_share`); their sum is `cohort plan`'s `process total`.
- `trainer_gpu_rows(cfg, plan, facts)`: the trainer alone on its GPU (the transformers engine, or vLLM on a remote
  server): its peak and the CUDA context. With vLLM on the same GPU the split is `gpu_memory_plan`'s, not this.
- `machine_fit_problems(cfg, plan, facts, machine, rows)`: one refusal when the rows' sum is more than the machine's
  memory, naming both numbers and the fixes, ordered by what they save, each re-estimated with the same rows
  (`fixes`): whether it fits alone, and all together when none does; [] when it fits or train.check_memory is false.

Where "cannot fit" is drawn: the estimate above the machine's whole memory (`MachineMemory.total`: MemTotal, or the
cgroup's limit when lower; the GPU's total_memory), with no margin below it. The estimate is rough both ways (0.94× the
measured peak of the SmolLM2 example, docs/runs.md; its activations counted at the longest sequence in every
micro-batch), so a run estimated just under the machine's memory may well run, and a refusal must never stop a run
that can work. Above the total it cannot: the estimate leaves out the free heap, AdamW's temporaries and the libraries'
own mappings, so the real peak is higher still, and the kernel ends the process (or it pages to swap, for whoever has
that to spare: train.check_memory=false runs it anyway). What is available now, beside others' processes, is not
compared (they may end; `cohort plan` shows it).

Pure: the machine's memory is an argument (cohort/plan/validate.py reads it: `machine_memory()` for the host, CUDA
for the GPU). Left out: several training processes on GPUs (each holds a shard; the estimate is a whole process's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from cohort.config import CohortConfig
from cohort.models.host_memory import MachineMemory
from cohort.plan.batch import BatchPlan
from cohort.plan.memory import CUDA_CONTEXT_BYTES, ModelFacts, cpu_engine_share, human_bytes, memory_estimate

Rows = list[tuple[str, int, str]]
LORA_RANK = 16  # the rank docs/lora.md starts from


def host_rows(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts) -> Rows:
    """The training process's peak, and vLLM's CPU share when vLLM runs on this machine (colocated or a local server)."""
    engine_here = cfg.engine.name == "vllm" and cfg.engine.mode in ("colocate", "local_server")
    return memory_estimate(cfg, plan, facts) + (cpu_engine_share(cfg, facts) if engine_here else [])


def trainer_gpu_rows(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts) -> Rows:
    """The trainer's peak on a GPU of its own, and the CUDA context."""
    return memory_estimate(cfg, plan, facts) + [("CUDA context", CUDA_CONTEXT_BYTES, "per process (a fixed allowance)")]


def total(rows: Rows) -> int:
    return sum(size for _, size, _ in rows)


# --------------------------------------------------------------------------- the fixes, re-estimated


@dataclasses.dataclass(frozen=True)
class Fix:
    """One change of the config (`fields`: `section__field` = value) and the estimate with it, bytes."""

    label: str  # the overrides, as a user types them
    fields: dict
    needed: int


def with_fields(cfg: CohortConfig, fields: dict) -> CohortConfig:
    """`cfg` with `fields` changed (`{"train__micro_batch_size": 4}`); `cfg` is not written."""
    for key, value in fields.items():
        section, name = key.split("__")
        cfg = cfg.model_copy(update={section: getattr(cfg, section).model_copy(update={name: value})})
    return cfg


def applied(cfg: CohortConfig, plan: BatchPlan, fields: dict) -> tuple[CohortConfig, BatchPlan]:
    """`cfg` and `plan` with `fields` changed (a micro-batch's in the plan too); neither is written."""
    cfg = with_fields(cfg, fields)
    if "train__micro_batch_size" in fields:
        size = min(fields["train__micro_batch_size"], plan.completions_per_step)
        plan = dataclasses.replace(plan, micro_batch_size=size, micro_batches_per_step=math.ceil(plan.completions_per_step / size))
    return cfg, plan


Estimate = Callable[[CohortConfig, BatchPlan], int]


def _changes(cfg: CohortConfig, world_size: int, needs_critic: bool) -> list[tuple[str, dict]]:
    """(label, fields) of each change that may save memory, the micro-batch aside (`_micro_batch_fix`)."""
    from cohort.models.lora import lora_problems  # here: the module holds the adapter code (torch); the printout must not load it

    changes = []
    if not cfg.train.gradient_checkpointing:
        changes.append(("train.gradient_checkpointing=true", {"train__gradient_checkpointing": True}))
    if not cfg.lora.rank and not lora_problems(with_fields(cfg, {"lora__rank": LORA_RANK}),
                                               needs_critic=needs_critic, world_size=world_size):
        changes.append((f"lora.rank={LORA_RANK}", {"lora__rank": LORA_RANK}))
    if cfg.model.dtype == "float32":
        changes.append(("model.dtype=bfloat16", {"model__dtype": "bfloat16"}))
    if cfg.model.dtype != "bfloat16" or cfg.train.precision == "mixed":
        pure = "train.precision=pure" if cfg.model.dtype == "bfloat16" else "model.dtype=bfloat16 train.precision=pure"
        changes.append((pure, {"model__dtype": "bfloat16", "train__precision": "pure"}))
    if cfg.algorithm.beta and not cfg.lora.rank:
        changes.append(("algorithm.beta=0", {"algorithm__beta": 0.0}))
    return changes


def _micro_batch_fix(cfg: CohortConfig, plan: BatchPlan, estimate: Estimate, budget: int) -> Fix | None:
    """The largest smaller micro-batch that fits (a divisor of the completions per step, as the batch check asks),
    else 1; None at 1 already."""
    for size in (m for m in range(plan.micro_batch_size - 1, 0, -1) if plan.completions_per_step % m == 0):
        fields = {"train__micro_batch_size": size}
        needed = estimate(*applied(cfg, plan, fields))
        if needed <= budget or size == 1:
            return Fix(f"train.micro_batch_size={size}", fields, needed)
    return None


def fixes(cfg: CohortConfig, plan: BatchPlan, estimate: Estimate, budget: int, *, world_size: int = 1,
          needs_critic: bool = False) -> list[Fix]:
    """Each change that lowers the estimate, alone, by what it saves (most first)."""
    found = [_micro_batch_fix(cfg, plan, estimate, budget)]
    found += [Fix(label, fields, estimate(*applied(cfg, plan, fields))) for label, fields in _changes(cfg, world_size, needs_critic)]
    now = estimate(cfg, plan)
    return sorted((f for f in found if f is not None and f.needed < now), key=lambda f: f.needed)


def all_together(cfg: CohortConfig, plan: BatchPlan, found: list[Fix], estimate: Estimate) -> int:
    """The estimate with every fix applied at once (the cheapest precision last, so `pure` wins over `mixed`)."""
    fields = {}
    for fix in sorted(found, key=lambda f: -f.needed):
        fields.update(fix.fields)
    return estimate(*applied(cfg, plan, fields))


# --------------------------------------------------------------------------- the refusal


def machine_fit_problems(cfg: CohortConfig, plan: BatchPlan, facts: ModelFacts, machine: MachineMemory,
                         rows: Callable[[CohortConfig, BatchPlan, ModelFacts], Rows], *, where: str,
                         world_size: int = 1, needs_critic: bool = False) -> list[str]:
    """Why `machine` cannot hold the run (`rows`: `host_rows` or `trainer_gpu_rows`; `where`: "this machine's" or
    "the GPU's"), both numbers and the fixes; [] when the estimate is within its total or train.check_memory is false."""
    def estimate(c: CohortConfig, p: BatchPlan) -> int:
        return total(rows(c, p, facts))

    needed = estimate(cfg, plan)
    if needed <= machine.total or not cfg.train.check_memory:
        return []
    found = fixes(cfg, plan, estimate, machine.total, world_size=world_size, needs_critic=needs_critic)
    listed = "; ".join(f"{f.label} (-{human_bytes(needed - f.needed)}: {human_bytes(f.needed)}, "
                       f"{'fits' if f.needed <= machine.total else 'not enough alone'})" for f in found)
    if found and not any(f.needed <= machine.total for f in found):
        together = all_together(cfg, plan, found, estimate)
        listed += (f"; all of them together: {human_bytes(together)}, "
                   + ("fits" if together <= machine.total else "still too much: a smaller model or a larger machine"))
    return [f"memory: the run's estimate {human_bytes(needed)} (`cohort plan ... train.check_memory=false` lists it) is more than {where} "
            f"{human_bytes(machine.total)} ({machine.source}), so it cannot fit; fixes, by what they save: "
            f"{listed or 'a smaller model or a larger machine'}; or train.check_memory=false to run anyway (with swap)"]

"""Multi-process training: the policy sharded with FSDP2, rollout and rewards on rank 0.

`cohort train` under `torchrun --nproc_per_node N` (or with `train.num_processes=N`,
which re-launches itself under torchrun) runs N copies of the same driver loop.
`DistContext` is everything the loop needs to know about that; in a single
process it is `LocalContext`, whose every method is the identity, so the loop
has one code path.

How the work is split:

- rank 0 owns the rollout engine and the reward functions and broadcasts
  their results, so every rank holds the same full generation batch
  (`cohort.distributed.rank0`);
- advantages are computed from that full batch on every rank (identical by
  construction, so group statistics equal the single-process ones);
- each optimizer step's completions are cut into W contiguous blocks of whole
  groups (train.prompts_per_step must divide by W); each rank does its
  forward/backward on its block;
- the loss is normalised by the *global* count divided by W (FSDP averages
  gradients over ranks), so the gradient equals the single-process one;
- the full weights are gathered only to push them to the engine (rank 0
  receives them) and to save the final model.

Choices and limits: gloo on CPU. The trainer keeps its tensors on the CPU today,
so CUDA/NCCL multi-process waits for device support in the loop. Old/reference
log-probs, when needed, are computed for the full batch on every rank (FSDP
needs every rank in every forward; simple, redundant). A PPO critic and
checkpoint/resume of a sharded optimizer are not supported multi-process yet
(validation says so).
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

CLOSE_TIMEOUT = timedelta(seconds=120)  # how long a rank that finished waits for the others before tearing down


class LocalContext:
    """One process: nothing to split or gather."""

    rank, world_size, is_main = 0, 1, True

    def local_indices(self, indices: list[int], group_size: int) -> list[int]:
        return indices

    def global_count(self, count: torch.Tensor) -> torch.Tensor:
        return count

    def reduce_metrics(self, sums: dict[str, float], max_keys: tuple[str, ...] = ("mismatch_max",)) -> dict[str, float]:
        return sums

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def sync_and_clip_grads(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Make the gradients global (a no-op here), clip their total norm to max_norm; returns the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        return None  # the module's own state dict is already full

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        return model

    def close(self, clean: bool = True) -> None:
        pass


class DistContext(LocalContext):
    """W processes in one torch.distributed group (gloo)."""

    def __init__(self):
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo")
        self.dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.mesh = init_device_mesh("cpu", (self.world_size,))

    def local_indices(self, indices: list[int], group_size: int) -> list[int]:
        """This rank's contiguous block of whole groups of `indices` (a step's completions, group after group)."""
        groups = len(indices) // group_size
        if groups % self.world_size or len(indices) % group_size:
            raise ValueError(f"{groups} groups of {group_size} cannot be split evenly over {self.world_size} processes")
        per_rank = len(indices) // self.world_size
        return indices[self.rank * per_rank: (self.rank + 1) * per_rank]

    def global_count(self, count: torch.Tensor) -> torch.Tensor:
        """The step's global normaliser divided by W (FSDP averages gradients over the W ranks)."""
        total = torch.as_tensor(count, dtype=torch.float64).clone()
        self.dist.all_reduce(total)
        return (total / self.world_size).to(torch.as_tensor(count).dtype)

    def reduce_metrics(self, sums: dict[str, float], max_keys: tuple[str, ...] = ("mismatch_max",)) -> dict[str, float]:
        """Sum every accumulated metric over ranks, except: `loss` is averaged (each rank's loss is scaled by W) and
        `max_keys` (running maxima, not sums) take the maximum."""
        gathered: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(gathered, sorted(sums))  # a metric may exist on some ranks only
        keys = sorted(set().union(*gathered))
        sums = {k: sums.get(k, 0.0) for k in keys}
        maxed = [k for k in keys if k in max_keys]
        summed = [k for k in keys if k not in maxed]
        values = torch.tensor([float(sums[k]) for k in summed], dtype=torch.float64)
        self.dist.all_reduce(values)
        out = dict(zip(summed, values.tolist()))
        if maxed:
            peaks = torch.tensor([float(sums[k]) for k in maxed], dtype=torch.float64)
            self.dist.all_reduce(peaks, op=self.dist.ReduceOp.MAX)
            out.update(zip(maxed, peaks.tolist()))
        if "loss" in out:
            out["loss"] /= self.world_size
        return out

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj if self.is_main else None]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def sync_and_clip_grads(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Average the replicated parameters' gradients over ranks (FSDP already reduce-scattered the sharded ones),
        then clip the global norm exactly as `torch.nn.utils.clip_grad_norm_` does in one process."""
        sharded = [p.grad for p in params if hasattr(p.grad, "to_local")]
        replicated = [p.grad for p in params if not hasattr(p.grad, "to_local")]
        if replicated:
            flat = torch.cat([g.reshape(-1).double() for g in replicated])
            self.dist.all_reduce(flat)
            flat /= self.world_size
            for g, part in zip(replicated, flat.split([g.numel() for g in replicated])):
                g.copy_(part.view_as(g))
        sq = torch.zeros((), dtype=torch.float64)
        for g in sharded:
            sq += g.to_local().double().pow(2).sum()
        self.dist.all_reduce(sq)  # each shard is held by one rank: the sum is the sharded part of the norm²
        for g in replicated:
            sq += g.double().pow(2).sum()
        total = sq.sqrt().float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in sharded:
            g.to_local().mul_(coef)
        for g in replicated:
            g.mul_(coef)
        return float(total)

    def shard(self, model: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 (`fully_shard`) on each decoder layer; the rest (embeddings, the possibly tied LM head, the final
        norm) stays replicated, with gradients averaged in `sync_and_clip_grads`.

        Why not shard the root too: the trainer's log-prob kernel calls the decoder body and reads the head's
        weight directly (it never materialises the full logits), so a root FSDP unit would never be unsharded.
        The decoder layers hold nearly all the weights of a large model.
        """
        layers = getattr(getattr(model, getattr(model, "base_model_prefix", "model"), None), "layers", None)
        if not layers:
            raise TypeError(f"{type(model).__name__}: no decoder layers found to shard (expected model.<base>.layers)")
        for layer in layers:
            fully_shard(layer, mesh=self.mesh)
        return model

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """Every parameter (tied ones once) and persistent buffer, gathered to full CPU tensors on rank 0 (collective)."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in gather_named_tensors(_named_state(model)):
            if self.is_main:
                out[name] = tensor
        return out if self.is_main else None

    def close(self, clean: bool = True) -> None:
        """Tear the process group down; after a clean finish, only once every rank has arrived.

        Without the rendezvous a rank that finishes first destroys its gloo pairs
        while its peer may still be talking to it. After a failure (`clean=False`)
        the peers may be stuck in a collective the failed rank will never join,
        so it leaves at once (a plain barrier there hung Ray's failing-actor run);
        the rendezvous itself also gives up after `CLOSE_TIMEOUT`.
        """
        if not self.dist.is_initialized():
            return
        if clean:
            try:
                self.dist.monitored_barrier(timeout=CLOSE_TIMEOUT)
            except RuntimeError as err:  # a peer died or never came: tear down anyway, the error was reported there
                print(f"rank {self.rank}: closing without the other ranks ({str(err).splitlines()[0]})", file=sys.stderr)
        self.mesh = None  # the mesh holds the group: drop it so the group is really freed now, not at interpreter exit
        self.dist.destroy_process_group()


def _named_state(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    non_persistent = {f"{prefix}.{b}".lstrip(".") for prefix, module in model.named_modules() for b in module._non_persistent_buffers_set}
    for name, buf in model.named_buffers():
        if name not in non_persistent:
            yield name, buf


def gather_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, full tensor) for sharded (DTensor) or plain tensors; collective when sharded: every rank must iterate all."""
    for name, tensor in named:
        tensor = tensor.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        yield name, tensor


def context_from_env() -> LocalContext:
    """A DistContext when launched by torchrun with more than one process, else LocalContext."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return DistContext()
    return LocalContext()


def rank_run_dir(ctx: LocalContext, cfg, run_dir: Path) -> Path:
    """This rank's run directory: rank 0's everywhere (even if the clocks differ); ranks > 0 write their (duplicate)
    logs under run_dir/ranks/rank-N, quietly (their `cfg.run` loggers, progress bar and diagnostics turned off)."""
    run_dir = Path(ctx.broadcast_object(str(run_dir)))
    if ctx.is_main:
        return run_dir
    cfg.run.loggers = ["jsonl"]
    cfg.run.progress = False
    cfg.run.diagnostics = False  # rank 0 warns once for everyone
    return run_dir / "ranks" / f"rank-{ctx.rank}"

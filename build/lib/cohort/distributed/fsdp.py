"""Multi-process training: the policy sharded with FSDP2, rollout and rewards on rank 0.

`cohort train` under `torchrun --nproc_per_node N` (or with `train.num_processes=N`,
which re-launches itself under torchrun) runs N copies of the same driver loop.
`DistContext` is everything the loop needs to know about that; in a single
process it is `LocalContext`, whose every method is the identity, so the loop
has one code path. Both carry `device`, the training side's device
(`cohort.models.devices.resolve_device`: cuda:LOCAL_RANK on a GPU machine).

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
  receives them, one tensor at a time) and to save the final model.

Sharding (`DistContext.shard`): every decoder layer is one FSDP2 unit and the
root module (embeddings, the possibly tied LM head, the final norm) another, so
no weight is replicated. The log-prob kernel (cohort/models/logprobs.py) calls
the decoder body and reads the head's weight directly instead of calling the
model, so the root's forward hooks would never run; the sharded root therefore
carries `ROOT_FORWARD`, a method registered with FSDP2
(`register_fsdp_forward_method`) that runs the kernel between the root's
pre- and post-forward hooks: the root is gathered around the whole kernel and its
gradients are reduce-scattered like any unit's. Under `train.precision=mixed`
each unit gathers its parameters in model.dtype and reduces gradients in float32
(`MixedPrecisionPolicy`); `train.param_offload` keeps the parameter shards,
their gradients and the optimizer step in CPU memory (`CPUOffloadPolicy`).
The reference model is sharded the same way.

Choices and limits: the process group's backend follows the device (NCCL on
CUDA, gloo on the CPU); objects (batches, metric names) and the closing
rendezvous go over a gloo side group, so they never touch the GPU and NCCL,
which has no `monitored_barrier`, is never asked for one. Old/reference
log-probs, when needed, are computed for the full batch on every rank (FSDP
needs every rank in every forward; simple, redundant). A PPO critic and
checkpoint/resume of a sharded optimizer are not supported multi-process yet
(validation says so). Only the CPU (gloo) side has run here; the NCCL paths are
the same calls on CUDA tensors (GPU_NOTES_dist.md).
"""

from __future__ import annotations

import os
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.fsdp import register_fsdp_forward_method

from cohort.config import CohortConfig
from cohort.models.devices import process_group_backend, use_device
from cohort.models.logprobs import ROOT_FORWARD
from cohort.models.precision import Precision

CLOSE_TIMEOUT = timedelta(seconds=120)  # how long a rank that finished waits for the others before tearing down
CPU = torch.device("cpu")


class LocalContext:
    """One process: nothing to split or gather. `device` is where the training side lives."""

    rank, world_size, is_main = 0, 1, True

    def __init__(self, device: torch.device = CPU):
        self.device = device

    def local_indices(self, indices: list[int], group_size: int) -> list[int]:
        return indices

    def global_count(self, count: torch.Tensor) -> torch.Tensor:
        return count

    def max_count(self, count: int) -> int:
        """The largest `count` over the ranks (here, one)."""
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

    def shard(self, model: torch.nn.Module, precision: Precision | None = None, *, param_offload: bool = False) -> torch.nn.Module:
        return model

    def local_main_first(self, fn: Callable[[], Any]) -> Any:
        """fn()'s result; under several processes fn runs on each node's local rank 0 first (a model or dataset fetched
        by name is then downloaded once per node), on the other ranks after it (from the cache)."""
        return fn()

    def close(self, clean: bool = True) -> None:
        pass


class DistContext(LocalContext):
    """W processes in one torch.distributed group (NCCL on CUDA, gloo otherwise), plus a gloo side group."""

    def __init__(self, device: torch.device = CPU):
        super().__init__(device)
        use_device(device)  # before NCCL starts: each rank's communicator binds to its own GPU
        if not dist.is_initialized():
            dist.init_process_group(backend=process_group_backend(device))
        self.dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self.cpu_group = dist.new_group(backend="gloo")  # objects and the closing rendezvous, off the GPU
        self.mesh = init_device_mesh(device.type, (self.world_size,))

    def local_main_first(self, fn: Callable[[], Any]) -> Any:
        first = int(os.environ.get("LOCAL_RANK", "0")) == 0
        result, failure = None, None
        if first:
            try:
                result = fn()
            except Exception as exc:  # the others still pass the barrier, then fail the same way (a cache miss, a typo)
                failure = exc
        self.dist.barrier(group=self.cpu_group)
        if failure is not None:
            raise failure
        return result if first else fn()

    def local_indices(self, indices: list[int], group_size: int) -> list[int]:
        """This rank's contiguous block of whole groups of `indices` (a step's completions, group after group)."""
        groups = len(indices) // group_size
        if groups % self.world_size or len(indices) % group_size:
            raise ValueError(f"{groups} groups of {group_size} cannot be split evenly over {self.world_size} processes")
        per_rank = len(indices) // self.world_size
        return indices[self.rank * per_rank: (self.rank + 1) * per_rank]

    def global_count(self, count: torch.Tensor) -> torch.Tensor:
        """The step's global normaliser divided by W (FSDP averages gradients over the W ranks), on this rank's device."""
        total = torch.as_tensor(count, dtype=torch.float64).to(self.device, copy=True)
        self.dist.all_reduce(total)
        return (total / self.world_size).to(torch.as_tensor(count).dtype)

    def max_count(self, count: int) -> int:
        """The largest `count` over the ranks, through the gloo side group (a host integer: no device sync)."""
        value = torch.tensor([count], dtype=torch.int64)
        self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX, group=self.cpu_group)
        return int(value.item())

    def reduce_metrics(self, sums: dict[str, float], max_keys: tuple[str, ...] = ("mismatch_max",)) -> dict[str, float]:
        """Sum every accumulated metric over ranks, except: `loss` is averaged (each rank's loss is scaled by W) and
        `max_keys` (running maxima, not sums) take the maximum."""
        gathered: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(gathered, sorted(sums), group=self.cpu_group)  # a metric may exist on some ranks only
        keys = sorted(set().union(*gathered))
        maxed = [k for k in keys if k in max_keys]
        summed = [k for k in keys if k not in maxed]
        out = dict(zip(summed, self._all_reduce_values([sums.get(k, 0.0) for k in summed], self.dist.ReduceOp.SUM)))
        if maxed:
            out.update(zip(maxed, self._all_reduce_values([sums.get(k, 0.0) for k in maxed], self.dist.ReduceOp.MAX)))
        if "loss" in out:
            out["loss"] /= self.world_size
        return out

    def _all_reduce_values(self, values: list, op) -> list[float]:
        """Floats or 0-d tensors -> one float64 vector on the device (NCCL takes no CPU tensor), reduced, read once."""
        if not values:
            return []
        vector = torch.stack([torch.as_tensor(v, dtype=torch.float64).to(self.device) for v in values])  # (K,)
        self.dist.all_reduce(vector, op=op)
        return vector.tolist()

    def broadcast_object(self, obj: Any) -> Any:
        box = [obj if self.is_main else None]
        self.dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def sync_and_clip_grads(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Clip the global norm of the sharded gradients (FSDP already reduce-scattered them) exactly as
        `torch.nn.utils.clip_grad_norm_` does in one process; returns the norm before clipping."""
        unsharded = [p for p in params if not hasattr(p.grad, "to_local")]
        if unsharded:
            raise RuntimeError(f"{len(unsharded)} gradient(s) are not FSDP shards; shard() covers every parameter of the model")
        local = [p.grad.to_local() for p in params]
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        for g in local:  # (shards offloaded to the CPU are summed there, then the scalar moves)
            sq += g.double().pow(2).sum().to(self.device)
        self.dist.all_reduce(sq)  # each shard is held by one rank: the sum is the norm² of the whole gradient
        total = sq.sqrt().float()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in local:
            g.mul_(coef.to(g.device))
        return float(total)

    def shard(self, model: torch.nn.Module, precision: Precision | None = None, *, param_offload: bool = False) -> torch.nn.Module:
        """FSDP2 (`fully_shard`) on each decoder layer, then on the root (embeddings, head, final norm), which also
        gets `ROOT_FORWARD` for the log-prob kernel (module docstring). Mixed precision and offload per `fsdp_policies`."""
        layers = getattr(getattr(model, getattr(model, "base_model_prefix", "model"), None), "layers", None)
        if not layers:
            raise TypeError(f"{type(model).__name__}: no decoder layers found to shard (expected model.<base>.layers)")
        mp_policy, offload_policy = fsdp_policies(precision, param_offload, self.device)
        for layer in layers:
            fully_shard(layer, mesh=self.mesh, mp_policy=mp_policy, offload_policy=offload_policy)
        fully_shard(model, mesh=self.mesh, mp_policy=mp_policy, offload_policy=offload_policy)
        _run_kernels_in_root_forward(model)
        return model

    def full_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
        """Every parameter (tied ones once) and persistent buffer, gathered to full CPU tensors on rank 0 (collective)."""
        out: dict[str, torch.Tensor] = {}
        for name, tensor in gather_named_tensors(_named_state(model), self.device):
            if self.is_main:
                out[name] = tensor.cpu()
        return out if self.is_main else None

    def close(self, clean: bool = True) -> None:
        """Tear the process group down; after a clean finish, only once every rank has arrived.

        Without the rendezvous a rank that finishes first destroys its pairs
        while its peer may still be talking to it. After a failure (`clean=False`)
        the peers may be stuck in a collective the failed rank will never join,
        so it leaves at once (a plain barrier there hung Ray's failing-actor run);
        the rendezvous itself (gloo's monitored barrier, on the gloo side group:
        NCCL has none) also gives up after `CLOSE_TIMEOUT`.
        """
        if not self.dist.is_initialized():
            return
        if clean:
            try:
                self.dist.monitored_barrier(group=self.cpu_group, timeout=CLOSE_TIMEOUT)
            except RuntimeError as err:  # a peer died or never came: tear down anyway, the error was reported there
                print(f"rank {self.rank}: closing without the other ranks ({str(err).splitlines()[0]})", file=sys.stderr)
        self.mesh = self.cpu_group = None  # they hold the groups: drop them so they are freed now, not at interpreter exit
        self.dist.destroy_process_group()


def fsdp_policies(precision: Precision | None, param_offload: bool, device: torch.device
                  ) -> tuple[MixedPrecisionPolicy, OffloadPolicy]:
    """(mixed precision, offload) for every FSDP unit.

    precision mixed (float32 masters, bf16 compute): parameters gathered in the compute dtype, gradients reduced in
    float32 (verl's FSDP `mixed_precision`); else FSDP casts nothing. param_offload: the shards, their gradients and
    the optimizer step live in CPU memory (pinned on CUDA, for asynchronous copies); else they stay on the device.
    """
    mixed = precision is not None and precision.mixed
    mp_policy = (MixedPrecisionPolicy(param_dtype=precision.compute_dtype, reduce_dtype=torch.float32) if mixed
                 else MixedPrecisionPolicy())
    offload_policy = CPUOffloadPolicy(pin_memory=device.type == "cuda") if param_offload else OffloadPolicy()
    return mp_policy, offload_policy


def _run_kernels_in_root_forward(model: torch.nn.Module) -> None:
    """Give the sharded root `ROOT_FORWARD(fn, *args, **kwargs)`: `fn` runs inside the root's FSDP forward hooks.

    Pre-forward gathers the root's parameters (and, for the first call, marks this module as FSDP's root); the
    post-forward registers the backward hooks on `fn`'s outputs, so the root's gradients are reduce-scattered in the
    backward. FSDP keeps a root unsharded after its forward (for the backward that follows); a call without grad has
    no backward, so the root is resharded at once (a reference model would otherwise stay gathered)."""
    model._cohort_in_root = types.MethodType(lambda self, fn, *args, **kwargs: fn(*args, **kwargs), model)
    register_fsdp_forward_method(model, "_cohort_in_root")

    def run(fn, *args, **kwargs):
        out = model._cohort_in_root(fn, *args, **kwargs)
        if not torch.is_grad_enabled():
            model.reshard()
        return out

    setattr(model, ROOT_FORWARD, run)


def _named_state(model: torch.nn.Module) -> Iterable[tuple[str, torch.Tensor]]:
    yield from model.named_parameters()
    non_persistent = {f"{prefix}.{b}".lstrip(".") for prefix, module in model.named_modules() for b in module._non_persistent_buffers_set}
    for name, buf in model.named_buffers():
        if name not in non_persistent:
            yield name, buf


def offload_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """train.optimizer_offload: the optimizer's state lives in CPU memory between steps; a pre-step hook moves it
    to each parameter's device, a post-step hook back (verl's offload_fsdp_optimizer / load_fsdp_optimizer around
    the update). Works in one process and under FSDP (a DTensor's local shard moves); on the CPU it moves nothing."""
    optimizer.register_step_pre_hook(lambda opt, args, kwargs: move_optimizer_state(opt, None))
    optimizer.register_step_post_hook(lambda opt, args, kwargs: move_optimizer_state(opt, CPU))


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: torch.device | None) -> None:
    """Every state tensor of `optimizer` to `device` (None: its parameter's device). 0-d tensors (AdamW's `step`)
    stay where the optimizer keeps them (on the CPU unless `capturable`)."""
    for param, state in optimizer.state.items():
        target = device or _local(param).device
        for key, value in state.items():
            if torch.is_tensor(value) and value.dim() > 0:
                state[key] = moved(value, target)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def moved(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; a DTensor keeps its mesh and placements, only its local shard moves (no collective)."""
    local = _local(tensor)
    if local.device == device:
        return tensor
    if local is tensor:
        return tensor.to(device)
    return type(tensor).from_local(local.to(device), tensor.device_mesh, tensor.placements, shape=tensor.shape,
                                   stride=tensor.stride())


def gather_named_tensors(named: Iterable[tuple[str, torch.Tensor]], device: torch.device = CPU
                         ) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, full tensor) for sharded (DTensor) or plain tensors, one at a time; collective when sharded: every rank
    must iterate all, in the same order. A shard offloaded to the CPU is moved to `device` for the all-gather (NCCL
    gathers device tensors only); the full tensor is on `device` then."""
    for name, tensor in named:
        tensor = tensor.detach()
        if hasattr(tensor, "full_tensor"):
            tensor = moved(tensor, device).full_tensor()
        yield name, tensor


def context_from_env(device: torch.device = CPU) -> LocalContext:
    """A DistContext when launched by torchrun with more than one process, else LocalContext; both on `device`."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return DistContext(device)
    return LocalContext(device)


def rank_run_dir(ctx: LocalContext, cfg: CohortConfig, run_dir: Path) -> Path:
    """This rank's run directory: rank 0's everywhere (even if the clocks differ); ranks > 0 write their (duplicate)
    logs under run_dir/ranks/rank-N, quietly (their `cfg.run` loggers, progress bar and diagnostics turned off)."""
    run_dir = Path(ctx.broadcast_object(str(run_dir)))
    if ctx.is_main:
        return run_dir
    cfg.run.loggers = ["jsonl"]
    cfg.run.progress = False
    cfg.run.diagnostics = False  # rank 0 warns once for everyone
    return run_dir / "ranks" / f"rank-{ctx.rank}"

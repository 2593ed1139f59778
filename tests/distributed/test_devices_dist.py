"""The multi-process decisions about devices, checked on the CPU with hand-derived expectations.

What runs on a GPU is the same calls with CUDA tensors: these tests pin which
backend, device, mesh, FSDP policies and environment each process gets, the
order the calls come in (the device is made current before NCCL starts), that
collectives get tensors on the context's device, that objects and the closing
rendezvous use the gloo side group, and the streamed push (one full tensor held
at a time). Fakes stand in for torch.distributed; no process group is made here.
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.distributed import fsdp
from cohort.distributed.fsdp import (DistContext, LocalContext, context_from_env, fsdp_policies, move_optimizer_state,
                                     offload_optimizer_state)
from cohort.distributed.rank0 import MainOnlyEngine, _PushEnd, follow_walks
from cohort.models.devices import DeviceError, process_group_backend, resolve_device
from cohort.models.precision import resolve_precision
from cohort.plan.validate import validate_config


def test_each_local_rank_gets_its_own_gpu_and_its_backend():
    assert resolve_device("auto", rank=0, cuda_count=2) == torch.device("cuda", 0)
    assert resolve_device("auto", rank=1, cuda_count=2) == torch.device("cuda", 1)
    with pytest.raises(DeviceError, match="local rank 1 has no GPU of its own: this process sees 1 GPU"):
        resolve_device("auto", rank=1, cuda_count=1)  # two ranks would share cuda:0
    assert resolve_device("auto", rank=1, cuda_count=0) == torch.device("cpu")
    assert [process_group_backend(torch.device(d)) for d in ("cuda:1", "cpu")] == ["nccl", "gloo"]


class FakeDist:
    """Records torch.distributed calls; every collective is a no-op over 2 ranks, this one rank 0."""

    class ReduceOp:
        SUM, MAX = "sum", "max"

    def __init__(self):
        self.calls, self.reduced_on = [], []

    def is_initialized(self):
        return any(c[0] == "init_process_group" for c in self.calls)

    def init_process_group(self, backend):
        self.calls.append(("init_process_group", backend))

    def get_rank(self):
        return 0

    def get_world_size(self):
        return 2

    def new_group(self, backend):
        self.calls.append(("new_group", backend))
        return f"{backend}-side-group"

    def all_reduce(self, tensor, op="sum"):
        self.reduced_on.append(tensor.device)

    def all_gather_object(self, out, obj, group=None):
        self.calls.append(("all_gather_object", group))
        out[:] = [obj] * len(out)

    def broadcast_object_list(self, box, src, group=None):
        self.calls.append(("broadcast_object_list", group))

    def monitored_barrier(self, group=None, timeout=None):
        self.calls.append(("monitored_barrier", group))

    def destroy_process_group(self):
        self.calls.append(("destroy_process_group",))


def _fake_context(monkeypatch, device: str) -> tuple[DistContext, FakeDist]:
    fake = FakeDist()
    monkeypatch.setattr(fsdp, "dist", fake)
    monkeypatch.setattr(fsdp, "use_device", lambda d: fake.calls.append(("use_device", str(d))))
    monkeypatch.setattr(fsdp, "init_device_mesh", lambda kind, shape: fake.calls.append(("init_device_mesh", kind, shape)))
    return DistContext(torch.device(device)), fake


def test_a_cuda_rank_sets_its_device_before_nccl_and_keeps_a_gloo_side_group(monkeypatch):
    ctx, fake = _fake_context(monkeypatch, "cuda:1")
    assert fake.calls == [("use_device", "cuda:1"), ("init_process_group", "nccl"), ("new_group", "gloo"),
                          ("init_device_mesh", "cuda", (2,))]
    assert ctx.device == torch.device("cuda", 1) and ctx.cpu_group == "gloo-side-group"
    ctx.broadcast_object({"batch": 1})
    ctx.close()
    # objects and the gloo-only monitored barrier go over the side group (NCCL has no monitored_barrier)
    assert fake.calls[-3:] == [("broadcast_object_list", "gloo-side-group"), ("monitored_barrier", "gloo-side-group"),
                               ("destroy_process_group",)]


def test_a_cpu_rank_uses_gloo_and_a_cpu_mesh(monkeypatch):
    _, fake = _fake_context(monkeypatch, "cpu")
    assert fake.calls == [("use_device", "cpu"), ("init_process_group", "gloo"), ("new_group", "gloo"),
                          ("init_device_mesh", "cpu", (2,))]


def test_collectives_get_tensors_on_the_context_device(monkeypatch):
    ctx, fake = _fake_context(monkeypatch, "cpu")
    ctx.device = torch.device("meta")  # stands for cuda: a device other than the CPU's default, without a GPU
    count = ctx.global_count(torch.tensor(6.0))
    assert count.device.type == "meta" and fake.reduced_on == [torch.device("meta")]
    fake.reduced_on.clear()
    with pytest.raises(NotImplementedError):  # (a meta tensor cannot be read back: the reduce itself is what is checked)
        ctx.reduce_metrics({"loss": 1.0, "tokens": torch.tensor(3.0)})
    assert fake.reduced_on == [torch.device("meta")]


def test_local_context_carries_the_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = context_from_env(torch.device("meta"))
    assert type(ctx) is LocalContext and ctx.device == torch.device("meta")
    assert LocalContext().device == torch.device("cpu")


def test_fsdp_policies_follow_the_precision_and_offload_settings():
    mixed = resolve_precision("bfloat16", "mixed")  # float32 masters, bf16 compute
    mp, off = fsdp_policies(mixed, False, torch.device("cuda", 0))
    assert (mp.param_dtype, mp.reduce_dtype) == (torch.bfloat16, torch.float32) and type(off) is OffloadPolicy
    for plain in (resolve_precision("float32", "mixed"), resolve_precision("bfloat16", "pure"), None):
        mp, _ = fsdp_policies(plain, False, torch.device("cpu"))  # nothing to cast: weights already in compute dtype
        assert mp == MixedPrecisionPolicy() and mp.param_dtype is None and mp.reduce_dtype is None
    _, off = fsdp_policies(mixed, True, torch.device("cuda", 0))
    assert isinstance(off, CPUOffloadPolicy) and off.pin_memory  # pinned: asynchronous host-device copies
    _, off = fsdp_policies(mixed, True, torch.device("cpu"))
    assert isinstance(off, CPUOffloadPolicy) and not off.pin_memory  # pinning needs CUDA


def test_param_offload_needs_several_processes(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match="train.param_offload = true offloads FSDP shards"):
        validate_config(load_config(None, ["train.param_offload=true"]), check_files=False)
    validate_config(load_config(None, ["train.param_offload=true", "train.num_processes=2"]), check_files=False)
    validate_config(load_config(None, ["train.optimizer_offload=true"]), check_files=False)  # one process: fine


@pytest.mark.parametrize("share", ["0.5", "2"])
def test_a_trainer_actor_takes_zero_or_one_whole_gpu(share):
    with pytest.raises(ConfigError, match=f"distributed.gpus_per_trainer = {share}: a trainer actor trains on one whole GPU"):
        validate_config(load_config(None, ["distributed.backend=ray", f"distributed.gpus_per_trainer={share}"]),
                        check_files=False)


def _adamw_step(offload: bool) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 3)  # weight (3, 2) and bias (3,)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    if offload:
        offload_optimizer_state(opt)
    for _ in range(2):
        layer(torch.ones(1, 2)).sum().backward()
        opt.step()
    return layer, opt


def test_optimizer_state_moves_but_the_maths_does_not_change():
    moved_layer, opt = _adamw_step(True)
    plain_layer, _ = _adamw_step(False)
    assert torch.equal(moved_layer.weight, plain_layer.weight) and torch.equal(moved_layer.bias, plain_layer.bias)
    move_optimizer_state(opt, torch.device("meta"))
    # 2 parameters × (exp_avg, exp_avg_sq) = 4 tensors moved; the 2 `step` counters (0-d) stay on the CPU
    kinds = sorted((key, value.device.type) for state in opt.state.values() for key, value in state.items())
    assert kinds == [("exp_avg", "meta")] * 2 + [("exp_avg_sq", "meta")] * 2 + [("step", "cpu")] * 2


class FakeShard:
    """A sharded parameter: `full_tensor()` makes a new full tensor, as an FSDP all-gather does."""

    def __init__(self, value: float, log: list):
        self.value, self.log = value, log

    def detach(self):
        return self

    def to_local(self):
        return torch.zeros(1)

    def numel(self):  # a DTensor's metadata is the full tensor's (no all-gather)
        return 4

    def element_size(self):
        return 4

    def full_tensor(self):
        self.log.append(self.value)
        return torch.full((4,), self.value)


class HoldCounter:
    """An engine that walks the weights twice (like the remote engine) and counts the full tensors alive at each."""

    def __init__(self):
        self.alive, self.values = [], []

    def update_weights(self, stream, version):
        for _ in range(2):
            refs = []
            for name, tensor in stream:
                refs.append(weakref.ref(tensor))
                self.alive.append(sum(ref() is not None for ref in refs))
                self.values.append(float(tensor[0]))
                del tensor
        return "sent"


class Script:
    """A one-process context whose broadcasts record what rank 0 says (and, for a follower, replay a script)."""

    def __init__(self, is_main: bool, replies=()):
        self.is_main, self.device, self.said, self.replies = is_main, torch.device("cpu"), [], list(replies)

    def broadcast_object(self, obj):
        if self.is_main:
            self.said.append(obj)
            return obj
        return self.replies.pop(0)


def test_rank0_hands_its_engine_one_full_tensor_at_a_time():
    log: list = []
    named = [(f"w{k}", FakeShard(float(k), log)) for k in range(3)]
    ctx = Script(is_main=True)
    engine = MainOnlyEngine(HoldCounter(), ctx)
    assert engine.update_weights(named, version=5) == "sent" and engine.policy_version == 5
    # 3 tensors, 2 walks: 6 all-gathers, each full tensor gone before the next arrives (a list of them would hold 1, 2, 3)
    assert engine.engine.alive == [1] * 6 and engine.engine.values == [0.0, 1.0, 2.0] * 2 and log == [0.0, 1.0, 2.0] * 2
    assert ctx.said == ["walk", "walk", _PushEnd(sent="sent")]  # every walk announced, then the engine's answer


def test_the_remote_engine_plans_its_parts_from_the_shards_metadata_and_gathers_each_tensor_once():
    # The remote engine plans parts from the sizes before it sends (stream_weight_parts). Before, that plan was a walk
    # of its own: 3 tensors, 2 walks, 6 all-gathers. Now the sizes come from the shards' metadata (GatheredWalks.layout:
    # 3 × 4 floats × 4 bytes = 16 bytes each); with 32-byte parts: [w0, w1], [w2]; 3 all-gathers, one walk announced.
    from cohort.rollout.server.client import stream_weight_parts

    class PartSender:
        def update_weights(self, stream, version):
            count, parts = stream_weight_parts(stream, 32)
            return count, [[(name, float(t[0])) for name, t in part] for part in parts]

    log: list = []
    named = [(f"w{k}", FakeShard(float(k), log)) for k in range(3)]
    ctx = Script(is_main=True)
    sent = MainOnlyEngine(PartSender(), ctx).update_weights(named, version=2)
    assert sent == (2, [[("w0", 0.0), ("w1", 1.0)], [("w2", 2.0)]])
    assert log == [0.0, 1.0, 2.0] and ctx.said == ["walk", _PushEnd(sent=sent)]
    assert follow_walks(named, Script(False, ["walk", _PushEnd(sent=sent)])) == sent  # the other ranks: one walk too
    assert log == [0.0, 1.0, 2.0] * 2


def test_the_other_ranks_follow_each_walk_and_share_rank0s_failure():
    log: list = []
    named = [(f"w{k}", FakeShard(float(k), log)) for k in range(3)]
    assert follow_walks(named, Script(False, ["walk", "walk", _PushEnd(sent=7)])) == 7
    assert log == [0.0, 1.0, 2.0] * 2  # joined both walks' all-gathers, in order
    with pytest.raises(RuntimeError, match="rank 0's rollout engine failed to take the weights: OSError: gone"):
        follow_walks(named, Script(False, ["walk", _PushEnd(failed="OSError: gone")]))


def test_a_walk_left_half_way_is_finished_before_rank0_says_it_failed():
    log: list = []
    named = [(f"w{k}", FakeShard(float(k), log)) for k in range(3)]

    class Quitter:
        def update_weights(self, stream, version):
            next(iter(stream))  # reads w0, then fails: w1 and w2's all-gathers are still owed to the other ranks
            raise OSError("gone")

    ctx = Script(is_main=True)
    with pytest.raises(OSError, match="gone"):
        MainOnlyEngine(Quitter(), ctx).update_weights(named, version=1)
    assert log == [0.0, 1.0, 2.0] and ctx.said == ["walk", _PushEnd(failed="OSError: gone")]

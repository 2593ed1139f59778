"""The one device the training side of a process lives on, decided once.

`resolve_device(setting, local_rank, cuda_count)` turns `train.device` into a
`torch.device`: `auto` is `cuda:LOCAL_RANK` when this process sees a GPU, else the
CPU; `cpu`, `cuda` (= `cuda:LOCAL_RANK`) and `cuda:N` are taken as written. The
policy, the reference, the critic, LoRA adapters, the transformers engine and
every tensor a training step creates follow that device (`device=x.device`,
`x.new_zeros`); nothing else in cohort calls `torch.cuda.is_available()` to decide
where a tensor goes.

`process_group_backend(device)` is NCCL for CUDA and gloo otherwise;
`use_device(device)` makes a CUDA device current for the calling thread (every
thread that drives an engine or a model calls it: CUDA's current device is
per thread). Both are plain decisions, unit-tested without a GPU
(tests/models/test_devices.py).

Left out: several devices per process (one process per GPU, as torchrun and
Ray place them), and device kinds other than CPU and CUDA (another device given
explicitly is taken as written: tests/test_devices.py runs a step on PyTorch's
`lazy` device, which refuses CPU tensors as CUDA does).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


class DeviceError(ValueError):
    pass


def local_rank() -> int:
    """This process's rank on its machine (torchrun and cohort's Ray actors set LOCAL_RANK; 0 alone)."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def resolve_device(setting: str = "auto", rank: int | None = None, cuda_count: int | None = None) -> torch.device:
    """`train.device` -> the device of this process's training side.

    setting: `auto`, `cpu`, `cuda`, `cuda:N` (or another torch device string, taken as written).
    rank: the local rank (default: LOCAL_RANK); cuda_count: GPUs this process sees (default: torch's count).
    `auto` with GPUs: cuda:rank, which must exist (two processes never share one GPU by accident).
    """
    rank = local_rank() if rank is None else rank
    cuda_count = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if cuda_count is None else cuda_count
    if setting == "auto":
        if cuda_count == 0:
            return torch.device("cpu")
        setting = "cuda"
    if setting == "cuda":
        if cuda_count == 0:
            raise DeviceError("train.device = cuda, but this process sees no GPU (torch.cuda.is_available() is False: "
                              "a CPU build of torch, or CUDA_VISIBLE_DEVICES is empty); use train.device=auto or cpu, or "
                              "install the CUDA builds (make install-gpu)")
        if rank >= cuda_count:
            raise DeviceError(f"local rank {rank} has no GPU of its own: this process sees {cuda_count} GPU(s); run at most "
                              f"{cuda_count} training processes per machine (train.num_processes) or set train.device explicitly")
        return torch.device("cuda", rank)
    try:
        device = torch.device(setting)
    except RuntimeError as exc:
        raise DeviceError(f"train.device = {setting!r}: not a device ({exc}); use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and (device.index or 0) >= cuda_count:
        raise DeviceError(f"train.device = {setting!r}: this process sees {cuda_count} GPU(s)")
    return device


def process_group_backend(device: torch.device) -> str:
    """torch.distributed's backend for tensors on `device`: NCCL for CUDA, gloo for everything else."""
    return "nccl" if device.type == "cuda" else "gloo"


def use_device(device: torch.device | None) -> None:
    """Make `device` the calling thread's current CUDA device (a no-op for any other device)."""
    if device is not None and device.type == "cuda":
        torch.cuda.set_device(device)


def autocast_device_type(device: torch.device) -> str:
    """The `device_type` torch.autocast takes for tensors on `device` (cpu for meta and other devices it lacks)."""
    return device.type if device.type in ("cuda", "cpu", "xpu", "mps", "hpu") else "cpu"


# --------------------------------------------------------------------------- model.dtype = auto

# Below this many parameters a CPU step is overhead, not matrix maths, and bfloat16 does not pay on CPU (measured:
# docs/gpu.md, "Precision"); at and above it a CPU with bf16 units trains in bf16 mixed precision.
CPU_BF16_MIN_PARAMETERS = 3_000_000


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's `model name`, else platform.processor()), for build and benchmark records."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def has_bf16_units(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 matrix products in hardware: a CUDA GPU of compute capability 8.0 or later
    (Ampere on), or a CPU with AVX512-BF16 or AMX-BF16 (read from /proc/cpuinfo's flags)."""
    if device.type == "cuda":
        return torch.cuda.get_device_capability(device)[0] >= 8
    if device.type != "cpu":
        return False
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = {flag for line in cpuinfo if line.startswith("flags") for flag in line.split(":", 1)[1].split()}
    except OSError:
        return False
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def auto_dtype(device_type: str, bf16_units: bool, num_parameters: int | None) -> tuple[str, str]:
    """`model.dtype = auto` -> (dtype, why), as TRL's bf16=True default would choose on a GPU: bfloat16 (with float32
    masters under train.precision=mixed) where the hardware has bf16 units and it pays, float32 elsewhere.

    - CUDA with bf16 units (Ampere on): bfloat16, whatever the size.
    - CPU with bf16 units: bfloat16 from CPU_BF16_MIN_PARAMETERS on (measured here: a 5.9M model's step 1.36x faster,
      a 31.5M one's 1.43x), float32 below (the 1M model's step is overhead: the same time in bf16) and when the size
      is unknown.
    - anything else (an older GPU, a CPU without bf16 units): float32.
    """
    if not bf16_units:
        return "float32", f"no bfloat16 units on {device_type}"
    if device_type == "cuda":
        return "bfloat16", "a GPU with bfloat16 units"
    if device_type == "cpu" and num_parameters is not None and num_parameters >= CPU_BF16_MIN_PARAMETERS:
        return "bfloat16", f"{num_parameters / 1e6:.1f}M parameters on a CPU with bfloat16 units"
    size = f"{num_parameters / 1e6:.1f}M parameters" if num_parameters is not None else "a model of unknown size"
    return "float32", f"{size} on {device_type}: bfloat16 pays from {CPU_BF16_MIN_PARAMETERS / 1e6:.0f}M there"

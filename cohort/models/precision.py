"""Training precision: which dtype the weights are kept in, and which dtype the maths runs in.

`model.dtype` names the precision the model computes in (and generates in,
unless `engine.dtype` says otherwise); `train.precision` names what the
optimizer updates:

- `mixed` (the default): float32 master weights, float32 gradients and AdamW
  moments, with the forward and backward run in `model.dtype` under
  `torch.autocast` — what TRL's `bf16=True` (through accelerate) and verl's FSDP
  mixed precision do. An update of 1e-6 × a weight of 1 survives (float32 keeps
  24 bits of mantissa; bfloat16 keeps 8, so it rounds such an update away).
- `pure`: the weights and the optimizer state are held in `model.dtype` itself.
  Half the memory of the weights and optimizer, but lossy: at lr 1e-6 most of
  an update rounds away (measured here on the tiny model: 1.2% of the bfloat16
  weights changed after one AdamW step; docs/runs.md).

With `model.dtype = float32` both are the same plain float32 training.

float16 mixed precision would need loss scaling (a GradScaler) to keep small
gradients from underflowing; that is not built, so validation refuses
`model.dtype=float16` with `train.precision=mixed` and says what to use instead.
A LoRA run (cohort/models/lora.py) holds its frozen base in `model.dtype`
(only the adapter has float32 masters); `float32_weights` runs such a model in
float32 for the weight-sync check's sensitivity pass without a float32 copy of it.

The LM head is the exception: under `mixed` the completion log-prob kernel (cohort/models/logprobs.py) runs the head's
matmul in float32 (a bf16 LoRA base's head upcast one chunk at a time), with autocast off, in its forward and its
backward alike.

Out of scope: float8.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from cohort.models.devices import autocast_device_type

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Precision:
    """Where the trained weights live and what the forward/backward computes in."""

    weights_dtype: torch.dtype  # the dtype of the parameters the optimizer updates (and of the checkpoints' weights)
    compute_dtype: torch.dtype  # the dtype of the forward/backward (and of final/ and of the engine's copy)
    device_type: str = "cpu"  # torch.autocast's device_type: the kind of device the trained models live on

    @property
    def mixed(self) -> bool:
        """True when the maths runs in a lower precision than the weights are kept in (autocast)."""
        return self.compute_dtype != self.weights_dtype

    def autocast(self) -> contextlib.AbstractContextManager:
        """The context every forward pass of the trained models runs in: autocast on their device when mixed, else
        nothing (a CUDA model autocast as `cpu` would silently compute in float32)."""
        if not self.mixed:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype)


def resolve_precision(model_dtype: str, precision: str, device: torch.device | None = None) -> Precision:
    """`model.dtype` + `train.precision` (+ the models' device, for autocast) -> Precision. float32 is float32 either
    way."""
    if model_dtype not in DTYPES:  # `auto` is chosen by validation (cohort.plan.validate.choose_model_dtype) first
        raise ValueError(f"model.dtype = {model_dtype!r} is not settled; read it from the config "
                         "cohort.plan.validate.validate_config returns (RunPlan.config)")
    compute = DTYPES[model_dtype]
    device_type = autocast_device_type(device) if device is not None else "cpu"
    if precision == "mixed":
        return Precision(weights_dtype=torch.float32, compute_dtype=compute, device_type=device_type)
    if precision == "pure":
        return Precision(weights_dtype=compute, compute_dtype=compute, device_type=device_type)
    raise ValueError(f"train.precision = {precision!r}: choose mixed or pure")


@contextlib.contextmanager
def float32_weights(model: torch.nn.Module) -> Iterator[None]:
    """Forward passes of `model` in float32 although some of its weights are held in a lower precision (a LoRA run's
    frozen bfloat16 base): each module's own low-precision parameters and buffers are upcast while that module runs
    and put back when it returns. The upcast is exact (every bfloat16/float16 value is a float32 value), so the result
    is the float32 model's; at most one module's float32 copy exists at a time. No-op when every weight is float32.
    Scoring only: the upcast copies do not require grad."""
    def low(tensors: dict) -> list[str]:
        return [n for n, t in tensors.items() if t is not None and t.is_floating_point() and t.dtype != torch.float32]

    saved: dict[torch.nn.Module, tuple[dict, dict]] = {}

    def upcast(module: torch.nn.Module, _args) -> None:
        saved[module] = (dict(module._parameters), dict(module._buffers))
        for name in low(module._parameters):
            module._parameters[name] = torch.nn.Parameter(module._parameters[name].detach().float(), requires_grad=False)
        for name in low(module._buffers):
            module._buffers[name] = module._buffers[name].float()

    def restore(module: torch.nn.Module, *_ignored) -> None:
        if module in saved:
            parameters, buffers = saved.pop(module)
            module._parameters.update(parameters)
            module._buffers.update(buffers)

    handles = []
    for module in model.modules():
        if low(module._parameters) or low(module._buffers):
            handles += [module.register_forward_pre_hook(upcast), module.register_forward_hook(restore)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for module in list(saved):  # a forward that raised half-way
            restore(module)

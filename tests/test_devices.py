"""The training side on a device other than the CPU's: one Trainer.step() and one weight sync, nothing made off-device.

CI has no GPU, so the step runs on a simulated one, combining two checks:

- **PyTorch's lazy-tensor device** (`torch._lazy`, its TorchScript backend): real values computed on this CPU,
  but a device of its own (`lazy:0`) that refuses, as CUDA does, any op mixing its tensors with CPU tensors
  (0-dim CPU scalars excepted, as on CUDA), including CPU token ids handed to the embedding (the `meta` device
  lets those through, and cannot sample). A CPU tensor that meets the model anywhere fails the step.
- **A recorder of device-less tensors** (a `TorchFunctionMode`): every tensor factory (`torch.tensor`, `zeros`,
  `full`, `arange`, ...) called from cohort's own code without a `device` and whose result is not on the model's
  device is recorded, with its file and line. A host-side tensor cohort means to have says `device="cpu"`; one
  that merely forgot its device is caught here even where it never meets a device tensor in this step's path.

`test_recorder_catches_a_device_less_tensor` shows the recorder fails on one such tensor made by cohort's code.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import cohort
from cohort.config.resolve import load_config
from cohort.distributed.rank0 import DetachedHFEngine
from cohort.models.batching import pad_rows
from cohort.models.pretrained import load_policy, load_tokenizer, resolve_model_dir, stop_token_ids
from cohort.trainer.trainer import Trainer
from tests.trainer.test_fast_path import data_file  # noqa: F401  (a fixture: prompts and a reward with spread)

COHORT_DIR = str(Path(cohort.__file__).resolve().parent)
TORCH_DIR = str(Path(torch.__file__).resolve().parent)
FACTORIES = {torch.tensor, torch.as_tensor, torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.rand,
             torch.randn, torch.randint, torch.linspace, torch.eye, torch.randperm, torch.scalar_tensor}


class DeviceLessTensors(TorchFunctionMode):
    """Records factory calls from cohort's code that give no device and produce a tensor off `device`."""

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in FACTORIES and kwargs.get("device") is None and isinstance(out, torch.Tensor) and out.device != self.device:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR):
                frame = frame.f_back
            if frame is not None and frame.f_code.co_filename.startswith(COHORT_DIR):
                where = f"{frame.f_code.co_filename[len(COHORT_DIR) - len('cohort'):]}:{frame.f_lineno}"
                self.found.append(f"{where} {func.__name__} -> {out.device}")
        return out


@pytest.fixture(scope="module")
def lazy_device() -> torch.device:
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()
    return torch.device("lazy")


@pytest.mark.slow
def test_step_and_sync_make_nothing_off_the_model_device(tmp_path, data_file, tiny_model_dir, lazy_device):  # noqa: F811 (the fixture)
    # beta != 0 (a reference model), two optimizer steps per generation batch
    # with num_iterations 1: old log-probs are scored, and the batch's tensors are reused across steps
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{data_file}]", "data.max_prompt_length=16",
        "engine.name=hf", "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=2",
        "train.steps_per_generation=2", "train.micro_batch_size=4", "train.max_steps=2", "train.learning_rate=1e-3",
        "train.device=lazy", "algorithm.beta=0.04", "algorithm.loss_type=grpo",
        "rewards=[{name: 'fast_path_rewards:digit_share'}]", f"run.output_dir={tmp_path / 'run'}", "run.progress=false",
        "run.loggers=[jsonl]",
    ])
    model_dir = resolve_model_dir(str(tiny_model_dir))
    tokenizer = load_tokenizer(model_dir)
    # the transformers engine on its own copy (as rank 0 holds under FSDP): the sync pushes weights and checks canaries
    engine = DetachedHFEngine(load_policy(model_dir, torch.float32, lazy_device), pad_token_id=tokenizer.pad_token_id,
                              stop_token_ids=stop_token_ids(model_dir, tokenizer))
    trainer = Trainer(cfg, engine=engine, log=lambda *a, **k: None)
    try:
        assert trainer.parts.device == lazy_device
        for model in (trainer.parts.policy, trainer.parts.ref_model):
            assert {p.device.type for p in model.parameters()} == {"lazy"}
        recorder = DeviceLessTensors(next(trainer.parts.policy.parameters()).device)
        with recorder:
            first = trainer.step()  # generate (engine on lazy) → rewards → old + ref log-probs → advantages → update
            trainer.sync.push()  # push into the engine's copy, canary scored by both
            second = trainer.step()  # the batch's second slice: its stored tensors reused
        assert recorder.found == [], "tensors made off the model's device:\n" + "\n".join(recorder.found)
        assert trainer.state.batch.advantages.device.type == "lazy"
        assert {p.device.type for p in engine.inner.model.parameters()} == {"lazy"}
        # the sync really pushed and was checked: the canary gap is measured after the push (float32: ~0 nats)
        assert trainer.state.synced_version == 1 and trainer.sync.last_canary_gap is not None and trainer.sync.last_canary_gap < 1e-4
        for metrics in (first, second):
            assert torch.isfinite(torch.tensor([metrics["loss"], metrics["grad_norm"]], device="cpu")).all()
            assert metrics["grad_norm"] > 0
    finally:
        trainer.close()


def test_recorder_catches_a_device_less_tensor(lazy_device):
    # pad_rows of no rows has no tensor to take a device from: cohort's code makes a CPU tensor (B=0, width 3)
    recorder = DeviceLessTensors(lazy_device)
    with recorder:
        pad_rows([], 3)
        pad_rows([], 3, device=lazy_device)  # told the device: not recorded
    assert len(recorder.found) == 1 and "cohort/models/batching.py" in recorder.found[0] and "cpu" in recorder.found[0]


def test_lazy_device_refuses_cpu_tensors_like_cuda(lazy_device):
    # the property the step test leans on: a CPU tensor meeting a device tensor fails, a 0-dim CPU scalar does not
    x = torch.ones(3, device=lazy_device)
    with pytest.raises(RuntimeError):
        (x + torch.ones(3, device="cpu")).cpu()
    assert (x * torch.tensor(2.0, device="cpu")).cpu().tolist() == [2.0, 2.0, 2.0]

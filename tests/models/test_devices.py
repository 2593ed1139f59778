"""The device decisions of cohort/models/devices.py, with the GPU count and hardware given (no GPU needed)."""

from __future__ import annotations

import re

import pytest
import torch

from cohort.config.resolve import load_config
from cohort.models.devices import (CPU_BF16_MIN_PARAMETERS, DeviceError, auto_dtype, autocast_device_type,
                                   process_group_backend, resolve_device)
from cohort.models.precision import resolve_precision
from cohort.plan.validate import choose_model_dtype, model_dir_of, validate_config


@pytest.mark.parametrize("setting, rank, gpus, expected", [
    ("auto", 0, 0, "cpu"),  # no GPU: the CPU, whatever the rank
    ("auto", 3, 0, "cpu"),
    ("auto", 0, 2, "cuda:0"),  # torchrun's LOCAL_RANK picks the GPU: one rank per GPU
    ("auto", 1, 2, "cuda:1"),
    ("cuda", 1, 8, "cuda:1"),
    ("cuda:5", 0, 8, "cuda:5"),  # written out: taken as is
    ("cpu", 0, 8, "cpu"),  # a GPU machine can still train on the CPU when asked
])
def test_device_per_rank(setting, rank, gpus, expected):
    assert resolve_device(setting, rank, gpus) == torch.device(expected)


@pytest.mark.parametrize("setting, rank, gpus, words", [
    ("auto", 1, 1, "local rank 1 has no GPU of its own"),  # two ranks would share cuda:0: refused, not silently shared
    ("cuda", 0, 0, "sees no GPU"),
    ("cuda:2", 0, 2, "sees 2 GPU(s)"),
    ("gpu0", 0, 0, "not a device"),
])
def test_impossible_devices_are_refused_with_the_fix(setting, rank, gpus, words):
    with pytest.raises(DeviceError, match=re.escape(words)):
        resolve_device(setting, rank, gpus)


def test_process_group_backend_follows_the_device():
    assert process_group_backend(torch.device("cuda", 3)) == "nccl"
    assert process_group_backend(torch.device("cpu")) == "gloo"
    assert process_group_backend(torch.device("meta")) == "gloo"


def test_autocast_follows_the_device():
    # a CUDA model autocast with device_type="cpu" would compute in float32 (the bug this replaces)
    assert resolve_precision("bfloat16", "mixed", torch.device("cuda", 1)).device_type == "cuda"
    assert resolve_precision("bfloat16", "mixed", torch.device("cpu")).device_type == "cpu"
    assert autocast_device_type(torch.device("lazy")) == "cpu"  # a device autocast lacks: the CPU's rules


@pytest.mark.parametrize("device, units, parameters, dtype", [
    ("cuda", True, 1_000_000, "bfloat16"),  # Ampere on: bf16 at any size (TRL's bf16=True default)
    ("cuda", False, 500_000_000, "float32"),  # a V100/T4 has no bf16 units
    ("cpu", True, 31_500_000, "bfloat16"),  # bench m31: 1.43x faster in bf16 on this CPU (docs/gpu.md)
    ("cpu", True, 5_900_000, "bfloat16"),  # bench m6: 1.36x
    ("cpu", True, CPU_BF16_MIN_PARAMETERS, "bfloat16"),  # the bound itself is in
    ("cpu", True, CPU_BF16_MIN_PARAMETERS - 1, "float32"),
    ("cpu", True, 1_000_000, "float32"),  # the demo's 1M model: a step of overhead, bf16 would only add casts
    ("cpu", True, None, "float32"),  # size unknown (a .bin checkpoint, a tiny model not built yet)
    ("cpu", False, 31_500_000, "float32"),  # no AVX512-BF16 / AMX
])
def test_auto_dtype(device, units, parameters, dtype):
    assert auto_dtype(device, units, parameters)[0] == dtype


def test_auto_dtype_is_chosen_into_the_plans_config_and_the_callers_is_untouched(tiny_model_dir):
    # the random tiny checkpoint has far fewer than 3M parameters: float32 on a CPU, and the plan's config says so
    cfg = load_config(None, [f"model.path={tiny_model_dir}", "data.train_files=[x.jsonl]"])
    assert cfg.model.dtype == "auto"
    dtype, chosen, problems = choose_model_dtype(cfg, model_dir_of(cfg))
    assert (dtype, problems) == ("float32", []) and chosen.startswith("model.dtype auto = float32 (")
    assert cfg.model.dtype == "auto"  # chosen, never written
    plan = validate_config(cfg, check_files=False)
    assert plan.config.model.dtype == "float32" and cfg.model.dtype == "auto" and plan.config is not cfg
    explicit = load_config(None, [f"model.path={tiny_model_dir}", "model.dtype=bfloat16"])
    assert choose_model_dtype(explicit, None) == ("bfloat16", None, [])  # already concrete: nothing more to say


def test_planning_a_gpu_run_chooses_auto_as_a_gpu_would(tiny_model_dir, monkeypatch):
    # `cohort plan --gpu-memory-gib N` on this CPU machine: auto is chosen as on a GPU with bf16 units (bf16 at any
    # size), not as this machine would (float32 for a 0.3M model)
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    dtype, chosen, problems = choose_model_dtype(cfg, model_dir_of(cfg), for_gpu=True)
    assert (dtype, problems) == ("bfloat16", []) and "--gpu-memory-gib" in chosen and cfg.model.dtype == "auto"
    # on a GPU machine the device chosen by train.device=auto is named too
    import cohort.plan.validate as validation
    monkeypatch.setattr(validation, "resolve_device", lambda setting="auto": torch.device("cuda", 1))
    monkeypatch.setattr(validation, "has_bf16_units", lambda device: True)
    cfg = load_config(None, [f"model.path={tiny_model_dir}"])
    assert choose_model_dtype(cfg, model_dir_of(cfg))[1] == "train.device auto = cuda:1; model.dtype auto = bfloat16 (a GPU with bfloat16 units)"

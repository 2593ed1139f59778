"""The trainer's default thread count: one thread for a model under SMALL_MODEL_PARAMETERS on CPU (measured faster,
docs/performance.md "Threads"), unless the config or the environment says otherwise."""

from __future__ import annotations

import pytest
import torch

from cohort.config import load_config
from cohort.trainer import engines
from cohort.trainer.engines import SMALL_MODEL_PARAMETERS, set_torch_threads


@pytest.fixture
def calls(monkeypatch):
    seen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", seen.append)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    return seen


@pytest.mark.parametrize(("overrides", "num_parameters", "expected"), [
    ([], 1_027_712, [1]),  # tiny:arith's size: one thread
    ([], SMALL_MODEL_PARAMETERS - 1, [1]),
    ([], SMALL_MODEL_PARAMETERS, []),  # at the bound and above: PyTorch's default (no call)
    ([], 31_500_000, []),
    ([], None, []),  # size unknown (before the model is loaded): no change
    (["train.num_threads=2"], 1_027_712, [2]),  # the config wins
    (["rollout.mode=local_server", "rollout.overlap=true", "rollout.num_threads=1"], 1_027_712, [1]),  # cores left: 2 - 1
])
def test_default_threads(calls, monkeypatch, overrides, num_parameters, expected):
    monkeypatch.setattr(engines.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    set_torch_threads(load_config(None, overrides), num_parameters=num_parameters)
    assert calls == expected


def test_environment_and_gpu_keep_pytorchs_default(calls, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    set_torch_threads(load_config(None, []), num_parameters=1_000_000)
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    set_torch_threads(load_config(None, []), num_parameters=1_000_000)
    assert calls == []

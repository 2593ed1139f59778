"""The trainer's default thread count: one thread for a model under SMALL_MODEL_PARAMETERS on CPU (measured faster,
docs/performance.md "Threads"), unless the config or the environment says otherwise."""

from __future__ import annotations

import pytest
import torch

from cohort.config.resolve import load_config
from cohort.trainer import build_engine as engines
from cohort.models.pretrained import checkpoint_parameters
from cohort.trainer.build_engine import SMALL_MODEL_PARAMETERS, set_torch_threads


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
    (["engine.mode=local_server", "pipeline.max_staleness=1", "engine.num_threads=1"], 1_027_712, [1]),  # cores left: 2 - 1
])
def test_default_threads(calls, monkeypatch, overrides, num_parameters, expected):
    monkeypatch.setattr(engines.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    set_torch_threads(load_config(None, overrides), num_parameters=num_parameters)
    assert calls == expected


def test_environment_and_gpu_keep_pytorchs_default(calls, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    set_torch_threads(load_config(None, []), num_parameters=1_000_000)
    monkeypatch.delenv("OMP_NUM_THREADS")
    # the default keys on the training device in use, not on whether CUDA exists: a model trained on a GPU keeps
    # PyTorch's count (its CPU threads only feed the GPU)
    set_torch_threads(load_config(None, []), num_parameters=1_000_000, device=torch.device("cuda", 0))
    assert calls == []
    set_torch_threads(load_config(None, []), num_parameters=1_000_000, device=torch.device("cpu"))
    assert calls == [1]


@pytest.mark.parametrize("arch", ["qwen2", "gemma2"])  # untied, and a tied output layer (stored once)
def test_checkpoint_parameters_counts_what_loads(random_arch_builder, arch):
    """`cohort eval` sizes its thread default from the checkpoint's headers, before any model is loaded: the count must be
    the loaded model's, which the trainer uses."""
    from cohort.models.pretrained import checkpoint_parameters, load_policy

    model_dir = random_arch_builder(arch)
    loaded = sum(p.numel() for p in load_policy(model_dir, torch.float32).parameters())
    assert checkpoint_parameters(model_dir) == loaded


def test_checkpoint_parameters_without_safetensors(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert checkpoint_parameters(tmp_path) is None  # unknown size: the default leaves PyTorch's thread count alone


def test_eval_takes_the_trainers_thread_default(calls, monkeypatch, tiny_model_dir, tmp_path):
    """`cohort eval` of a 1M-parameter checkpoint generates on one thread, as the trainer's "before" eval does."""
    from cohort.trainer import evaluate

    class Stop(Exception):
        pass

    def stop(*args, **kwargs):
        raise Stop

    monkeypatch.setattr(evaluate, "encode_prompts", stop)  # the threads are set before the prompts and the engine
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", f"data.eval_files=[{data}]", "rewards=[{name: numeric_match}]"])
    with pytest.raises(Stop):
        evaluate.evaluate_model(cfg, num_samples=0, pass_k=1, temperature=0.0)
    assert calls == [1]

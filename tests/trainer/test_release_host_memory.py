"""Where the trainer gives the heap's free pages back (train.release_host_memory; cohort/models/host_memory.py)."""

from __future__ import annotations

import pytest

from cohort.config.resolve import load_config
from cohort.trainer import critic as critic_module
from cohort.trainer import trainer as trainer_module
from cohort.trainer.trainer import Trainer
from tests.builders import tiny_run, write_doubling


@pytest.mark.parametrize(("extra", "policy_calls", "critic_calls"), [
    # 2 prompts × G=4 = 8 completions in micro-batches of 2: 4 micro-batches. The policy's update: once before it, once
    # after each micro-batch's backward, once after it (6); ppo's critic once after each of its 4 micro-batches.
    ([], 1 + 4 + 1, 0),
    (["algorithm.name=ppo"], 1 + 4 + 1, 4),
    (["train.release_host_memory=false"], 0, 0),
    (["train.release_host_memory=false", "algorithm.name=ppo"], 0, 0),
])
def test_a_step_releases_the_heap_between_its_phases(tmp_path, tiny_model_dir, monkeypatch, extra, policy_calls, critic_calls):
    calls = {"policy": 0, "critic": 0}

    def counter(part):
        def release(device=None):
            assert device is not None and device.type == "cpu"  # (the training side's device: the call decides by it)
            calls[part] += 1
            return True
        return release

    monkeypatch.setattr(trainer_module, "release_host_memory", counter("policy"))
    monkeypatch.setattr(critic_module, "release_host_memory", counter("critic"))
    data = write_doubling(tmp_path / "train.jsonl", 8)
    cfg = load_config(None, tiny_run(tiny_model_dir, data, tmp_path / "run", "engine.name=hf", "train.device=cpu",
                                     "train.prompts_per_step=2", "train.micro_batch_size=2", "rollout.max_completion_length=4",
                                     "rewards=[{name: exact_match}]", *extra))
    trainer = Trainer(cfg, log=lambda *a, **k: None)
    try:
        trainer.step()
    finally:
        trainer.close()
    assert calls == {"policy": policy_calls, "critic": critic_calls}

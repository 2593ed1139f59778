"""The trainer honours Trajectory.loss_mask: tool-output tokens (mask 0) stay out of the advantages' mask, the
loss/ratio/entropy/KL mask, the loss normaliser and the length metrics (the transformers engine, a tiny model)."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from cohort.algorithms import aggregation_count
from cohort.config.resolve import load_config
from cohort.rollout.base import Trajectory
from cohort.trainer.trainer import Trainer
from cohort.trainer.rollout_batch import RolloutBatch
from tests.builders import write_doubling


@pytest.fixture
def trainer(tmp_path, tiny_model_dir):
    path = tmp_path / "train.jsonl"
    write_doubling(path, 4)
    cfg = load_config(None, [
        f"model.path={tiny_model_dir}", f"data.train_files=[{path}]", "data.max_prompt_length=16", "engine.name=hf",
        "rollout.num_generations=2", "rollout.max_completion_length=8", "train.prompts_per_step=1",
        "train.micro_batch_size=4", "train.max_steps=1", "algorithm.loss_type=dapo", "rewards=[{name: 'numeric_match'}]",
        f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]"])
    t = Trainer(cfg, log=lambda *a, **k: None)
    yield t
    t.close()


def _batch() -> RolloutBatch:
    # completion 0: 2 sampled tokens, 3 tool tokens, 1 sampled token (6 tokens, 3 trained); completion 1: 4 sampled
    tool = Trajectory([5, 6, 7, 8, 9, 10], [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3], "stop", loss_mask=[1, 1, 0, 0, 0, 1])
    plain = Trajectory([5, 6, 7, 8], [-0.1, -0.2, -0.3, -0.4], "stop")
    return RolloutBatch.from_trajectories([0, 0], [[1, 2], [1, 2]], [tool, plain], rewards=np.array([1.0, 0.0]),
                                          per_function=np.zeros((2, 1)), texts=["a", "b"], policy_version=0)


def test_masks_and_normaliser_leave_tool_tokens_out(trainer):
    batch = _batch()
    expected = torch.tensor([[1, 1, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.float32)  # row 1 padded from 4 to 6
    assert torch.equal(trainer.advantage_mask(batch), expected)
    mask = trainer.pack(batch, [0, 1]).mask
    assert torch.equal(mask, expected)
    # dapo (token mean over the batch): the normaliser counts trained tokens, 3 + 4 = 7, not 6 + 4 = 10
    assert float(aggregation_count(mask, trainer.parts.aggregation)) == 7.0


def test_length_metrics_count_sampled_tokens_only(trainer):
    batch = _batch()
    metrics = trainer._batch_metrics(batch, batch, {})  # (each row its own run)
    assert metrics["completions/mean_length"] == 3.5  # (3 + 4) / 2, tool tokens left out
    assert metrics["completions/max_length"] == 4.0 and metrics["tokens/generated"] == 7.0


def test_grpo_advantages_are_zero_on_tool_tokens(trainer):
    batch = _batch()
    advantages = trainer._advantages(batch)[0].advantages  # (the batch's rewards, 1 and 0)
    # group of 2 with rewards 1 and 0: mean 0.5, std (Bessel-corrected) 0.7071 -> +0.7071 and -0.7071 on trained tokens
    assert torch.allclose(advantages[0], torch.tensor([0.7071, 0.7071, 0, 0, 0, 0.7071]), atol=1e-4)
    assert torch.allclose(advantages[1], torch.tensor([-0.7071] * 4 + [0, 0]), atol=1e-4)

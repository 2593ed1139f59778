"""`TrainerState` owns the run's counters and batch: saved and restored through its own state dict, rewound to a copy;
and a checkpoint in an older layout (the generation index beside the counters, the learning-rate schedule saved as
"scheduler") still loads."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from cohort.config.resolve import load_config
from cohort.agents.runs import AgentRun
from cohort.trainer import checkpoint
from cohort.trainer.trainer import Trainer
from cohort.trainer.rollout_batch import RolloutBatch
from cohort.trainer.state import TrainerState
from tests.builders import tiny_run, write_doubling


def _batch() -> RolloutBatch:
    return RolloutBatch(row_indices=[0, 0], prompt_ids=[[1, 2], [1, 2]], completion_ids=[[3], [4, 5]],
                        engine_logp=[[-0.5], [-0.25, -1.0]], truncated=[False, True], completions_text=["a", "bc"],
                        rewards=np.array([1.0, 0.0]), per_function=np.array([[1.0], [0.0]]),
                        advantages=torch.tensor([[0.5, 0.0], [-0.5, -0.5]]), policy_version=3, versions=[[3], [3, 3]])


def test_the_state_saves_its_batch_only_inside_a_generation_batch_and_restores_it():
    state = TrainerState(steps_per_generation=2, step=5, policy_version=5, synced_version=5, batch=_batch())
    saved = state.state_dict()  # step 5 of 2 per batch: the next step trains on this batch again
    assert (saved["step"], saved["policy_version"]) == (5, 5) and saved["batch"] is not None
    restored = TrainerState(steps_per_generation=2)
    restored.load_state_dict(saved)
    assert (restored.step, restored.policy_version, restored.synced_version) == (5, 5, -1)  # a fresh engine holds none
    assert restored.batch.completion_ids == [[3], [4, 5]] and restored.batch.rewards.tolist() == [1.0, 0.0]
    assert torch.equal(restored.batch.advantages, state.batch.advantages) and restored.batch.policy_version == 3
    state.step = 6  # at a batch's end the next step generates anew: nothing to keep
    assert state.state_dict()["batch"] is None


def test_a_batch_of_agent_runs_saved_inside_a_generation_batch_loads_back_with_its_runs(tmp_path):
    # an agent run that rewrote its history (runs [0, 0]: its first call, then its own row), trained over 2 steps per
    # generation batch: the checkpoint keeps the rows and their runs; the AgentRun records are saved as plain data (a weights_only
    # load refused the objects before) and read back
    batch = dataclasses.replace(_batch(), runs=[0, 0], episodes=[None, AgentRun(outcome={"reward": 1.0}, turns=2)])
    state = TrainerState(steps_per_generation=2, step=1, policy_version=1, batch=batch)
    torch.save(state.state_dict(), tmp_path / "state.pt")
    restored = TrainerState(steps_per_generation=2)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored.batch.runs == [0, 0] and restored.batch.num_runs == 1 and restored.batch.episodes == batch.episodes
    assert restored.batch.completion_ids == [[3], [4, 5]]


def test_a_batch_of_multi_turn_records_is_saved_as_plain_data_and_read_back(tmp_path):
    # A tool-loop run checkpointed inside a generation batch (steps_per_generation 2): the batch's records go into
    # state.pt, which is read back with torch.load(weights_only=True). At 4f35103 the Episode objects (their live
    # environment instance included) were pickled as they were and the load refused them (WeightsUnpickler error).
    from collections import Counter

    from cohort.tools.episode import Episode

    episode = Episode(conversation=[{"role": "assistant", "content": "<<mul(2, 3)>>"}], environment=object(), turns=1,
                      calls=Counter({"mul": 1}), segments=[(0, 1, "assistant")], observation=" board")
    state = TrainerState(steps_per_generation=2, step=1, policy_version=1,
                         batch=dataclasses.replace(_batch(), episodes=[episode, None]))
    torch.save(state.state_dict(), tmp_path / "state.pt")
    restored = TrainerState(steps_per_generation=2)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored.batch.episodes == [dataclasses.replace(episode, environment=None), None]  # no live instance
    assert restored.batch.tool_record(0)["observation"] == " board" and restored.batch.tool_record(1) == {}


def test_a_step_rewinds_to_the_copy_taken_at_its_start():
    state = TrainerState(steps_per_generation=1, step=2, policy_version=2, batch=_batch())
    snap = state.copy()
    state.step, state.policy_version, state.batch = 3, 3, None
    state.rewind_to(snap)
    assert (state.step, state.policy_version) == (2, 2) and state.batch is snap.batch


def test_a_checkpoint_in_the_layout_before_trainer_state_still_loads(tmp_path, tiny_model_dir):
    data = write_doubling(tmp_path / "train.jsonl", 4)
    cfg = load_config(None, tiny_run(tiny_model_dir, data, tmp_path / "run", "engine.name=hf", "rollout.num_generations=2",
                                     "rollout.max_completion_length=2", "train.prompts_per_step=2", "train.max_steps=2",
                                     "rewards=[{name: numeric_match}]"))
    trainer = Trainer(cfg)
    try:
        trainer.step()
        saved = checkpoint.save_checkpoint(trainer.checkpointed())
        assert trainer.scheduler.generation_index == 1 and trainer.parts.lr_schedule.last_epoch == 1
    finally:
        trainer.close()
    state = torch.load(saved / "state.pt", weights_only=True)
    assert state["parts"]["rollout"]["generation_index"] == 1  # the scheduler saves its own count now
    del state["parts"]["rollout"]["generation_index"]  # the layout before: the count beside the trainer's counters
    state["generation_index"] = 1
    state["parts"]["scheduler"] = state["parts"].pop("lr_schedule")  # the learning-rate schedule's name before
    torch.save(state, saved / "state.pt")
    again = Trainer(cfg)
    try:
        meta = checkpoint.load_checkpoint(again.checkpointed(), saved)
        assert (meta["step"], again.state.step, again.state.policy_version, again.scheduler.generation_index) == (1, 1, 1, 1)
        assert again.parts.lr_schedule.last_epoch == 1  # (a fresh schedule is at 0)
    finally:
        again.close()

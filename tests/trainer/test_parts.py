"""The trainer's state is declared: `setup` returns one `TrainerParts`, the Trainer holds it and declares the rest;
nothing is forwarded (a part is read as `trainer.parts.policy`, never `trainer.policy`)."""

from __future__ import annotations

import dataclasses
import json

from cohort.config.resolve import load_config
from cohort.trainer.state import stateful_parts
from cohort.trainer.trainer import Trainer
from cohort.trainer.parts import TrainerParts
from cohort.trainer.weight_sync import WeightSync

# what Trainer.__init__ declares (a new attribute must be declared there and added here)
OWN_STATE = {"cfg", "plan", "log", "phases", "state", "parts", "scheduler", "sync", "stream_update",
             "answers",  # (the first reward's answer reader, for the answers/* metrics: built in __init__)
             "failures"}  # (the last generated batch's failed episodes, until the loop takes them: episode_failures.py)


def test_every_part_is_a_declared_field_read_through_the_parts_and_swapping_the_engine_reaches_the_scheduler(
        tmp_path, tiny_model_dir):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(4)))
    cfg = load_config(None, [f"model.path={tiny_model_dir}", f"data.train_files=[{data}]", "engine.name=hf",
                             "rollout.num_generations=2", "rollout.max_completion_length=2", "train.prompts_per_step=2",
                             "train.max_steps=1", "rewards=[{name: numeric_match}]", f"run.output_dir={tmp_path / 'run'}",
                             "run.progress=false", "run.loggers=[jsonl]"])
    trainer = Trainer(cfg)
    try:
        assert isinstance(trainer.parts, TrainerParts)
        assert set(vars(trainer)) == OWN_STATE  # nothing assigned onto the trainer from outside
        assert isinstance(trainer.sync, WeightSync) and trainer.sync.parts is trainer.parts
        for field in dataclasses.fields(TrainerParts):  # no forwarding: a part is not an attribute of the trainer
            assert not hasattr(trainer, field.name), field.name
        assert trainer.parts.run_dir == tmp_path / "run"
        assert trainer.parts.engine_shares_policy  # engine.name=hf in one process generates with the policy itself
        engine = trainer.parts.engine
        trainer.swap_engine(wrapped := object())  # a test's wrapper replaces the part and the scheduler's engine
        assert trainer.parts.engine is wrapped and trainer.scheduler.engine is wrapped
        trainer.swap_engine(engine)
        # checkpoints save the stateful parts under the names old checkpoints use
        saved = trainer.checkpointed()
        assert sorted(saved.stateful) == ["kl_controller", "lr_schedule", "optimizer", "rollout", "sampler", "sync_check"]
        assert saved.stateful == stateful_parts(trainer.parts, trainer.sync.check, trainer.scheduler)
        assert saved.stateful["sync_check"] is trainer.sync.check and saved.stateful["rollout"] is trainer.scheduler
    finally:
        trainer.close()

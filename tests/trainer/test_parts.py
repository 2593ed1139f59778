"""The trainer's state is declared: `setup` returns one `TrainerParts`, the Trainer holds it and declares the rest."""

from __future__ import annotations

import dataclasses
import json

from cohort.config.loading import load_config
from cohort.trainer import checkpoint
from cohort.trainer.trainer import Trainer
from cohort.trainer.parts import PART_NAMES, TrainerParts

# what Trainer.__init__ declares besides the parts (a new attribute must be declared there and added here)
OWN_STATE = {"cfg", "plan", "log", "phases", "state", "sync_check", "sync_metrics", "last_canary_gap", "sync_bytes_sent",
             "parts", "rollout", "stream_update"}


def test_every_part_is_a_declared_field_and_assigning_one_replaces_it(tmp_path, tiny_model_dir):
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
        assert trainer.policy is trainer.parts.policy and trainer.run_dir == tmp_path / "run"
        assert trainer.engine_shares_policy  # engine.name=hf in one process generates with the policy itself
        engine = trainer.engine
        trainer.engine = wrapped = object()  # a test's wrapper replaces the part, it does not shadow it
        assert trainer.parts.engine is wrapped and "engine" not in vars(trainer)
        trainer.engine = engine
        # checkpoints save the stateful parts under the names old checkpoints use
        assert sorted(checkpoint.stateful_parts(trainer)) == ["kl_controller", "lr_schedule", "optimizer", "rollout",
                                                              "sampler", "sync_check"]
        assert PART_NAMES == {f.name for f in dataclasses.fields(TrainerParts)}
    finally:
        trainer.close()

"""`cohort train` and `cohort.train` validate a config once: the caller that validates hands its plan to the Trainer.

A spy wraps the real `validate_config` (it still runs every check) and counts the calls, wherever a module holds
the name: the command line and the API import it from cohort.plan.validate, the Trainer from its own module.
"""

from __future__ import annotations

import json

import pytest

import cohort
from cohort import cli
from cohort.plan import validate
from cohort.trainer import trainer as trainer_module


@pytest.fixture
def count_validations(monkeypatch):
    calls = []
    real = validate.validate_config

    def spy(cfg, **kwargs):
        calls.append(kwargs)
        return real(cfg, **kwargs)

    monkeypatch.setattr(validate, "validate_config", spy)
    monkeypatch.setattr(trainer_module, "validate_config", spy)
    monkeypatch.setattr("cohort.api.validate_config", spy)
    return calls


def _overrides(tmp_path, model_dir) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(8)))
    return [f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.name=hf",
            "rollout.num_generations=2", "rollout.max_completion_length=4", "train.prompts_per_step=2",
            "train.micro_batch_size=4", "train.max_steps=1", "rewards=[{name: numeric_match}]",
            f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]"]


def test_cohort_train_validates_once(tmp_path, tiny_model_dir, count_validations):
    assert cli.main(["train", *_overrides(tmp_path, tiny_model_dir)]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()  # (it trained: one step)
    assert count_validations == [{"check_files": True}]


def test_the_python_api_validates_once(tmp_path, tiny_model_dir, count_validations):
    summary = cohort.train(None, overrides=_overrides(tmp_path, tiny_model_dir))
    assert summary["steps"] == 1
    assert len(count_validations) == 1


def test_a_trainer_built_without_a_plan_validates_itself(tmp_path, tiny_model_dir, count_validations):
    from cohort.config import load_config

    trainer = trainer_module.Trainer(load_config(None, _overrides(tmp_path, tiny_model_dir)))
    trainer.close()
    assert len(count_validations) == 1 and trainer.plan.max_steps == 1

"""A run validates its config once and loads its tokenizer once per process, Ray actors included.

`cohort train` and `cohort.train` validate, then hand the plan (`RunPlan`: the resolved config, the batch plan and what
validation read) to the Trainer, whose setup reuses the tokenizer and the encoded prompts; a Ray trainer actor receives
the plan without what the driver read (`actor_plan`) and reads its own once, without validating again.

Spies wrap the real functions (they still run) and count the calls: `validate_config` wherever a module holds the
name (the command line and the API import it from cohort.plan.validate, the Trainer from its own module), and
`AutoTokenizer.from_pretrained`, which every tokenizer load of a checkpoint goes through
(cohort.models.pretrained.load_tokenizer).
"""

from __future__ import annotations

import json
import os
import pickle

import pytest
import transformers

import cohort
from cohort import cli
from cohort.config import load_config
from cohort.launch.ray_cluster import TrainerActor, actor_plan
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


@pytest.fixture
def count_tokenizer_loads(monkeypatch):
    """The directories AutoTokenizer.from_pretrained was asked to load, in order."""
    loads = []
    real = transformers.AutoTokenizer.from_pretrained

    def spy(path, *args, **kwargs):
        loads.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    return loads


def _overrides(tmp_path, model_dir) -> list[str]:
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(8)))
    return [f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.name=hf",
            "rollout.num_generations=2", "rollout.max_completion_length=4", "train.prompts_per_step=2",
            "train.micro_batch_size=4", "train.max_steps=1", "rewards=[{name: numeric_match}]",
            f"run.output_dir={tmp_path / 'run'}", "run.progress=false", "run.loggers=[jsonl]"]


def test_cohort_train_validates_once_and_loads_the_tokenizer_once(tmp_path, tiny_model_dir, count_validations,
                                                                   count_tokenizer_loads):
    assert cli.main(["train", *_overrides(tmp_path, tiny_model_dir)]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()  # (it trained: one step)
    assert len(count_validations) == 1 and count_validations[0]["check_files"] is True
    assert count_tokenizer_loads == [str(tiny_model_dir)]  # validation's load, reused by the setup


def test_the_python_api_validates_once_and_loads_the_tokenizer_once(tmp_path, tiny_model_dir, count_validations,
                                                                     count_tokenizer_loads):
    summary = cohort.train(None, overrides=_overrides(tmp_path, tiny_model_dir))
    assert summary["steps"] == 1
    assert len(count_validations) == 1
    assert count_tokenizer_loads == [str(tiny_model_dir)]


def test_a_trainer_built_from_a_config_validates_it_and_reuses_what_validation_read(tmp_path, tiny_model_dir,
                                                                                    count_validations,
                                                                                    count_tokenizer_loads):
    cfg = load_config(None, _overrides(tmp_path, tiny_model_dir))
    before = cfg.model_dump()
    trainer = trainer_module.Trainer(cfg)
    trainer.close()
    assert len(count_validations) == 1 and trainer.plan.max_steps == 1
    assert count_tokenizer_loads == [str(tiny_model_dir)]
    # the caller's config is untouched (model.dtype stays auto); the trainer reads the resolved copy
    assert cfg.model_dump() == before and cfg.model.dtype == "auto"
    assert trainer.cfg is not cfg and trainer.cfg.model.dtype == "float32"  # (a 0.3M model on the CPU: float32)


def test_validation_hands_setup_the_tokenizer_and_the_prompts_it_encoded(tmp_path, tiny_model_dir, count_tokenizer_loads):
    plan = validate.validate_config(load_config(None, _overrides(tmp_path, tiny_model_dir)))
    read = plan.read
    assert read is not None and read.model_dir == tiny_model_dir
    assert [len(ids) for ids in read.prompts.train_ids] == [4] * 8  # "0+0=" ... "7+7=": 4 characters, 4 tokens each
    trainer = trainer_module.Trainer(plan)
    trainer.close()
    assert trainer.parts.tokenizer is read.tokenizer and trainer.parts.train_ids is read.prompts.train_ids
    assert count_tokenizer_loads == [str(tiny_model_dir)]


def test_a_ray_trainer_actor_receives_the_plan_and_never_validates(tmp_path, tiny_model_dir, count_validations,
                                                                   count_tokenizer_loads, monkeypatch):
    """The actor's own code path (`TrainerActor.train`) run in this process, as Ray runs it in the actor's: the plan
    crosses by pickle, without the driver's tokenizer and prompts, and the actor reads its own once."""
    monkeypatch.chdir(tmp_path)
    overrides = [o for o in _overrides(tmp_path, tiny_model_dir) if not o.startswith("run.output_dir")]
    driver = validate.validate_config(load_config(None, [*overrides, "run.output_dir=run", "distributed.backend=ray"]))
    sent = actor_plan(driver, [])
    assert (sent.config.distributed.backend, sent.config.run.output_dir) == ("none", str(tmp_path / "run"))
    assert sent.read is None and sent.batch == driver.batch and driver.read is not None
    received = pickle.loads(pickle.dumps(sent))  # (Ray pickles the arguments of a remote call)
    del count_validations[:], count_tokenizer_loads[:]
    summary = TrainerActor(0, 1).train(os.getcwd(), received, ("127.0.0.1", 0))
    assert summary["steps"] == 1
    assert count_validations == []  # the driver validated; the actor did not
    assert count_tokenizer_loads == [str(tiny_model_dir)]  # once, in the actor's setup


def test_a_hub_model_is_read_from_its_snapshot_once_and_its_weights_fetched_by_the_run(tmp_path, tiny_model_dir,
                                                                                       place_in_hub,
                                                                                       count_tokenizer_loads):
    """Validation reads a Hub id's snapshot (config and tokenizer, never the weights): the plan hands over its tokenizer
    and prompts but no checkpoint directory, and the setup resolves the snapshot with its weights."""
    snapshot = place_in_hub("org/tiny", tiny_model_dir)
    overrides = [o.replace(f"model.path={tiny_model_dir}", "model.path=org/tiny") for o in _overrides(tmp_path, tiny_model_dir)]
    plan = validate.validate_config(load_config(None, overrides))
    assert plan.read is not None and plan.read.model_dir is None  # (the weights: the run's, not the planner's)
    trainer = trainer_module.Trainer(plan)
    trainer.close()
    assert trainer.parts.model_dir == snapshot and trainer.parts.tokenizer is plan.read.tokenizer
    assert count_tokenizer_loads == [str(snapshot)]

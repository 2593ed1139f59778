"""cohort.train: Python callables and in-memory rows through the CLI's config, validation and Trainer path.

The training case is tests/trainer/test_train_e2e.py's task (reward: the share of "7"
in the completion; the random tiny model starts near 0 — about 1 in 259 tokens is
"7" — and GRPO at lr 3e-3 drives it towards 1 within ~20 steps with the hf engine),
here given as a lambda and a list of dicts instead of a module path and a file.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

import cohort
from cohort import api
from cohort.config import ConfigError
from cohort.trainer.failure import RunFailed
from cohort.config.references import reference
from cohort.rewards.reward_registry import resolve

ROWS = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(32)]


def _config(model_dir, out, **train):
    return {"model": {"path": str(model_dir)}, "data": {"max_prompt_length": 16},
            "rollout": {"num_generations": 4, "max_completion_length": 6}, "engine": {"name": "hf"},
            "train": {"prompts_per_step": 4, "micro_batch_size": 8, "learning_rate": 3e-3, **train},
            "run": {"output_dir": str(out), "progress": False, "loggers": ["jsonl"]}}


def _no_loading(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the config was refused")

    monkeypatch.setattr("cohort.launch.launch.Trainer", refuse)  # (the run both cohort train and cohort.train call)
    monkeypatch.setattr("cohort.trainer.build_parts.load_policy", refuse)


@pytest.mark.slow
def test_lambda_and_list_of_dicts_train_and_the_reward_rises(tmp_path, tiny_model_dir):
    calls = []

    async def seen(prompts, completions, answer, **kwargs):  # async, weight 0: called with the row's columns, adds nothing
        await asyncio.sleep(0)
        calls.append(answer[:1])
        return [0.0] * len(completions)

    summary = cohort.train(_config(tiny_model_dir, tmp_path / "run", max_steps=20),
                           reward_funcs=[lambda prompts, completions, **kw: [c.count("7") / max(1, len(c)) for c in completions],
                                         {"name": seen, "weight": 0.0}, {"name": "think_format", "weight": 0.0}],
                           train_dataset=ROWS)
    run_dir = tmp_path / "run"
    assert summary["run_dir"] == str(run_dir) and summary["steps"] == 20
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 20
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, last = sum(m["reward"] for m in lines[:4]) / 4, sum(m["reward"] for m in lines[-4:]) / 4
    assert first < 0.15 and last > 0.8, (first, last)  # measured 0.02 -> 0.96
    assert {"rewards/lambda/mean", "rewards/seen/mean", "rewards/think_format/mean"} <= set(lines[0])
    assert calls and calls[0][0] in {r["answer"] for r in ROWS}  # the dataset's other columns reached the callable
    # the rows became a file of the run, which the saved config names; the lambda is recorded as in-process only
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["data"]["train_files"] == [str(run_dir / "data" / "train.jsonl")]
    assert [json.loads(line) for line in (run_dir / "data" / "train.jsonl").read_text().splitlines()] == ROWS
    assert saved["rewards"][0]["name"].startswith("<python ") and saved["rewards"][2]["name"] == "think_format"
    assert (run_dir / "final" / "model.safetensors").is_file()


def test_a_reward_returning_the_wrong_count_names_the_function(tmp_path, tiny_model_dir):
    def two_values(prompts, completions, **kwargs):
        return [0.0, 1.0]

    # a failure inside the run is one RunFailed naming the step, the phase and the function (traceback in logs/error.log)
    with pytest.raises(RunFailed, match=r"step 1 \(reward\): reward function 'two_values' returned 2 values for 16 completions"):
        cohort.train(_config(tiny_model_dir, tmp_path / "run", max_steps=1), reward_funcs=[two_values], train_dataset=ROWS)


def test_a_bad_config_raises_before_anything_loads_or_is_written(tmp_path, tiny_model_dir, monkeypatch):
    _no_loading(monkeypatch)
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as err:
        # 4 prompts × 3 completions = 12 completions per step do not split into micro-batches of 5
        cohort.train(_config(tiny_model_dir, out), overrides=["rollout.num_generations=3", "train.micro_batch_size=5"],
                     reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions), "no_such_reward"],
                     train_dataset=ROWS)
    text = str(err.value)
    assert "train.micro_batch_size = 5; use 4 or 6" in text
    assert "rewards[1] (name = 'no_such_reward')" in text
    assert not out.exists()
    with pytest.raises(ConfigError, match=r"train_dataset\[1\]: expected a dict"):
        cohort.train(_config(tiny_model_dir, out), reward_funcs=["accuracy"], train_dataset=[ROWS[0], "3+4="])
    with pytest.raises(ConfigError, match=r"reward_funcs\[0\]\.weight"):
        cohort.train(_config(tiny_model_dir, out), reward_funcs=[{"name": "accuracy", "weight": "heavy"}], train_dataset=ROWS)
    with pytest.raises(ConfigError, match="data.prompt_key = 'prompt'"):  # the file checks see the written rows
        cohort.train(_config(tiny_model_dir, out), reward_funcs=["accuracy"], train_dataset=[{"question": "3+4="}])
    assert not out.exists()


def test_a_lambda_is_refused_where_other_processes_would_need_to_import_it(tmp_path, tiny_model_dir, monkeypatch):
    _no_loading(monkeypatch)
    with pytest.raises(ConfigError, match="no import path .* train.num_processes = 2"):
        cohort.train(_config(tiny_model_dir, tmp_path / "run", num_processes=2),
                     reward_funcs=[lambda prompts, completions, **kw: [0.0] * len(completions)], train_dataset=ROWS)


def test_reward_objects_resolve_and_are_recorded_by_import_path():
    assert reference(json.dumps) == "json:dumps"  # importable: a config file can name it and --resume finds it again
    assert reference(lambda x: x) == "<python test_reward_objects_resolve_and_are_recorded_by_import_path.<locals>.<lambda>>"
    assert resolve(json.dumps).target is json.dumps
    with pytest.raises(ValueError, match="was a Python object given to cohort.train"):
        resolve("<python my_notebook_reward>")


def test_datasets_dataset_and_dict_config_go_through_load_config(tmp_path, tiny_model_dir):
    datasets = pytest.importorskip("datasets")
    config = _config(tiny_model_dir, tmp_path / "run")
    cfg = api.build_config(config, overrides=["train.max_steps=7"], reward_funcs="accuracy",
                           train_dataset=datasets.Dataset.from_list(ROWS), eval_dataset=ROWS[:3])
    assert cfg.train.max_steps == 7 and config["train"].get("max_steps") is None  # the caller's dict is untouched
    assert cfg.data.train_files == [str(tmp_path / "run" / "data" / "train")]
    assert cfg.data.eval_files == [str(tmp_path / "run" / "data" / "eval.jsonl")]
    from cohort.data.datasets import load_prompt_dataset

    assert load_prompt_dataset(cfg.data.train_files).rows == ROWS
    assert [s.name for s in cfg.rewards] == ["accuracy"]

"""The columns the rewards read are checked against the data's first rows before any model loads."""

from __future__ import annotations

import json

import pytest

from cohort import cli
from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.data.datasets import file_columns
from cohort.rewards.columns import reward_column_problems
from cohort.plan.validate import validate_config


def compute_score(data_source, solution_str, ground_truth, extra_info=None):  # verl's contract: reads ground_truth
    return 0.0


def jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def config(data, rewards, *extra):
    return load_config(None, [f"data.train_files=[{data}]", f"rewards={rewards}", *extra])


@pytest.fixture
def no_model_loading(monkeypatch):
    import cohort.models.pretrained as loading
    import cohort.trainer.build_parts as setup

    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded before the reward columns were checked")

    for module in (loading, setup):
        monkeypatch.setattr(module, "load_policy", forbidden)
        monkeypatch.setattr(module, "load_tokenizer", forbidden)


def test_a_missing_gold_column_fails_naming_the_columns_there(tmp_path):
    data = jsonl(tmp_path / "train.jsonl", [{"prompt": f"{i}?", "final": str(i), "id": i} for i in range(4)])
    problems = reward_column_problems(config(data, "[{name: accuracy}, {name: think_format}]"))
    assert problems == [
        f"rewards[0] (name = 'accuracy') reads the gold answer from the column 'solution' or 'answer' or 'ground_truth', "
        f"but data.train_files ({data}) has only the columns ['final', 'id']; set its option gold_column to the column "
        f"that holds it, or add a column 'solution' or 'answer' or 'ground_truth'"
    ]
    assert reward_column_problems(config(data, "[{name: accuracy, gold_column: final}]")) == []
    [problem] = reward_column_problems(config(data, "[{name: numeric_match, gold_column: answer_text}]"))
    assert "reads the gold answer from the column 'answer_text', but" in problem


def test_cohort_train_stops_before_loading_a_model(tmp_path, capsys, no_model_loading):
    data = jsonl(tmp_path / "train.jsonl", [{"prompt": f"{i}?", "final": str(i)} for i in range(4)])
    code = cli.main(["train", f"data.train_files=[{data}]", "rewards=[{name: verl_default}]", f"run.output_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "rewards[0] (name = 'verl_default') reads the data source from the column 'data_source'" in err
    assert "reads the ground truth from the column 'ground_truth'" in err  # both of its needs, each named
    with pytest.raises(ConfigError, match="has only the columns \\['final'\\]"):
        validate_config(config(data, "[{name: reasoning_accuracy}]"))


def test_a_verl_parquet_passes_for_accuracy_verl_default_and_a_verl_function(tmp_path, verl_parquet):
    data = verl_parquet([("openai/gsm8k", "6*12?", "72")])
    assert reward_column_problems(config(data, "[{name: accuracy}, {name: verl_default}]")) == []
    assert reward_column_problems(config(data, f"[{{name: {__name__}.compute_score}}]")) == []
    plain = jsonl(tmp_path / "plain.jsonl", [{"prompt": "1?", "answer": "1"}])
    [problem] = reward_column_problems(config(plain, f"[{{name: {__name__}.compute_score}}]"))
    assert problem.startswith(f"rewards[0] (name = '{__name__}.compute_score') reads the ground truth from the column "
                              f"'ground_truth', but data.train_files ({plain}) has only the columns ['answer']; add the column")


def test_a_column_that_first_appears_after_the_sampled_rows_is_found(tmp_path):
    rows = [{"prompt": f"{i}?"} for i in range(40)] + [{"prompt": "40?", "answer": "40"}]  # row 41 of 41: past the 16 sampled
    data = jsonl(tmp_path / "train.jsonl", rows)
    assert "answer" not in file_columns([str(data)], "prompt")
    assert reward_column_problems(config(data, "[{name: accuracy}]")) == []  # a config that can work is never refused


def test_only_the_first_rows_are_read_when_they_have_the_columns(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}?", "answer": "1"}) + "\n" for i in range(20)) + "not json\n")
    assert file_columns([str(data)], "prompt") == ["answer"]  # line 21 is never parsed
    assert reward_column_problems(config(data, "[{name: numeric_match}]")) == []


def test_the_task_rows_and_the_eval_files_are_checked(tmp_path):
    task = load_config(None, ["data.task=arith", "rewards=[{name: code_tests}]"])
    assert reward_column_problems(task) == [
        "rewards[0] (name = 'code_tests') reads the tests from the column 'tests', but the task 'arith' has only the "
        "columns ['answer']; set its option tests_column to the column that holds it, or add a column 'tests'"
    ]
    assert reward_column_problems(load_config(None, ["data.task=arith"])) == []  # the task's own numeric_match
    train = jsonl(tmp_path / "train.jsonl", [{"prompt": "1?", "answer": "1"}])
    evals = jsonl(tmp_path / "eval.jsonl", [{"prompt": "2?", "label": "2"}])
    [problem] = reward_column_problems(config(train, "[{name: numeric_match}]", f"data.eval_files=[{evals}]"))
    assert f"but data.eval_files ({evals}) has only the columns ['label']" in problem


def test_data_problems_are_left_to_the_data_checks(tmp_path):
    assert reward_column_problems(load_config(None, ["data.task=nope", "rewards=[{name: accuracy}]"])) == []
    assert reward_column_problems(config(tmp_path / "missing.jsonl", "[{name: accuracy}]")) == []
    with pytest.raises(ConfigError) as info:  # one problem, from the data checks
        validate_config(load_config(None, ["data.task=nope", "rewards=[{name: accuracy}]"]))
    assert len(info.value.problems) == 1 and "data.task = 'nope' is not a built-in task" in info.value.problems[0]

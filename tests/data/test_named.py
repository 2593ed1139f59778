"""Datasets by name (data.dataset_name): datasets' own cache laid out as a Hub download leaves it, and a local
dataset directory, read with datasets.load_dataset offline (tests/conftest.py sets HF_HUB_OFFLINE=1)."""

from __future__ import annotations

import json

import pytest

from cohort.config import CohortConfig, ConfigError
from cohort.plan.run_environment import run_data
from cohort.data.named import named_data_problems
from cohort.plan.run_environment import RunEnvironment
from cohort.plan.run_rewards import reward_specs
from cohort.rewards.columns import reward_column_problems
from cohort.plan.validate import validate_config

TRAIN = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]
TEST = [{"question": "What is 7 + 1?", "answer": "8"}]


def config(**data) -> CohortConfig:
    return CohortConfig.model_validate({"data": {"task": None, **data}, "rewards": [{"name": "accuracy"}]})


@pytest.fixture
def hub_dataset(place_dataset):
    """`org/sums` in datasets' cache as `load_dataset("org/sums")` leaves it: a train and a test split."""
    place_dataset("org/sums", {"train": TRAIN, "test": TEST})
    return "org/sums"


def test_a_hub_dataset_loads_by_name_offline_with_its_splits(hub_dataset):
    cfg = config(dataset_name=hub_dataset, dataset_test_split="test", prompt_key="question")
    assert named_data_problems(cfg.data) == []
    train, evals, specs = run_data(cfg)
    assert [row["question"] for row in train.rows] == [row["question"] for row in TRAIN]
    assert [row["answer"] for row in evals.rows] == ["8"]
    assert train.sources[1] == "dataset org/sums split train row 1"
    assert specs is None  # a dataset brings no reward specs: the configured ones are the run's
    assert reward_specs(cfg, RunEnvironment(cfg), specs) == [{"name": "accuracy", "weight": 1.0}]


def test_a_local_dataset_directory_is_a_dataset_name_too(tmp_path):
    """As a Hub dataset repository is laid out: data files under data/, splits named by the file names."""
    (tmp_path / "repo" / "data").mkdir(parents=True)
    for split, rows in (("train", TRAIN), ("test", TEST)):
        (tmp_path / "repo" / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config(dataset_name=str(tmp_path / "repo"), dataset_test_split="test", prompt_key="question")
    train, evals, _ = run_data(cfg)
    assert len(train) == 5 and len(evals) == 1


def test_a_missing_split_names_the_splits_there(hub_dataset):
    cfg = config(dataset_name=hub_dataset, dataset_train_split="validation", prompt_key="question")
    assert named_data_problems(cfg.data) == [
        "data.dataset_train_split = 'validation': dataset org/sums has no such split; it has train, test; set "
        "data.dataset_train_split to one of them"]


def test_a_missing_prompt_column_names_the_columns_and_the_field(hub_dataset):
    cfg = config(dataset_name=hub_dataset)
    assert named_data_problems(cfg.data) == [
        "data.prompt_key = 'prompt': dataset org/sums split train has no such column (columns: question, answer); set "
        "data.prompt_key to the one that holds the prompt (TRL's dataset_prompt_column)"]


def test_a_dataset_not_cached_offline_is_refused_naming_it(hub_cache):
    cfg = config(dataset_name="org/absent", prompt_key="question")
    assert named_data_problems(cfg.data) == [
        "data.dataset_name = 'org/absent': not a local directory and not in the datasets cache, and HF_HUB_OFFLINE=1 "
        "forbids downloading it: unset it to download it once, or give a local dataset directory or data.train_files"]


def test_two_sources_of_the_same_data_are_refused(hub_dataset, tmp_path):
    cfg = config(dataset_name=hub_dataset, prompt_key="question", train_files=[str(tmp_path / "t.jsonl")],
                 dataset_test_split="test", eval_files=[str(tmp_path / "e.jsonl")])
    problems = named_data_problems(cfg.data)
    assert problems[:2] == [
        "data.dataset_name = 'org/sums' and data.train_files are both set: give one source of training data (empty "
        "data.train_files, or unset data.dataset_name)",
        "data.dataset_test_split = 'test' and data.eval_files are both set: give one source of eval data"]


def test_reward_columns_are_checked_against_the_named_dataset(hub_dataset):
    """accuracy reads the gold answer from `solution`, `answer` or `ground_truth`: `answer` is there; renamed away, the
    check names the split and its columns."""
    assert reward_column_problems(config(dataset_name=hub_dataset, prompt_key="question")) == []
    cfg = CohortConfig.model_validate({"data": {"task": None, "dataset_name": hub_dataset, "prompt_key": "answer"},
                                       "rewards": [{"name": "accuracy"}]})
    [problem] = reward_column_problems(cfg)
    assert "dataset org/sums split train has only the columns ['question']" in problem


def test_a_missing_split_is_one_problem_before_anything_loads(hub_dataset, tiny_model_dir):
    """Found by the data check and again when the prompts are measured: reported once; the reward-column check, which
    cannot read a split that is not there, adds nothing."""
    cfg = CohortConfig.model_validate({
        "model": {"path": str(tiny_model_dir)}, "rollout": {"max_completion_length": 16},
        "data": {"dataset_name": hub_dataset, "prompt_key": "question", "dataset_test_split": "validation"},
        "rewards": [{"name": "accuracy"}]})
    with pytest.raises(ConfigError) as error:
        validate_config(cfg)
    assert error.value.problems == [
        "data.dataset_test_split = 'validation': dataset org/sums has no such split; it has train, test; set "
        "data.dataset_test_split to one of them"]

"""A checkpoint folder without a usable tokenizer is refused before anything loads, naming the folder and what it lacks."""

from __future__ import annotations

import shutil

import pytest

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.models.tokenizer_check import tokenizer_problems
from cohort.plan.validate import validate_config


@pytest.fixture
def bare_copy(tmp_path, tiny_model_dir):
    """The tiny checkpoint copied with only config.json and the weights (what `cohort train` used to load, and vLLM
    then died on at step 1: "The decoder prompt cannot be empty")."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, bare / name)
    return bare


def test_a_folder_without_tokenizer_files_is_named_with_what_it_lacks(bare_copy, tiny_model_dir):
    (problem,) = tokenizer_problems(str(bare_copy))
    assert problem.startswith(f"model.path = {str(bare_copy)!r}: no tokenizer files in {bare_copy} (it holds config.json, "
                              "model.safetensors); it lacks tokenizer.json")
    assert tokenizer_problems(str(tiny_model_dir)) == [] and tokenizer_problems("tiny:arith") == []


def test_validation_refuses_it_before_anything_loads(bare_copy, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no model may load")

    monkeypatch.setattr("cohort.models.pretrained.load_policy", refuse)
    cfg = load_config(None, [f"model.path={bare_copy}", "rollout.max_completion_length=16"])
    with pytest.raises(ConfigError) as err:
        validate_config(cfg)
    assert [p for p in err.value.problems if "tokenizer" in p] == tokenizer_problems(str(bare_copy))


def test_a_tokenizer_that_encodes_text_to_nothing_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "empty-vocab")

    class EncodesNothing:  # what transformers builds from a tokenizer.json whose vocabulary was lost
        def __call__(self, text, add_special_tokens=True):
            return {"input_ids": []}

    monkeypatch.setattr("cohort.models.pretrained.load_tokenizer", lambda path, *args: EncodesNothing())
    (problem,) = tokenizer_problems(str(copy))
    assert f"the tokenizer in {copy} encodes 'Hello world: 12 + 30 = 42.' to no tokens" in problem

"""Bad input fails before training with a clear message (or is handled as documented in docs/runs.md).

Each case goes through `cohort train` (exit status 2 and a message on stderr)
or through the part that handles it, and checks that no model was trained:
no metrics.jsonl is written.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cohort import cli
from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.data.datasets import DataError, PromptDataset
from cohort.models.pretrained import load_tokenizer
from cohort.prompts import PromptRenderer


def train_args(model_dir, data, run_dir, *extra):
    return ["train", f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.name=hf",
            "rollout.num_generations=2", "rollout.max_completion_length=4", "train.prompts_per_step=2", "train.micro_batch_size=4",
            "train.max_steps=2", "rewards=[{name: numeric_match}]", f"run.output_dir={run_dir}", "run.progress=false", *extra]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def fails_before_training(capsys, args, run_dir) -> str:
    assert cli.main(args) == 2
    assert not (run_dir / "metrics.jsonl").exists()
    return capsys.readouterr().err


def test_empty_prompt_names_file_and_line(tmp_path, tiny_model_dir, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"},
                                                  {"prompt": "   ", "answer": "0"}])
    err = fails_before_training(capsys, train_args(tiny_model_dir, data, tmp_path / "run"), tmp_path / "run")
    assert f"{data}:3: column 'prompt' is empty" in err


def test_unwritable_output_dir(tmp_path, tiny_model_dir, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    # /proc accepts no new directories, even from root (a chmod 555 directory would not stop root)
    err = fails_before_training(capsys, train_args(tiny_model_dir, data, "/proc/cohort-run"), tmp_path / "nothing")
    assert "run.output_dir = '/proc/cohort-run' is not writable" in err and "choose another run.output_dir" in err


def test_truncated_weights_fail_validation(tmp_path, tiny_model_dir, capsys, monkeypatch):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "model.safetensors").write_bytes(b"\x00" * 64)  # a file cut short: no header
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    import cohort.models.pretrained as loading

    monkeypatch.setattr(loading, "load_tokenizer", lambda *a: pytest.fail("loaded before validation"))
    err = fails_before_training(capsys, train_args(broken, data, tmp_path / "run"), tmp_path / "run")
    assert (f"model.path = '{broken}': model.safetensors has no valid safetensors header (truncated or not a safetensors "
            "file); re-save or re-download the checkpoint") in err


def test_weights_that_do_not_fit_the_config(tmp_path, tiny_model_dir, capsys):
    broken = tmp_path / "mismatched-model"
    shutil.copytree(tiny_model_dir, broken)
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 64  # the weights have 256
    (broken / "config.json").write_text(json.dumps(config))
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    err = fails_before_training(capsys, train_args(broken, data, tmp_path / "run"), tmp_path / "run")
    assert f"cannot load a causal LM from {broken}" in err


def test_chat_prompts_need_a_chat_template(tmp_path, tiny_model_dir, capsys):
    plain = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    config.pop("chat_template")
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    for extra in plain.glob("chat_template*"):
        extra.unlink()
    data = write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "1+1="}], "answer": "2"}])
    err = fails_before_training(capsys, train_args(plain, data, tmp_path / "run", "data.max_prompt_length=64"), tmp_path / "run")
    assert "prompts are chat messages but the tokenizer has no chat template" in err


# --------------------------------------------------------------------------- overlong prompts


@pytest.fixture(scope="module")
def char_tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)  # one token per ASCII character


def dataset(prompts):
    return PromptDataset([{"prompt": p} for p in prompts], "prompt", [f"train.jsonl:{i + 1}" for i in range(len(prompts))])


def test_overlong_prompts_are_filtered_and_counted(char_tokenizer):
    kept, ids, dropped = PromptRenderer(char_tokenizer, 5, "filter").encode_dataset(dataset(["12+3=", "123+45=", "1+1="]), "train")
    assert dropped == 1
    assert [r["prompt"] for r in kept.rows] == ["12+3=", "1+1="] and kept.sources == ["train.jsonl:1", "train.jsonl:3"]
    assert [len(i) for i in ids] == [5, 4]


def test_overlong_prompts_error_names_the_row(char_tokenizer):
    with pytest.raises(DataError) as err:
        PromptRenderer(char_tokenizer, 5, "error").encode_dataset(dataset(["12+3=", "123+45="]), "train")
    assert str(err.value) == ("train.jsonl:2: prompt has 7 tokens > data.max_prompt_length = 5; raise data.max_prompt_length, "
                              "or set data.overlong_prompts to filter or truncate_left")


def test_overlong_prompts_truncate_left_keeps_the_end(char_tokenizer):
    _, ids, dropped = PromptRenderer(char_tokenizer, 5, "truncate_left").encode_dataset(dataset(["123+45="]), "train")
    assert dropped == 0 and char_tokenizer.decode(ids[0]) == "3+45="


def test_all_prompts_overlong_is_an_error(char_tokenizer):
    with pytest.raises(DataError, match="every prompt is longer than data.max_prompt_length = 2; raise data.max_prompt_length"):
        PromptRenderer(char_tokenizer, 2, "filter").encode_dataset(dataset(["1+1=", "2+2="]), "train")


CALCULATOR = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic expression.",
                                               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                              "required": ["expression"]}}}
POSITIONS = "the model's max_position_embeddings − rollout.max_completion_length (128 − 64)"
POSITIONS_FIX = "lower rollout.max_completion_length (or use a model with more positions)"


def test_a_prompt_pushed_past_the_limit_by_the_tools_block_is_told_the_block_s_size_and_offered_in_prompt_false(
        tiny_chat_model_dir):
    # issue 60, defect 5 (tiny:tool_calc with the tools block rendered by default): the message blamed the completion
    # budget alone. The tools block's share is the prompt rendered with tools= less the same prompt rendered without.
    tok = load_tokenizer(tiny_chat_model_dir)
    chat = [{"role": "user", "content": "6*7="}]
    bare = len(PromptRenderer(tok, None, "filter").encode(chat))
    shown = len(PromptRenderer(tok, None, "filter", tools=[CALCULATOR]).encode(chat))
    block = shown - bare
    assert block > 50  # (the template's tools block: its preamble and the schema)
    rows = PromptDataset([{"prompt": chat}, {"prompt": chat + [{"role": "user", "content": "and 7*8?"}]}], "prompt",
                         ["train.jsonl:1", "train.jsonl:2"])

    def refusal(limit: int, overlong: str = "filter") -> str:
        renderer = PromptRenderer(tok, limit, overlong, limit_name=POSITIONS, fix=POSITIONS_FIX, tools=[CALCULATOR])
        with pytest.raises(DataError) as err:
            renderer.encode_dataset(rows, "train data")
        return str(err.value)

    # a limit the shortest prompt fits without its block: the block's size, then tools.in_prompt: false first
    assert refusal(bare + 1) == (
        f"train data: every prompt is longer than {POSITIONS} = {bare + 1}; the tools block rendered into each prompt "
        f"(tools.in_prompt) adds {block} tokens (the shortest prompt has {shown}, {bare} without it); set "
        f"tools.in_prompt: false (a checkpoint trained without a tools block), or {POSITIONS_FIX}")
    # one it does not fit even without: the block's size, and the budget's fix alone
    assert refusal(bare - 1).endswith(f"adds {block} tokens (the shortest prompt has {shown}, {bare} without it); "
                                      f"{POSITIONS_FIX}")
    # one row, refused by data.overlong_prompts=error
    assert refusal(bare + 1, "error") == (
        f"train.jsonl:1: prompt has {shown} tokens > {POSITIONS} = {bare + 1}; the tools block rendered into each prompt "
        f"(tools.in_prompt) adds {block} of them ({bare} without it); set tools.in_prompt: false (a checkpoint trained "
        f"without a tools block), or {POSITIONS_FIX}, or set data.overlong_prompts to filter or truncate_left")


@pytest.mark.slow
def test_the_filtered_count_is_reported_when_training_starts(tmp_path, tiny_model_dir, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)] +
                       [{"prompt": "1" * 40 + "+1=", "answer": "0"}])
    run_dir = tmp_path / "run"
    assert cli.main(train_args(tiny_model_dir, data, run_dir, "train.max_steps=1", "run.loggers=[jsonl]")) == 0
    assert "filtered 1 prompt(s) longer than data.max_prompt_length = 16" in capsys.readouterr().out


def test_no_limit_keeps_every_prompt(char_tokenizer):
    # data.max_prompt_length None on a model whose config states no positions: nothing to filter by
    kept, ids, dropped = PromptRenderer(char_tokenizer, None, "error").encode_dataset(dataset(["1" * 300, "1+1="]), "train")
    assert dropped == 0 and [len(i) for i in ids] == [300, 4]


# a prompt of 200 characters (200 tokens) cannot fit the random tiny model's 128 positions beside a 4-token completion:
# with data.max_prompt_length unset the limit is 128 − 4 = 124
TOO_LONG = {"prompt": "1" * 197 + "+1=", "answer": "0"}
LIMIT = "the model's max_position_embeddings − rollout.max_completion_length (128 − 4) = 124"


@pytest.fixture
def no_weights(monkeypatch):
    import cohort.trainer.build_parts as setup

    monkeypatch.setattr(setup, "load_policy", lambda *a, **k: pytest.fail("weights loaded before the prompts were checked"))


def test_a_prompt_the_model_cannot_hold_is_refused_before_loading(tmp_path, tiny_model_dir, capsys, no_weights):
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}, TOO_LONG])
    args = train_args(tiny_model_dir, data, tmp_path / "run", "data.max_prompt_length=null", "data.overlong_prompts=error")
    err = fails_before_training(capsys, args, tmp_path / "run")
    assert (f"{data}:2: prompt has 200 tokens > {LIMIT}; lower rollout.max_completion_length (or use a model with more "
            "positions), or set data.overlong_prompts to filter or truncate_left") in err
    # filtered by default, but not when it is the only prompt
    only = write_jsonl(tmp_path / "only.jsonl", [TOO_LONG])
    err = fails_before_training(capsys, train_args(tiny_model_dir, only, tmp_path / "run", "data.max_prompt_length=null"),
                                tmp_path / "run")
    assert f"train data: every prompt is longer than {LIMIT}; lower rollout.max_completion_length" in err


@pytest.mark.slow
def test_prompts_the_model_cannot_hold_are_filtered_by_default(tmp_path, tiny_model_dir, capsys):
    data = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)] + [TOO_LONG])
    run_dir = tmp_path / "run"
    args = train_args(tiny_model_dir, data, run_dir, "data.max_prompt_length=null", "train.max_steps=1", "run.loggers=[jsonl]")
    assert cli.main(args) == 0
    assert f"filtered 1 prompt(s) longer than {LIMIT}" in capsys.readouterr().out


def test_output_dir_problems_are_config_errors(tmp_path):
    from cohort.trainer.build_parts import _check_writable

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="is not writable"):
        _check_writable(blocker / "run")
    assert load_config(None, []).run.output_dir is None

"""The embedded tool task: its rows, and the warm start's transcripts equal what the tool loop appends token for token
(so the model is trained on exactly the tool turns it will see)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohort.config.resolve import load_config
from cohort.data.tasks import get_task
from cohort.models.pretrained import load_tokenizer
from cohort.models.tiny_recipes import TINY_RECIPES, chat_codec, tool_transcript
from cohort.tools.render import ToolRenderer
from cohort.plan.validate import validate_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tool_calc.yaml"


@pytest.mark.slow
def test_tool_calc_rows_and_fixed_eval_split():
    task, other = get_task("tool_calc", seed=0), get_task("tool_calc", seed=1)
    assert len(task.eval_rows) == 200 and len(task.train_rows) == 990 * 90 - 200  # a in 10..999, b in 10..99
    assert task.eval_rows == other.eval_rows and task.train_rows != other.train_rows
    row = task.eval_rows[0]
    a, b = row["prompt"][0]["content"].rstrip("=").split("*")
    assert row["answer"] == str(int(a) * int(b))
    assert not {r["prompt"][0]["content"] for r in task.eval_rows} & {r["prompt"][0]["content"] for r in task.train_rows}


def test_warm_start_transcript_is_the_tool_loops_rendering(tiny_chat_model_dir):
    tok = load_tokenizer(tiny_chat_model_dir)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    renderer = ToolRenderer(tok, [im_end])
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
    loop = enc(call) + [im_end] + renderer.tool_ids([("calculator", {"expression": "12*34"})], [("calculator", "408")]) + enc("408")
    assert enc(tool_transcript("12*34", "408")) == loop


def test_warm_start_forms_and_the_copy_check(tiny_chat_model_dir):
    """Every row is shown in both forms (bare answer with probability 1 - tool_fraction, whole transcript with
    tool_fraction, drawn per sample); the early-stop check's prompt is the transcript's tokens up to the answer, so
    prompt + answer is exactly the trained transcript."""
    recipe = TINY_RECIPES["tool_calc"]
    rows = get_task("tool_calc").train_rows[:3]
    (p_bare, bare), (p_tool, transcripts) = recipe.supervised_forms(rows)
    assert (p_bare, p_tool) == (1 - recipe.tool_fraction, recipe.tool_fraction) and bare == rows
    assert [t["prompt"] for t in transcripts] == [r["prompt"] for r in rows]
    assert [t["answer"] for t in transcripts] == [tool_transcript(r["prompt"][0]["content"][:-1], r["answer"]) for r in rows]
    codec = chat_codec(tiny_chat_model_dir)
    check = recipe.validation_codec(codec)
    for row, transcript in zip(rows, transcripts):
        assert check.encode_prompt(row["prompt"]) + codec.encode_answer(row["answer"]) == (
            codec.encode_prompt(row["prompt"]) + codec.encode_answer(transcript["answer"]))


def test_example_config_is_valid():
    validate_config(load_config(str(EXAMPLE), []), check_files=False)

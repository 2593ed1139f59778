"""The embedded tool task: its rows, and the warm start's transcripts equal what the tool loop appends token for token
(so the model is trained on exactly the tool turns it will see)."""

from __future__ import annotations

from pathlib import Path

from cohort.config import load_config
from cohort.data.tasks import get_task
from cohort.models.loading import load_tokenizer
from cohort.models.tiny import TINY_RECIPES, tool_transcript
from cohort.tools.render import ToolRenderer
from cohort.validation import validate_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tool_calc.yaml"


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
    recipe = TINY_RECIPES["tool_calc"]
    rows = recipe.supervised_rows(get_task("tool_calc").train_rows[:1000])
    share = sum("<tool_call>" in r["answer"] for r in rows) / len(rows)
    assert abs(share - recipe.tool_fraction) < 0.05  # 1000 Bernoulli(0.5) draws: std 0.016


def test_example_config_is_valid():
    validate_config(load_config(str(EXAMPLE), []), check_files=False)

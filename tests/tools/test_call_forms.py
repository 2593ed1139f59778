"""Tool calls as real models write them (cohort/tools/parsers.py): the template's tags, a fenced block, bare JSON.

The texts are what Qwen2.5-Coder-0.5B-Instruct writes for a calculator task (its first calls are right but untagged:
a ```json block, or the object bare), and the template's own form. Pure logic: no model."""

from __future__ import annotations

from collections import Counter

import pytest

from cohort.tools.episode import Episode
from cohort.tools.parsers import ToolCall, call_forms, get_parser, parse_hermes, parse_json, written_calls

FENCED = 'To find it I use the calculator.\n```json\n{"name": "calculator", "arguments": {"expression": "123*45"}}\n```'
BARE = '{"name": "calculator", "arguments": {"expression": "123*45"}}'
TAGGED = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "123*45"}}\n</tool_call>'
CALL = ToolCall("calculator", {"expression": "123*45"})


@pytest.mark.parametrize("text, form", [(FENCED, "fenced"), (BARE, "bare"), (TAGGED, "tagged")])
def test_each_form_is_counted_and_read_by_the_json_parser(text, form):
    assert call_forms(text) == Counter({form: 1})
    parsed = parse_json(text)
    assert parsed.calls == [CALL] and parsed.errors == []


def test_hermes_reads_only_the_tagged_form_so_the_loop_can_count_what_it_ignored():
    assert parse_hermes(FENCED).calls == [] and not parse_hermes(FENCED).wants_tools
    assert parse_hermes(BARE).calls == [] and parse_hermes(TAGGED).calls == [CALL]


def test_the_content_is_the_text_without_its_calls():
    # the fenced block goes whole (its ``` lines too); the prose before it stays
    assert parse_json(FENCED).content == "To find it I use the calculator."
    assert parse_json("Let me compute. " + BARE + " Done.").content == "Let me compute.  Done."
    assert parse_json("The product is 5535.").content == "The product is 5535." and not parse_json("5535").wants_tools


def test_several_calls_in_one_turn_in_mixed_forms_in_order():
    text = (TAGGED + "\nand\n" + '{"name": "add", "parameters": {"a": 1, "b": 2}}'
            + '\n```\n{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}\n```')
    assert [c.form for c in written_calls(text)] == ["tagged", "bare", "fenced"]
    # "parameters" is Llama 3's spelling of "arguments"; arguments as a JSON string are decoded (OpenAI's wire form)
    assert parse_json(text).calls == [CALL, ToolCall("add", {"a": 1, "b": 2}), ToolCall("calculator", {"expression": "2+2"})]


def test_json_that_is_not_a_call_is_neither_a_call_nor_counted():
    # an answer that happens to be JSON, a nested object inside a call (counted once, as the outer call)
    text = 'The result: {"answer": 5535} and {"name": "x"} and {"name": "f", "arguments": {"inner": {"name": "g", "arguments": {}}}}'
    assert [c.payload["name"] for c in written_calls(text)] == ["f"]
    assert parse_json('{"answer": 5535}').calls == [] and call_forms('{"answer": 5535}') == Counter()


def test_a_tagged_block_that_is_not_json_is_a_tagged_call_and_a_parse_error():
    text = "<tool_call>\ncalculator(123*45)\n</tool_call>"
    assert call_forms(text) == Counter({"tagged": 1})
    parsed = parse_json(text)
    assert parsed.calls == [] and len(parsed.errors) == 1 and "not valid JSON" in parsed.errors[0]


def test_the_json_parser_is_registered_by_name():
    assert get_parser("json") is parse_json


def test_episode_metrics_count_forms_share_and_ignored_calls():
    # two episodes: one wrote a fenced and a bare call that hermes ignored (2 ignored), one wrote a tagged call
    ignored = Episode(call_forms=Counter({"fenced": 1, "bare": 1}), ignored_calls=2)
    tagged = Episode(call_forms=Counter({"tagged": 1}))
    metrics = Episode.batch_metrics([ignored, tagged])
    assert metrics["tools/call_forms/tagged"] == 1.0 and metrics["tools/call_forms/fenced"] == 1.0
    assert metrics["tools/call_forms/bare"] == 1.0
    assert metrics["tools/tagged_share"] == pytest.approx(1 / 3)  # 1 tagged of 3 written
    assert metrics["tools/ignored_calls"] == 2.0
    assert ignored.completion_fields()["call_forms"] == {"fenced": 1, "bare": 1}
    assert ignored.completion_fields()["ignored_calls"] == 2 and "ignored_calls" not in tagged.completion_fields()
    assert Episode.from_state(ignored.to_state()).call_forms == Counter({"fenced": 1, "bare": 1})


def test_a_call_cut_off_by_the_budget_is_a_failed_call_not_an_answer():
    # what Qwen2.5-Coder-0.5B wrote after 6 steps of examples/qwen_tool_calc.yaml (2026-12-08), greedy on held-out
    # 897*37: a third call repeating the tool's result, cut by the 128-token budget. Read as prose, its "33189" was the
    # final answer: the reward and tools/used_result counted it right (78% of held-out prompts "answered"; with 160
    # tokens the same checkpoint, calling a fourth time, scored 0%). It is a call that breaks off: an error, no content.
    cut = '{\n  "name": "calculator",\n  "arguments": {\n    "expression": "33189"\n'
    parsed = parse_json(cut)
    assert parsed.calls == [] and parsed.content == "" and parsed.wants_tools
    assert parsed.errors == ["the tool call is not valid JSON (it breaks off): " + repr(cut)]
    fenced = '```json\n{"name": "calculator", "arguments": {"expression": "3'  # in an unclosed ``` block: cut whole
    assert parse_json(fenced).content == "" and len(parse_json(fenced).errors) == 1
    # after a whole call, prose stays; only the broken-off second call goes
    both = 'Computing. {"name": "calculator", "arguments": {"expression": "2*3"}} then {"name": "calc'
    parsed = parse_json(both)
    assert parsed.calls == [ToolCall("calculator", {"expression": "2*3"})] and parsed.content == "Computing.  then"
    assert len(parsed.errors) == 1
    # an answer that merely mentions braces or names is not a call
    assert not parse_json('The answer is 33189 ({"value": 33189}).').wants_tools

"""Parsers, schemas, the chat template's prefix-preserving check, config validation of the tool fields, and the
rewards' optional `conversations` / `environments` arguments."""

from __future__ import annotations


import pytest

from cohort.config import ConfigError
from cohort.config.resolve import load_config
from cohort.models.pretrained import load_tokenizer
from cohort.rewards import RewardSet
from cohort.tools.parsers import ToolCall, get_parser, parse_compact, parse_hermes
from cohort.tools.render import ToolRenderer, ToolTemplateError
from cohort.tools.tool_schemas import resolve_tools
from cohort.connectors import resolve_environment
from cohort.plan.validate import validate_config


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


def test_hermes_parses_calls_and_reports_malformed_ones():
    text = ('I will compute.<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call><tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "x", "arguments": {"a": 1,}}</tool_call><tool_call>{"name": "y"')
    parsed = parse_hermes(text)
    assert parsed.calls == [ToolCall("multiply", {"a": 3, "b": 4}), ToolCall("add", {"a": 1})]
    assert len(parsed.errors) == 3
    assert "string \"name\"" in parsed.errors[0] and "not valid JSON" in parsed.errors[1] and "not closed" in parsed.errors[2]
    assert not parse_hermes("The answer is 12.").wants_tools


def test_compact_parses_positional_and_named_arguments():
    parsed = parse_compact("<<multiply(12, b=34)>> and <<lookup(paris)>> <<bad(1")
    assert parsed.calls == [ToolCall("multiply", {"0": 12, "b": 34}), ToolCall("lookup", {"0": "paris"})]
    assert parsed.errors == ["the call <<bad(...) is not closed with >>"]


def test_unknown_parser_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"not a parser; choose one of \['compact', 'hermes', 'json'\]"):
        get_parser("qwen")


def test_schema_is_transformers_get_json_schema():
    (tool,) = resolve_tools([multiply])
    assert tool.schema == {"type": "function", "function": {
        "name": "multiply", "description": "Multiply two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer", "description": "the first factor"},
                                                        "b": {"type": "integer", "description": "the second factor"}},
                       "required": ["a", "b"]},
        "return": {"type": "integer"}}}

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="tool 'undocumented': no JSON schema"):
        resolve_tools([undocumented])


class Counter:
    def reset(self, start: int = 0, **row):
        self.value = start
        return f"counter at {start}"

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: how much
        """
        self.value += by
        return self.value

    def _private(self):
        pass


def test_environment_public_methods_are_its_tools():
    assert resolve_environment(Counter) is Counter
    from cohort.tools.tool_schemas import environment_tools
    assert [t.name for t in environment_tools(Counter())] == ["increment"]


def test_prefix_check_accepts_the_tiny_chat_template_and_refuses_one_that_is_not_prefix_preserving(tiny_chat_model_dir):
    tok = load_tokenizer(tiny_chat_model_dir)
    stops = [tok.convert_tokens_to_ids("<|im_end|>")]
    ToolRenderer(tok, stops).check()  # the Qwen2.5-style template passes
    # a template that closes a turn with <|im_end|> only when another turn follows: the generation prompt follows
    # "Hi" directly, but once the assistant turn is rendered "Hi<|im_end|>\n" precedes it, so what the model was
    # given is not a prefix of the conversation the tool turn extends
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}{% if not loop.last %}<|im_end|>\n"
                         "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    with pytest.raises(ToolTemplateError, match="not prefix-preserving"):
        ToolRenderer(tok, stops).check()
    tok.chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"  # no stop token at all
    with pytest.raises(ToolTemplateError, match="contains none of the model's stop tokens"):
        ToolRenderer(tok, stops).check()


def test_tool_fields_are_validated_before_any_model_loads(tmp_path):
    cfg = load_config(None, ["tools.functions=[no_such_module.multiply]", "tools.parser=qwen", "tools.max_turns=0",
                             "tools.environment=json.dumps"])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg, check_files=False)
    text = str(info.value)
    assert "tools.functions[0] 'no_such_module.multiply': no module 'no_such_module' can be imported here" in text
    assert "tools.parser = 'qwen' is not a parser" in text
    assert "tools.max_turns = 0 must be >= 1" in text
    assert "tools.environment = 'json.dumps' is a function, not a class" in text


def test_config_with_callables_saves_their_import_paths():
    cfg = load_config(None, [])
    cfg.tools.functions = [multiply, "cohort.tools.builtin.python"]
    validate_config(cfg, check_files=False)
    assert cfg.to_dict()["tools"]["functions"] == [f"{__name__}:multiply", "cohort.tools.builtin.python"]


def test_rewards_get_conversations_and_environments_only_when_they_name_them():
    seen = {}

    def wants(completions, conversations, environments, **kwargs):
        seen["wants"] = (conversations, environments)
        return [1.0] * len(completions)

    def plain(completions, **kwargs):
        seen["plain"] = sorted(kwargs)
        return [0.0] * len(completions)

    with RewardSet.from_specs([wants, plain]) as rewards:
        env = object()
        rewards.score(prompts=["p"], completions=["c"], completion_ids=[[1]], columns={"answer": ["4"]},
                      optional={"conversations": [[{"role": "tool", "content": "4"}]], "environments": [env]})
    assert seen["wants"] == ([[{"role": "tool", "content": "4"}]], [env])
    assert seen["plain"] == ["answer", "completion_ids", "prompts"]


def test_python_tool_runs_in_the_sandbox_and_returns_what_was_printed():
    from cohort.tools.builtin import python

    assert python("print(sum(range(10)))\nprint(12 * 34)") == "45\n408\n"  # 0+1+...+9 = 45
    assert python("1 / 0") == "error: ZeroDivisionError: division by zero"
    # confined: no network inside the sandbox (its network namespace has only a down loopback)
    assert "OSError" in python("import socket\nsocket.create_connection(('8.8.8.8', 53), timeout=1)")
    assert python("print('x' * 1000)") == "x" * 279 + "\n"  # the last 280 characters, print's newline included


def test_calculator_evaluates_arithmetic_and_refuses_anything_else():
    from cohort.tools.builtin import calculator

    assert calculator("123*45") == "5535" and calculator("(7+3)/4") == "2.5" and calculator("8/4") == "2"
    assert calculator("-2**3 % 5") == "2"  # -(2**3) = -8; -8 % 5 = 2 in Python
    for bad in ("__import__('os').system('true')", "2**1000", "x + 1", "1 +"):
        with pytest.raises(ValueError):
            calculator(bad)
    assert resolve_tools([calculator])[0].schema["function"]["parameters"]["required"] == ["expression"]


def test_an_environment_s_engine_has_the_model_s_room_for_its_first_observation():
    # tiny:arith has 128 positions (its recipe). A 10-token prompt and 8 completion tokens need 10 + 8 + 1 = 19; an
    # environment's reset appends its observation to the prompt after encoding, so its run gets all 128 (as agents do).
    from cohort.trainer.build_engine import engine_length

    base = ["model.path=tiny:arith", "rollout.max_completion_length=8"]
    assert engine_length(load_config(overrides=base), "tiny:arith", [[1] * 10, [1] * 4]) == 19
    with_env = load_config(overrides=[*base, "tools.environment=tests.tools.test_tool_setup.Counter"])
    assert engine_length(with_env, "tiny:arith", [[1] * 10]) == 128

"""Registry: built-ins, import paths, option checks, the built-in table."""

import asyncio
import sys
import textwrap

import pytest

import cohort.rewards as rewards
from cohort.rewards.reward_registry import REQUIRED


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def length_reward(completions, scale=1.0, **kwargs):
                return [scale * len(c) for c in completions]

            async def async_reward(completions, **kwargs):
                return [1.0 for _ in completions]

            def strict_reward(completions, prompts, completion_ids):
                return [0.0 for _ in completions]

            class Configured:
                def __init__(self, bonus):
                    self.bonus = bonus

                def __call__(self, completions, **kwargs):
                    return [self.bonus for _ in completions]

            NOT_CALLABLE = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_rewards"
    sys.modules.pop("my_rewards", None)


def test_builtin_names_are_the_contract():
    expected = {
        "accuracy",
        "reasoning_accuracy",
        "think_format",
        "soft_overlong",
        "numeric_match",
        "code_tests",
        "reward_model",
        "remote",
    }
    assert expected <= set(rewards.builtin_names())


def test_unknown_name_lists_builtins_and_import_form():
    with pytest.raises(ValueError) as info:
        rewards.resolve("numeric_mach")
    message = str(info.value)
    assert "numeric_match" in message and "accuracy" in message
    assert "my_module.my_reward" in message and "my_module:my_reward" in message


def test_resolve_does_not_build(monkeypatch):
    from cohort.rewards import reward_registry as registry

    calls = []

    def factory(*, gold_column=None):
        calls.append(gold_column)

    monkeypatch.setitem(registry._FACTORIES, "numeric_match", factory)
    resolved = rewards.resolve("numeric_match", {"gold_column": "x"})
    assert resolved.kind == "builtin" and calls == []


def test_resolve_checks_options():
    with pytest.raises(ValueError, match="no option"):
        rewards.resolve("soft_overlong", {"max_len": 3})
    with pytest.raises(ValueError, match="needs the option"):
        rewards.resolve("soft_overlong", {"max_completion_length": 3})
    rewards.resolve("soft_overlong", {"max_completion_length": 3, "cache_length": 1})


def test_import_paths(user_module):
    for name in (f"{user_module}.length_reward", f"{user_module}:length_reward"):
        resolved = rewards.resolve(name)
        assert resolved.kind == "function" and resolved.display_name == "length_reward"
    plain = rewards.get(f"{user_module}:length_reward")
    assert plain(completions=["ab"]) == [2.0]
    scaled = rewards.get(f"{user_module}.length_reward", scale=10.0)  # options forwarded per call
    assert scaled(completions=["ab"], prompts=["p"]) == [20.0]
    bound_async = rewards.get(f"{user_module}.async_reward", extra=1)
    assert asyncio.iscoroutinefunction(bound_async)
    assert asyncio.run(bound_async(completions=["a"])) == [1.0]
    configured = rewards.get(f"{user_module}:Configured", bonus=0.5)  # class: built once
    assert configured(completions=["a", "b"]) == [0.5, 0.5]


def test_import_path_errors(user_module):
    with pytest.raises(ValueError, match="has no attribute"):
        rewards.resolve(f"{user_module}.missing")
    with pytest.raises(ValueError, match="no module 'no_such_module_xyz' can be imported here"):
        rewards.resolve("no_such_module_xyz.reward")
    with pytest.raises(ValueError, match="not callable"):
        rewards.resolve(f"{user_module}.NOT_CALLABLE")
    with pytest.raises(ValueError, match="no option"):
        rewards.get(f"{user_module}.strict_reward", scale=2)  # no **kwargs to take it
    with pytest.raises(ValueError, match="no option"):
        rewards.get(f"{user_module}:Configured", bonus=1, malus=2)


def test_register_twice_fails():
    with pytest.raises(ValueError, match="already registered"):
        rewards.register("numeric_match")(lambda: None)


def test_builtin_options_cannot_shadow_spec_keys():
    def factory(*, timeout_s=1.0):
        return None

    with pytest.raises(ValueError, match="timeout_s"):
        rewards.register("shadowing_reward_for_test")(factory)


def test_describe_and_format_builtins():
    rows = {row.name: row for row in rewards.describe_builtins()}
    name, options, doc = rows["soft_overlong"]  # unpacks as a 3-tuple
    assert options == {"max_completion_length": REQUIRED, "cache_length": REQUIRED}
    assert "DAPO" in doc
    assert rows["numeric_match"].options["position"] == "last"
    table = rewards.format_builtins()
    for row in rows.values():
        assert row.name in table
    assert "max_completion_length (required)" in table


def test_resolving_and_listing_import_nothing_heavy():
    import subprocess

    code = (
        "import sys, cohort.rewards as r\n"
        "for name in r.builtin_names(): r.resolve(name)\n"
        "r.resolve('code_tests', {'run_timeout_s': 1}); r.format_builtins()\n"
        "heavy = [m for m in ('torch', 'transformers', 'math_verify', 'sympy') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"

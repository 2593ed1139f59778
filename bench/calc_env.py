"""The tool task of bench/qwen_tool_trl.py, written once for both trainers: a TRL `environment_factory` class and a
reward function in the shape TRL's docs give them, imported unchanged by TRL's `GRPOTrainer(environment_factory=...)`
and by cohort's `tools.environment` (no cohort import here: bench/.trl-venv runs it too).

`CalcEnv`: one calculator per trajectory; `reset(**row)` starts it (no first observation: the question is the row's
prompt); `calculator(expression)` is the tool. `last_number_reward`: 1.0 when the last number of the final assistant
message is the row's answer. Both trainers hand a chat trajectory's completion over as messages (TRL's shape: the
assistant turns, the tool turns), so the reward reads the last assistant message, never a tool's output.
"""

from __future__ import annotations

import ast
import operator
import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
             ast.USub: operator.neg}


def _value(node):
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only numbers with + - * / and parentheses")


class CalcEnv:
    def __init__(self):
        self.calls = 0

    def reset(self, **kwargs) -> str | None:
        self.calls = 0
        return None

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression such as 123*45.

        Args:
            expression: numbers with + - * / and parentheses
        """
        self.calls += 1
        value = _value(ast.parse(expression.strip(), mode="eval").body)
        return str(int(value) if isinstance(value, float) and value.is_integer() else value)


def _final_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    replies = [m for m in completion if m.get("role") == "assistant"]
    return str(replies[-1].get("content") or "") if replies else ""


def last_number_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the final answer's last number is the row's answer, else 0.0."""
    scores = []
    for completion, gold in zip(completions, answer):
        numbers = NUMBER.findall(_final_text(completion))
        scores.append(float(bool(numbers) and float(numbers[-1]) == float(gold)))
    return scores

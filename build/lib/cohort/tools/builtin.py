"""Built-in tools: `python` runs model-written code in the reward sandbox (cohort/rewards/sandbox.py), never
unconfined; `calculator` evaluates an arithmetic expression (no code runs: the expression is parsed, and only numbers,
+ - * / // % ** and parentheses are evaluated).

    tools:
      functions: [cohort.tools.builtin.python, cohort.tools.builtin.calculator]

Each call is a fresh sandboxed process (no network, private /tmp, CPU/memory/process limits, everything it started
killed afterwards; see the sandbox's docstring for the isolation modes). What the model gets back is what the code
printed, or the exception it raised. The sandbox's result channel carries at most 300 characters per message, so
the output returned is the last `OUTPUT_CHARS` characters of what was printed (the end, where results usually are).

Left out: state kept between calls (each call starts from nothing, as a fresh interpreter); a sandbox that cannot
isolate on this machine raises `SandboxUnavailable` on the first call (the call's tool status: error).
"""

from __future__ import annotations

import ast
import operator
import threading

from cohort.rewards.sandbox import Sandbox, SandboxLimits

OUTPUT_CHARS = 280
TIMEOUT_S = 5.0
_sandbox: Sandbox | None = None
_lock = threading.Lock()

_WRAPPER = """import contextlib as _cl, io as _io
_out = _io.StringIO()
with _cl.redirect_stdout(_out):
    exec(compile({code!r}, "<python tool>", "exec"), {{"__name__": "__main__"}})
"""
_REPORT = "raise Exception(_out.getvalue()[-{n}:])".format(n=OUTPUT_CHARS)  # the output rides on the test's error message


def _shared_sandbox() -> Sandbox:
    global _sandbox
    with _lock:
        if _sandbox is None:
            _sandbox = Sandbox(SandboxLimits(timeout_s=TIMEOUT_S))
        return _sandbox


def python(code: str) -> str:
    """Run Python code in a sandbox and return what it printed (the last 280 characters).

    Args:
        code: a Python program; use print() to show results
    """
    result = _shared_sandbox().run(_WRAPPER.format(code=code), tests=[_REPORT])
    if result.sandbox_error:
        raise RuntimeError(f"the sandbox failed: {result.sandbox_error}")
    if result.timed_out:
        return f"error: the code ran past {TIMEOUT_S:g} s"
    if result.setup_error:  # the program raised: "code: NameError: ..."
        return "error: " + result.setup_error.split(": ", 1)[-1]
    error = result.errors[0] or ""
    return error[len("Exception: "):] if error.startswith("Exception: ") else error


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
              ast.USub: operator.neg, ast.UAdd: operator.pos}
MAX_EXPONENT = 100  # 9**100 is already 96 digits; larger powers are refused rather than computed


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 123*45 or (7+3)/4.

    Args:
        expression: numbers with + - * / // % ** and parentheses
    """
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {ast.dump(node)[:40]}")


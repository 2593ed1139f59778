"""``code_tests``: run the completion's code against the row's tests, in the sandbox.

Choices:
- The code is the last fenced block labelled ``python`` or ``py`` (any case); else
  the last unlabelled fenced block; else the whole completion.
- The tests column (default ``tests``) holds, per row, either a list of statements,
  each one test (MBPP's ``test_list``: ``["assert f(1) == 2", ...]``), or one string of
  test code, split at its top-level ``assert`` statements: each test is an assert
  with the statements just before it; statements after the last assert form a final
  test; a string with no top-level assert (``check(f)``, HumanEval style) is one test.
- Score = tests passed / tests. Code that fails to run scores 0.0; a timeout keeps
  the tests reported before it. No tests, or tests that are not valid Python: None.
- The program runs with ``__name__ == "__sandbox__"``, so ``if __name__ ==
  "__main__":`` demo blocks do not run; stdin is empty and prints go nowhere.
- Executions run concurrently, ``max_parallel`` at a time (default: twice the CPUs;
  a sleeping or blocked program holds a slot but little CPU). The function is sync;
  the RewardSet runs it on a thread, and each execution is its own process.
- A failure of the sandbox itself (not of the code) raises, naming the row, so the
  RewardSet's failure policy applies.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
from collections.abc import Sequence
from typing import Any

from cohort.rewards.reward_registry import Needs, register
from cohort.rewards.calling import RewardRowError
from cohort.rewards.sandbox import ExecutionResult, Sandbox, SandboxLimits
from cohort.rewards.text import completion_texts

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The program in a completion (see the module docstring)."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    python = [body for label, body in blocks if label in ("python", "py", "python3")]
    if python:
        return python[-1]
    unlabelled = [body for label, body in blocks if not label]
    return unlabelled[-1] if unlabelled else text


def split_tests(tests: Any) -> list[str] | None:
    """A row's tests as a list of test sources, or None when there are none / unparseable."""
    if tests is None:
        return None
    if isinstance(tests, str):
        try:
            statements = ast.parse(tests).body
        except SyntaxError:
            return None
        chunks, pending = [], []
        for statement in statements:
            pending.append(ast.unparse(statement))
            if isinstance(statement, ast.Assert):
                chunks.append("\n".join(pending))
                pending = []
        if pending:
            chunks.append("\n".join(pending))
        return chunks or None
    if isinstance(tests, Sequence) or hasattr(tests, "tolist"):
        items = list(tests.tolist() if hasattr(tests, "tolist") else tests)
        if not items or not all(isinstance(t, str) for t in items):
            return None
        for test in items:
            try:
                ast.parse(test)
            except SyntaxError:
                return None
        return items
    return None


class CodeTests:
    __name__ = "code_tests"

    def __init__(self, tests_column: str, setup_column: str | None, sandbox: Sandbox, max_parallel: int):
        self.tests_column = tests_column
        self.setup_column = setup_column
        self.sandbox = sandbox
        self.max_parallel = max_parallel
        self._pool = concurrent.futures.ThreadPoolExecutor(max_parallel, thread_name_prefix="cohort-code-tests")

    def _columns(self, columns: dict[str, Any], n: int) -> tuple[list[Any], list[str]]:
        if self.tests_column not in columns:
            available = sorted(k for k in columns if k not in ("prompts", "completion_ids"))
            raise KeyError(
                f"code_tests needs the tests column {self.tests_column!r}; the batch has {available}; "
                f"set the option tests_column"
            )
        setups = columns.get(self.setup_column) if self.setup_column else None
        return list(columns[self.tests_column]), [s or "" for s in setups] if setups else [""] * n

    def __call__(self, *, completions: list[Any], **columns: Any) -> list[float | None]:
        tests_per_row, setups = self._columns(columns, len(completions))
        rewards: list[float | None] = [None] * len(completions)
        futures = {}
        for i, (text, tests, setup) in enumerate(zip(completion_texts(completions), tests_per_row, setups)):
            split = split_tests(tests)
            if split is not None:
                futures[self._pool.submit(self.sandbox.run, extract_code(text), split, setup)] = i
        for future in concurrent.futures.as_completed(futures):
            i = futures[future]
            try:
                result: ExecutionResult = future.result()
            except Exception as exc:  # noqa: BLE001 - re-raised with the row
                raise RewardRowError(i, f"sandbox failed: {type(exc).__name__}: {exc}") from exc
            if result.sandbox_error:
                raise RewardRowError(i, f"sandbox failed: {result.sandbox_error}")
            rewards[i] = result.score
        return rewards

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@register("code_tests", needs=[Needs("the tests", "tests_column", ("tests",)), Needs("the setup code", "setup_column", ())])
def code_tests(
    *,
    tests_column: str = "tests",
    setup_column: str | None = None,
    run_timeout_s: float = 10.0,
    memory_mb: int = 1024,
    max_processes: int = 32,
    max_parallel: int | None = None,
    isolation: str = "auto",
    allow_unisolated: bool = False,
    python: str | None = None,
) -> CodeTests:
    """Fraction of the row's tests the completion's code passes, run in a sandbox; None without tests.

    Code: the last ```python block, else the whole text. Tests (column `tests`): a list
    of assert statements (MBPP's test_list) or one string of test code. Each completion
    runs in a fresh process with no network, an empty environment, a throwaway uid,
    and limits on time, memory, processes and file size (see docs/rewards.md).
    """
    limits = SandboxLimits(timeout_s=run_timeout_s, memory_mb=memory_mb, max_processes=max_processes)
    sandbox = Sandbox(limits, isolation=isolation, allow_unisolated=allow_unisolated, python=python)
    return CodeTests(tests_column, setup_column, sandbox, max_parallel or 2 * (os.cpu_count() or 1))

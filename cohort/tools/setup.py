"""From the config to a tool loop: the wrapping of a built engine in a `ToolEngine` (cohort/trainer/setup.py calls
`wrap_engine` when tools.functions or tools.environment is set; the config's checks are in cohort/tools/checks.py).

`rows_by_prompt` maps a request's prompt token ids to its dataset row, which `reset(**row)` of an environment gets:
the tool loop sees requests, not rows. Rows whose prompts tokenize identically get the first such row's columns.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from cohort.rollout.base import Request
from cohort.tools.loop import ToolEngine
from cohort.tools.parsers import get_parser
from cohort.tools.schema import resolve_environment, resolve_tools


def rows_by_prompt(prompt_ids: Sequence[Sequence[int]], rows: Sequence[dict[str, Any]]) -> Callable[[Request], dict[str, Any]]:
    """A request -> its dataset row (by its prompt token ids; {} for a prompt not in the data)."""
    index: dict[tuple[int, ...], dict[str, Any]] = {}
    for ids, row in zip(prompt_ids, rows):
        index.setdefault(tuple(ids), row)
    return lambda request: dict(index.get(tuple(request.prompt_ids), {}))


def wrap_engine(tools, engine, tokenizer, rows: Callable[[Request], dict[str, Any]] | None = None) -> ToolEngine:
    """`engine` inside the tool loop the tools section describes (the chat template is checked here)."""
    return ToolEngine(engine, tokenizer, parser=get_parser(tools.parser), tools=resolve_tools(tools.functions),
                      environment=resolve_environment(tools.environment), rows=rows, max_turns=tools.max_turns,
                      max_parallel_calls=tools.max_parallel_calls, tool_timeout_s=tools.timeout_s,
                      max_tool_response_length=tools.max_response_length,
                      truncate_side=tools.response_truncate_side, failure_policy=tools.failure_policy)

"""The checks of the rollout section's tool fields that `validate_config` runs before any model loads: ranges, that
every tool resolves and has a schema, that the environment is a class with tools, that the parser exists.

Imports only the schema and parser modules (no engine), so `cohort.validation` stays free of cohort.rollout.
"""

from __future__ import annotations

from cohort.tools.parsers import get_parser
from cohort.tools.schema import resolve_environment, resolve_tools


def tool_problems(rollout) -> list[str]:
    """Every problem with the rollout section's tool fields, each naming its field and a fix ([] when fine)."""
    problems = []
    for field, value, low in (("tool_timeout_s", rollout.tool_timeout_s, 0), ("max_turns", rollout.max_turns, 1),
                              ("max_parallel_calls", rollout.max_parallel_calls, 1)):
        if not value >= low or (field == "tool_timeout_s" and value == 0):
            problems.append(f"rollout.{field} = {value} must be {'> 0' if low == 0 else '>= 1'}")
    if rollout.max_tool_response_length is not None and rollout.max_tool_response_length < 1:
        problems.append(f"rollout.max_tool_response_length = {rollout.max_tool_response_length} must be >= 1 (or null: no limit)")
    if not rollout.uses_tools:
        return problems
    for check in (lambda: resolve_tools(rollout.tools), lambda: resolve_environment(rollout.environment),
                  lambda: get_parser(rollout.tool_parser)):
        try:
            check()
        except ValueError as exc:
            problems.append(str(exc))
    return problems

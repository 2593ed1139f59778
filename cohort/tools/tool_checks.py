"""The checks of the tools section that `validate_config` runs before any model loads: ranges, that
every tool resolves and has a schema, that the environment is a class with tools, that the parser exists. What it
resolves it keeps in the `ToolResolution` it is given (the run's: nothing is resolved twice).

Imports only the schema and parser modules (no engine), so `cohort.plan.validate` stays free of cohort.rollout.
"""

from __future__ import annotations

from cohort.tools.parsers import get_parser
from cohort.tools.tool_schemas import ToolResolution


def tool_problems(tools, resolution: ToolResolution | None = None) -> list[str]:
    """Every problem with the tools section's fields, each naming its field and a fix ([] when fine). `resolution`:
    the run's (cohort/plan/run_environment.py), which keeps what this check resolved for the rest of the run; default:
    one of its own."""
    resolution = resolution if resolution is not None else ToolResolution(tools)
    problems = []
    for field, value, low in (("timeout_s", tools.timeout_s, 0), ("max_turns", tools.max_turns, 1),
                              ("max_parallel_calls", tools.max_parallel_calls, 1)):
        if not value >= low or (field == "timeout_s" and value == 0):
            problems.append(f"tools.{field} = {value} must be {'> 0' if low == 0 else '>= 1'}")
    if tools.max_response_length is not None and tools.max_response_length < 1:
        problems.append(f"tools.max_response_length = {tools.max_response_length} must be >= 1 (or null: no limit)")
    if not tools.enabled:
        return problems
    for check in (resolution.functions, resolution.environment, lambda: get_parser(tools.parser)):
        try:
            check()
        except ValueError as exc:
            problems.append(str(exc))
    return problems

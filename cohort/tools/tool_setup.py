"""From the config to a tool loop: the wrapping of a built engine in a `ToolEngine` (cohort/trainer/build_parts.py calls
`wrap_engine` when tools.functions or tools.environment is set, with the run's `ToolResolution`: the functions, the
environment class and the shown schemas as validation resolved them; the config's checks are in
cohort/tools/tool_checks.py).

`rows_by_index` maps a request to its dataset row by the index the request carries (`Request.row`, set where the
requests are made from the sampler's prompts), which `reset(**row)` of an environment and an agent get: rows that
share a prompt and differ in another column (a `seed`, a `target`) each reach their own episode, as in TRL.
`run_rows` is the table those indices point into: the train rows, then the eval rows.
`prompt_with_observation` renders a row's prompt again with an environment's first observation appended (TRL's rule,
`cohort.rollout.base.with_observation`). (A served environment's capacity is checked before any weights load by its
connector: `RunEnvironment.before_load`, cohort/plan/run_environment.py.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from cohort.rollout.base import Request, with_observation
from cohort.tools.loop import ToolEngine
from cohort.tools.parsers import get_parser
from cohort.tools.tool_schemas import ToolResolution


def run_rows(train, evals=None) -> list[dict[str, Any]]:
    """The rows a request's `row` indexes: the train dataset's rows, then the eval dataset's (so eval row i is
    `len(train.rows) + i`)."""
    return list(train.rows) + (list(evals.rows) if evals is not None else [])


def rows_by_index(rows: Sequence[dict[str, Any]]) -> Callable[[Request], dict[str, Any]]:
    """A request -> a copy of its dataset row (`rows[request.row]`; {} for a request not from the data)."""
    return lambda request: dict(rows[request.row]) if request.row is not None else {}


def prompt_with_observation(encode: Callable[[Any], list[int]], prompt_key: str) -> Callable[[dict[str, Any], str], list[int]]:
    """(row, observation) -> token ids of the row's prompt with the observation appended (`encode`: the run's prompt
    renderer's)."""
    return lambda row, observation: encode(with_observation(row[prompt_key], observation))


def wrap_engine(tools, engine, tokenizer, rows: Callable[[Request], dict[str, Any]] | None = None, *,
                prompt_with: Callable[[dict[str, Any], str], list[int]] | None = None,
                max_model_len: int | None = None, resolution: ToolResolution | None = None) -> ToolEngine:
    """`engine` inside the tool loop the tools section describes (the chat template is checked here); `max_model_len`:
    the engine's context, which a prompt with reset's observation must stay under (or its episode fails);
    `resolution`: the run's resolved tools (cohort/plan/run_environment.py; default: resolved here)."""
    resolution = resolution if resolution is not None else ToolResolution(tools)
    return ToolEngine(engine, tokenizer, parser=get_parser(tools.parser), tools=resolution.functions(),
                      environment=resolution.environment(), rows=rows, max_turns=tools.max_turns,
                      max_parallel_calls=tools.max_parallel_calls, tool_timeout_s=tools.timeout_s,
                      max_tool_response_length=tools.max_response_length,
                      truncate_side=tools.response_truncate_side, failure_policy=tools.failure_policy,
                      prompt_with=prompt_with, max_model_len=max_model_len, schemas=resolution.shown())

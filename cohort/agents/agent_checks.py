"""The checks of the agent section that `validate_config` runs before any model loads: the range of agent.timeout_s,
that agent.function resolves to an `async def` taking (client, row), and every combination the agent path cannot run,
each naming the fields and the fix.

The one combination refused: tools.functions / tools.environment (the agent runs its own tool loop; cohort's would
wrap the endpoint's engine calls a second time).

Runs with a critic (algorithm.name = ppo), more than one optimizer step per generation batch, several training
processes, partial rollouts (pipeline.over_provision > 1) and `rewards` beside the agent's or the environment's
reward (composed in cohort/plan/run_rewards.py; an environment's failed episode is scored by none of them,
`AgentRun.failed`) are not refused: a run's calls are rows of the batch before anything is scored
(cohort/trainer/agent_samples.py), and under several processes the agent endpoint runs beside rank 0's engine
(cohort/trainer/build_parts.py), every rank receiving the finished runs; a run cut off at a batch's end starts over
in a later batch (`AgentRun.resumable` is False, cohort/rollout/partial.py), since its program died with the cut.

Imports no engine (cohort.plan.validate stays free of cohort.rollout).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

from cohort.config import CohortConfig
from cohort.tools.tool_schemas import import_object


def resolve_agent(spec):
    """The agent function of agent.function (an import path or the function); ValueError when it is not an
    `async def` taking (client, row)."""
    function = (_from_file(spec) if isinstance(spec, str) and ".py:" in spec
                else import_object(spec, "agent.function") if isinstance(spec, str) else spec)
    if not inspect.iscoroutinefunction(function):
        raise ValueError(f"agent.function {spec!r} must be an `async def agent(client, row)`; got {type(function).__name__} "
                         f"{getattr(function, '__name__', function)!r}")
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise ValueError(f"agent.function {spec!r}: {function.__name__}{inspect.signature(function)} must take two "
                         "arguments, (client, row)") from None
    return function


def _from_file(spec: str):
    """`path/to/file.py:name` (relative to the working directory): the file loaded as a module, once."""
    path, _, name = spec.rpartition(":")
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValueError(f"agent.function {spec!r}: no file {str(file)!r} (a relative path is read from the working directory)")
    module_name = f"cohort_agent_{file.stem}"
    module = sys.modules.get(module_name)
    if module is None or getattr(module, "__file__", None) != str(file):
        loader = importlib.util.spec_from_file_location(module_name, file)
        module = importlib.util.module_from_spec(loader)
        sys.modules[module_name] = module
        loader.loader.exec_module(module)
    if not hasattr(module, name):
        raise ValueError(f"agent.function {spec!r}: {file.name} has no {name!r}")
    return getattr(module, name)


def agent_problems(cfg: CohortConfig) -> list[str]:
    """Every problem with the agent section, alone and with the rest of the config ([] when fine; agent.environment's own
    checks are its connector's, cohort/connectors, asked by the run's environment)."""
    agent = cfg.agent
    if not agent.timeout_s > 0:
        return [f"agent.timeout_s = {agent.timeout_s} must be > 0 seconds (300 is the default)"]
    if not agent.enabled:
        return []
    problems = []
    if agent.environment is not None:
        if agent.function is not None:
            problems.append(f"agent.environment = {agent.environment!r} with agent.function: the environment runs its own "
                            "agent; unset one of them")
        if cfg.data.train_files or cfg.data.dataset_name:
            problems.append(f"agent.environment = {agent.environment!r} with data.train_files / data.dataset_name: the "
                            "environment's tasks are the dataset; unset them")
    else:
        try:
            resolve_agent(agent.function)
        except ValueError as exc:
            problems.append(str(exc))
    name = (agent.environment if agent.environment is not None else agent.function if isinstance(agent.function, str)
            else getattr(agent.function, "__name__", "the agent"))
    field = "agent.environment" if agent.environment is not None else "agent.function"
    if cfg.tools.enabled:
        problems.append(f"{field} = {name!r} with tools.functions / tools.environment: the agent runs its own tool "
                        "loop; unset the tools section")
    return problems

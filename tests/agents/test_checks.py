"""The agent section's checks (cohort/agents/agent_checks.py through validate_config): what resolves, and every combination
the agent path refuses, each naming the fields and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohort.agents.agent_checks import agent_problems, resolve_agent
from cohort.config import CohortConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "agent_openai.py"


async def good_agent(client, row):
    return 1.0


def sync_agent(client, row):
    return 1.0


async def one_argument(client):
    return 1.0


def test_the_example_resolves_by_file_and_a_function_by_itself():
    assert resolve_agent(f"{EXAMPLE}:agent").__name__ == "agent"
    assert resolve_agent(good_agent) is good_agent
    assert agent_problems(CohortConfig(agent={"function": good_agent})) == []


@pytest.mark.parametrize("function, message", [
    (sync_agent, "must be an `async def agent(client, row)`"),
    (one_argument, "must take two arguments, (client, row)"),
    ("no_such_module_here.agent", "no module 'no_such_module_here' can be imported here"),
    ("examples/no_such_file.py:agent", "no file"),
])
def test_a_function_that_cannot_be_an_agent_is_refused(function, message):
    [problem] = agent_problems(CohortConfig(agent={"function": function}))
    assert message in problem


@pytest.mark.parametrize("override, fix", [
    ({"tools": {"functions": ["cohort.tools.builtin.calculator"]}}, "unset the tools section"),
    ({"pipeline": {"over_provision": 1.5}}, "set pipeline.over_provision=1"),
    ({"algorithm": {"name": "ppo"}}, "use grpo, rloo or reinforce_pp"),
])
def test_what_an_agent_cannot_run_with(override, fix):
    [problem] = agent_problems(CohortConfig(agent={"function": good_agent}, **override))
    assert problem.startswith("agent.function = 'good_agent' with ") and problem.endswith(fix)


def test_several_steps_per_generation_and_processes_are_refused_with_the_callers_fix():
    cfg = CohortConfig(agent={"function": good_agent})
    problems = agent_problems(cfg, world_size=2, one_step=False, one_step_fix="train.steps_per_generation = 1")
    assert problems == ["agent.function = 'good_agent' with more than one optimizer step per generation batch: set "
                        "train.steps_per_generation = 1",
                        "agent.function = 'good_agent' with 2 training processes: agent runs are served in one process; "
                        "set train.num_processes=1"]


def test_timeout_must_be_positive():
    assert agent_problems(CohortConfig(agent={"timeout_s": 0})) == ["agent.timeout_s = 0.0 must be > 0 seconds (300 is the default)"]

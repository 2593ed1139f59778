"""The agent section's checks (cohort/agents/agent_checks.py through validate_config): what resolves, and every combination
the agent path refuses, each naming the fields and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from cohort.agents.agent_checks import agent_problems, resolve_agent
from cohort.config import CohortConfig
from cohort.config.resolve import load_config
from cohort.plan.validate import validate_config

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
])
def test_what_an_agent_cannot_run_with(override, fix):
    [problem] = agent_problems(CohortConfig(agent={"function": good_agent}, **override))
    assert problem.startswith("agent.function = 'good_agent' with ") and problem.endswith(fix)


@pytest.mark.parametrize("overrides", [
    ["algorithm.name=ppo"],  # a critic values every call's row (trainer/agent_samples.py)
    ["train.steps_per_generation=2"],  # a step's slice is whole runs
    ["algorithm.num_iterations=2"],
    ["train.num_processes=2", "train.prompts_per_step=2"],  # the endpoint beside rank 0's engine; a rank's share is whole runs
    ["pipeline.over_provision=1.5"],  # a cut-off run starts over (AgentRun.resumable; refused before 2026-12-07)
])
def test_a_critic_several_steps_per_generation_and_several_processes_run_with_an_agent(overrides):
    # refused at 4f35103 ("a run that rewrote its history adds samples to the batch after its advantages are
    # computed"); the calls are now rows before anything is scored, so validation accepts each of them
    cfg = load_config(EXAMPLE.with_suffix(".yaml"), [f"agent.function={EXAMPLE}:agent", *overrides])
    plan = validate_config(cfg, check_files=False)
    assert plan.config.agent.enabled


def test_timeout_must_be_positive():
    assert agent_problems(CohortConfig(agent={"timeout_s": 0})) == ["agent.timeout_s = 0.0 must be > 0 seconds (300 is the default)"]


def test_cohort_plan_says_an_agent_s_cut_off_runs_hold_no_old_tokens(capsys):
    from cohort import cli
    from cohort.plan.batch import stream_update_blockers

    # partial rollouts with an agent: a cut run is not resumed (AgentRun.resumable = False), it starts over, so the
    # lag line must not say that resumed tokens are up to pipeline.max_aborts versions old (it did before 2026-12-07)
    args = [str(EXAMPLE.with_suffix(".yaml")), f"agent.function={EXAMPLE}:agent", "pipeline.over_provision=1.5"]
    assert cli.main(["plan", *args]) == 0
    out = capsys.readouterr().out
    assert ("off-policy lag        0: an agent's cut-off runs start over from their prompts, so no update trains an old "
            "token") in out
    cfg = load_config(EXAMPLE.with_suffix(".yaml"), args[1:])
    assert [b for b in stream_update_blockers(cfg) if b.startswith("an agent")] == [
        "an agent (agent.function, or an environment played through the agent endpoint): its runs are widened into one sample per seat and call "
        "when the whole batch is taken, not group by group; set pipeline.stream_update=off"]

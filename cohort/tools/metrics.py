"""Tool metrics over a generation batch; what reward functions and completions.jsonl get from multi-turn trajectories.

Reward functions receive `conversations=` (the prompt's messages, then the completion's assistant and tool messages
in order; the last is the final answer) and, with an environment, `environments=` (each trajectory's instance, already closed), when they
name those parameters (`tool_arguments`).

Metrics (only when some trajectory went through the tool loop):
- `tools/call_frequency`: tool calls run per trajectory (mean); `tools/failure_frequency`: calls that timed out or
  raised, over calls run (0 with no call); `tools/calls/<name>`: calls of each tool in the batch;
- `tools/timeouts`, `tools/parse_errors`, `tools/argument_errors`: counts in the batch;
- `tools/turns_mean`: assistant turns per trajectory; `tools/status/<status>`: the fraction of trajectories that
  ended with each tool status (ok, truncated, tool_timeout, error).

Agent runs (cohort/agents) carry an `AgentRun` instead: reward functions may name `agent_runs=`, and the metrics are
`agent/<key>` (the mean over the runs that returned it of each key the agent's dict returned besides `reward`),
`agent/calls_mean` (model calls per run) and `agent/samples_mean` (trained samples per run: 1, or its calls when it
rewrote its history).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from cohort.rollout.base import AgentRun, Trajectory
from cohort.tools.loop import TOOL_STATUSES, Episode


def tool_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    episodes = [t.episode for t in trajectories if isinstance(t.episode, Episode)]
    if not episodes:
        return agent_metrics(trajectories)
    n = len(episodes)
    calls: Counter = Counter()
    for e in episodes:
        calls.update(e.calls)
    total = sum(calls.values())
    out = {
        "tools/call_frequency": total / n,
        "tools/failure_frequency": sum(e.failed_calls for e in episodes) / total if total else 0.0,
        "tools/timeouts": float(sum(e.timeouts for e in episodes)),
        "tools/parse_errors": float(sum(e.parse_errors for e in episodes)),
        "tools/argument_errors": float(sum(e.argument_errors for e in episodes)),
        "tools/turns_mean": sum(e.turns for e in episodes) / n,
    }
    out.update({f"tools/calls/{name}": float(count) for name, count in sorted(calls.items())})
    out.update({f"tools/status/{s}": sum(e.status == s for e in episodes) / n for s in TOOL_STATUSES})
    return out


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The agent runs' metrics (module docstring); {} when no trajectory is an agent run's."""
    runs = [t.episode for t in trajectories if isinstance(t.episode, AgentRun)]
    if not runs:
        return {}
    reported: dict[str, list[float]] = {}
    for run in runs:
        for key, value in (run.outcome or {}).items():
            if key != "reward":
                reported.setdefault(f"agent/{key}", []).append(float(value))
    out = {key: sum(values) / len(values) for key, values in sorted(reported.items())}
    out["agent/calls_mean"] = sum(run.turns for run in runs) / len(runs)
    out["agent/samples_mean"] = sum(1 + len(run.samples) for run in runs) / len(runs)
    return out


def tool_arguments(trajectories: Sequence[Trajectory], prompts: Sequence[Any]) -> dict[str, list[Any]]:
    """The optional reward arguments of multi-turn trajectories: `conversations` (the prompt's messages, a text prompt
    as one user message, then the completion's assistant and tool turns) and, with an environment, `environments`
    (each trajectory's instance); for agent runs `agent_runs` (each trajectory's `AgentRun`); {} when no trajectory
    went through the tool loop or an agent."""
    if any(isinstance(t.episode, AgentRun) for t in trajectories):
        return {"agent_runs": [t.episode if isinstance(t.episode, AgentRun) else None for t in trajectories]}
    episodes = [t.episode if isinstance(t.episode, Episode) else None for t in trajectories]
    if not any(episodes):
        return {}
    heads = [list(p) if isinstance(p, list) else [{"role": "user", "content": str(p)}] for p in prompts]
    out: dict[str, list[Any]] = {"conversations": [h + (e.conversation if e else []) for h, e in zip(heads, episodes)]}
    if any(e is not None and e.environment is not None for e in episodes):
        out["environments"] = [e.environment if e else None for e in episodes]
    return out

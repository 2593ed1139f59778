"""Tool metrics over a generation batch.

Reward functions receive `conversations=` (the prompt's messages, then the completion's assistant and tool messages
in order; the last is the final answer) and, with an environment, `environments=` (each trajectory's instance, already
closed), when they name those parameters: that is `tool_arguments` in cohort/rollout/collect.py, where the reward
calls are made.

Metrics (only when some trajectory went through the tool loop):
- `tools/call_frequency`: tool calls run per trajectory (mean); `tools/failure_frequency`: calls that timed out or
  raised, over calls run (0 with no call); `tools/calls/<name>`: calls of each tool in the batch;
- `tools/timeouts`, `tools/parse_errors`, `tools/argument_errors`: counts in the batch;
- `tools/turns_mean`: assistant turns per trajectory; `tools/status/<status>`: the fraction of trajectories that
  ended with each tool status (ok, truncated, tool_timeout, error);
- `tools/failed_episodes`: episodes in the batch whose environment failed at reset (or whose first observation did
  not fit the context): scored by nothing, trained on nothing (`Episode.failure`; completions.jsonl's `failure`).

Agent runs (cohort/agents) carry an `AgentRun` instead: reward functions may name `agent_runs=`, and the metrics are
`agent/<key>` (the mean over the runs that returned it of each key the agent's dict returned besides `reward`),
`agent/failed` (runs that ended with an error: only an environment's failed episodes get this far, cohort/agents/verifiers.py),
`agent/calls_mean` (model calls per run) and `agent/samples_mean` (trained samples per run: 1, or its calls when it
rewrote its history).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from cohort.rollout.base import AgentRun, Trajectory
from cohort.rollout.base import TOOL_STATUSES, Episode


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
        "tools/failed_episodes": float(sum(e.failure is not None for e in episodes)),
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
    out["agent/failed"] = float(sum(run.error is not None for run in runs))
    out["agent/calls_mean"] = sum(run.turns for run in runs) / len(runs)
    out["agent/samples_mean"] = sum(1 + len(run.samples) for run in runs) / len(runs)
    return out

"""Tool metrics over a generation batch, and the whole conversation of a trajectory for completions.jsonl.

Metrics (only when some trajectory went through the tool loop):
- `tools/call_frequency`: tool calls run per trajectory (mean); `tools/failure_frequency`: calls that timed out or
  raised, over calls run (0 with no call); `tools/calls/<name>`: calls of each tool in the batch;
- `tools/timeouts`, `tools/parse_errors`, `tools/argument_errors`: counts in the batch;
- `tools/turns_mean`: assistant turns per trajectory; `tools/status/<status>`: the fraction of trajectories that
  ended with each tool status (ok, truncated, tool_timeout, error).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from cohort.rollout.base import Trajectory
from cohort.tools.loop import TOOL_STATUSES, Episode


def tool_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    episodes = [t.episode for t in trajectories if isinstance(t.episode, Episode)]
    if not episodes:
        return {}
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


def conversation(trajectory: Trajectory) -> list[dict[str, Any]] | None:
    """The completion's turns (assistant and tool messages, tool turns marked by their role), None for one turn."""
    episode = trajectory.episode
    return list(episode.conversation) if isinstance(episode, Episode) else None

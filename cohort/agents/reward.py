"""The agent reward: the run's reward is what the agent returned (cohort/agents/engine.py records it on the run's
`AgentRun`). With agent.function set, this function is the run's first reward function, of weight 1, and the configured
`rewards` are added beside it (cohort/plan/run_rewards.py composes the set), so the reward, its failures and its
metrics go the way every reward function's go (cohort/rewards/reward_set.py): a run whose agent raised, returned
something unusable or timed out makes this function raise `RewardRowError` for that row, which stops the run with one
message naming the row and the error, the last good state saved (cohort/trainer/failure.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from cohort.rewards.calling import RewardRowError


def agent_reward(completions: Sequence[Any], agent_runs: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """Each completion's agent run's reward (None: not applicable, or not an agent run)."""
    if agent_runs is None:
        return [None] * len(completions)
    out: list[float | None] = []
    for i, run in enumerate(agent_runs):
        if run is not None and run.error is not None:
            raise RewardRowError(i, f"agent run failed ({run.status}): {run.error}")
        out.append(None if run is None or run.outcome is None else run.outcome.get("reward"))
    return out

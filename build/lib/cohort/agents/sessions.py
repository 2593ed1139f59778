"""Joining a framework's own session ids to the agent run they belong to (cohort/agents/engine.py sets the join for
each run; cohort/agents/loopback.py routes `X-Session-ID` by it). Its own module so that the config checks and the
data loading can import the verifiers connector without importing an engine."""

from __future__ import annotations

import contextvars
from typing import Callable

JOIN: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("cohort_agent_join", default=None)


def join_session(session_id: str) -> None:
    """Inside an agent run (and the tasks it starts): the endpoint takes calls with `X-Session-ID: session_id` as this
    run's. RuntimeError outside a run."""
    join = JOIN.get()
    if join is None:
        raise RuntimeError("join_session is for code running inside an agent run")
    join(session_id)

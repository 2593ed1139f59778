"""From the config to agent runs: the wrapping of a built engine in an `AgentEngine` (cohort/trainer/build_parts.py and
`cohort eval` call `wrap_engine` when agent.function or agent.environment is set, with the agent the run's environment
resolved: an agent environment's episodes, cohort/connectors; the config's checks are in cohort/agents/agent_checks.py).

The endpoint is the one `cohort serve` answers with (cohort/agents/chat.py's `ChatCompletions`): the checkpoint's
chat template (its tools block unless agent.render_tools is false), its stop tokens, tools.parser for tool calls; the
context bound is AgentEngine's (a call past it ends the run "length", as the tool loop ends a turn that does not fit).
"""

from __future__ import annotations

from typing import Any, Callable

from cohort.agents.chat import ChatCompletions, Conversation
from cohort.agents.agent_checks import resolve_agent
from cohort.agents.engine import AgentEngine
from cohort.config import CohortConfig
from cohort.rollout.base import Request

UNBOUNDED = 2**31  # the endpoint's context: AgentEngine bounds each call by the engine's context and the run's budget


def wrap_engine(cfg: CohortConfig, engine, tokenizer, rows: Callable[[Request], dict[str, Any]] | None = None, *,
                max_model_len: int | None = None, agent: Callable[..., Any] | None = None) -> AgentEngine:
    """`engine` behind the agent endpoint, each request one run of `agent`: the run's (cohort/plan/run_environment.py's
    `RunEnvironment.agent`: an agent environment's episode, or agent.function); default: agent.function resolved here."""
    name = cfg.model.path

    def chat(sample):
        return ChatCompletions(tokenizer, engine.stop_token_ids, sample, parser=cfg.tools.parser, model_name=name,
                               max_model_len=UNBOUNDED, render_tools=cfg.agent.render_tools)

    agent = agent if agent is not None else resolve_agent(cfg.agent.function)
    return AgentEngine(engine, chat, Conversation, agent, rows=rows,
                       timeout_s=cfg.agent.timeout_s, model_name=name, max_model_len=max_model_len)

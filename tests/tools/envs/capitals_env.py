"""An MCP environment for the tests, written the way OpenEnv's own MCP environments are (its `echo_env` and
`finqa_env`): FastMCP tools defined inline in `__init__` and handed to `MCPEnvironment`; `reset` returns a bare
`Observation` (its status in `metadata`, which the server does not send); the environment's own `step` (and
`step_async`, the WebSocket path) ends the episode on `submit_answer` with a bare `Observation` carrying the reward.
A row's `country` picks the question's country. `app` serves it with openenv's `create_app` and MCP's
`CallToolAction`/`CallToolObservation` ($CAPITALS_SESSIONS sessions, default 8)."""

from __future__ import annotations

import os
from typing import Any, Optional
from uuid import uuid4

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi"}


class CapitalsEnvironment(MCPEnvironment):
    """Answer a question about a country's capital: look it up, then submit it."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("capitals")

        @mcp.tool
        def lookup(country: str) -> str:
            """Look up the capital of a country.

            Args:
                country: The country's name, e.g. "France"

            Returns:
                The capital's name
            """
            if country.lower() == "atlantis":
                raise ValueError("Atlantis has sunk")
            return CAPITALS.get(country.lower(), f"no country named {country}")

        @mcp.tool
        def country_facts(country: str, fields: list[str]) -> dict:
            """Facts about a country.

            Args:
                country: The country's name
                fields: Which facts to return
            """
            return {"country": country, **{f: "unknown" for f in fields}}

        @mcp.tool
        def submit_answer(answer: str) -> str:
            """Submit your final answer; the episode ends.

            Args:
                answer: The capital you found
            """
            return f"submitted {answer}"

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self.country = "france"

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, country: str = "france",
              **kwargs: Any) -> Observation:
        self.country = country.lower()
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return Observation(done=False, reward=0.0, metadata={"status": "ready", "country": self.country})

    def _step_impl(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0, metadata={"error": f"unknown action {type(action).__name__}"})

    def _scored(self, action: Action, observation: Observation) -> Observation:
        self._state.step_count += 1
        if isinstance(action, CallToolAction) and action.tool_name == "submit_answer":
            answer = str(action.arguments.get("answer", "")).strip().lower()
            reward = 1.0 if answer == CAPITALS[self.country].lower() else 0.0
            return Observation(done=True, reward=reward, metadata={**observation.metadata, "submitted": answer})
        return observation

    def step(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Action, timeout_s: Optional[float] = None, **kwargs: Any) -> Observation:
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    @property
    def state(self) -> State:
        return self._state


app = create_app(CapitalsEnvironment, CallToolAction, CallToolObservation, env_name="capitals_env",
                 max_concurrent_envs=int(os.getenv("CAPITALS_SESSIONS", "8")))

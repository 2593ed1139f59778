"""Each environment a run names, resolved once per process and carried in its plan (`RunPlan.environment`).

`RunEnvironment(cfg)` reads the config's one spelling into its hub's field (cohort/connectors/registry.py's
`routed`), chooses the connectors the config names (`connectors`: at most a task hub, whose rows it brings, and an
episode hub, a tools or an agent environment; none for the data section's own rows) and asks them, never which hub
they are:
- `problems()`: the spellings' and the connectors' checks, before anything loads;
- `rows()`: the rows a connector brings (`HubRows`: a reasoning-gym task's, a verifiers environment's tasks, a tools
  environment's placeholder rows), built once and kept (`run_data` hands them to `load_data`);
- `episode_reward_specs()`: the rewards an agent environment's episodes bring (or agent.function's returned reward);
- `tools`: the tools section resolved once (cohort/tools/tool_schemas.py's `ToolResolution`), its environment class
  built by the tools connector;
- `agent(model_name)`: the agent each request runs (an agent environment's, else agent.function's);
- `before_load(sessions, why)`: what must hold before any weights load (an OpenEnv server's capacity).

Validation asks each where it checks it, so config problems are still named before anything loads and nothing is
resolved that validation would not have resolved; the trainer's setup and `cohort eval` ask the same object afterwards,
so nothing is resolved twice. A plan handed to another process (`RunPlan.for_another_process`: a Ray actor) carries
none: that process makes its own, once.
"""

from __future__ import annotations

from typing import Any, Callable

from cohort.agents.agent_checks import resolve_agent
from cohort.agents.reward import agent_reward
from cohort.config import CohortConfig
from cohort.connectors import Connector, chosen, routed
from cohort.connectors.registry import spelling_problems
from cohort.data.run_data import HubRows, load_data
from cohort.tools.tool_schemas import ToolResolution

_UNSET = object()


class _Failed:
    """The exception the rows' loading raised, kept (`RunEnvironment.rows`)."""

    def __init__(self, error: Exception):
        self.error = error


class RunEnvironment:
    """The run's environments, each resolved at most once (module docstring). `config`: the routed config."""

    def __init__(self, cfg: CohortConfig):
        self.config, self._routing = routed(cfg)
        self.connectors: list[Connector] = chosen(self.config)
        tools_hub = self._episode_hub("tools", "environment_class")
        if tools_hub is None and self.config.tools.environment is not None:  # (named a hub of another kind: a problem)
            tools_hub = _no_class
        self.tools = ToolResolution(self.config.tools, tools_hub)
        self._rows: Any = _UNSET

    def _episode_hub(self, runs: str, method: str | None = None) -> Any:
        hub = next((c for c in self.connectors if c.runs == runs), None)
        return hub if method is None or hub is None else getattr(hub, method)

    def problems(self) -> list[str]:
        """The spelling's conflicts, each connector's spelling and own checks ([] when fine)."""
        problems = list(self._routing)
        for connector in self.connectors:
            spelled = spelling_problems(connector)
            problems += spelled or connector.problems()
        return problems

    def rows(self) -> HubRows | None:
        """The rows the run's connectors bring (the first that brings any), built once; a loader's exception is kept and
        raised again when asked again (validation asks twice: a hub's load, a verifiers environment's say, runs once)."""
        if self._rows is _UNSET:
            try:
                self._rows = next((rows for rows in (c.rows() for c in self.connectors) if rows is not None), None)
            except Exception as exc:  # noqa: BLE001 - kept as raised (rows_if_any, the data reading)
                self._rows = _Failed(exc)
        if isinstance(self._rows, _Failed):
            raise self._rows.error
        return self._rows

    def rows_if_any(self) -> HubRows | None:
        """`rows()`, or None when they cannot be made (the data checks, and reading the data, say why: a hub's own
        loader may raise anything, e.g. a scaffolded verifiers taskset's NotImplementedError, which the reading of the
        data turns into one line with its traceback in the run's log)."""
        try:
            return self.rows()
        except Exception:  # noqa: BLE001 - (above) reported where the data is read, once
            return None

    def episode_reward_specs(self) -> list[dict[str, Any]]:
        """The rewards an agent's episodes bring, first in the run's reward set: the agent environment's, or
        agent.function's returned reward; [] without an agent."""
        hub = self._episode_hub("agent")
        if hub is not None:
            return hub.reward_specs()
        return [{"name": agent_reward, "weight": 1.0}] if self.config.agent.function is not None else []

    def agent(self, model_name: str) -> Callable[..., Any]:
        """The agent each request runs: the agent environment's episode, else agent.function."""
        hub = self._episode_hub("agent")
        return hub.agent(model_name) if hub is not None else resolve_agent(self.config.agent.function)

    def before_load(self, sessions: int, why: str, timeout_s: float) -> None:
        """Each connector's checks before any weights load (ConfigError with the fix)."""
        for connector in self.connectors:
            connector.before_load(sessions, why, timeout_s)


def _no_class(timeout_s: float) -> None:
    """tools.environment names a hub that runs no tool loop (`problems` says so): no class."""
    return None


def run_data(cfg: CohortConfig, environment: RunEnvironment | None = None):
    """`load_data(cfg)` with the run's environment's rows: (train, eval or None, the rows' reward specs); `environment`:
    the run's (default: resolved here, for a caller without a plan)."""
    environment = environment if environment is not None else RunEnvironment(cfg)
    # `cfg` routed, not `environment.config`: the caller's config may have moved since the environment was resolved
    # (the Python API moves in-memory datasets from a staging directory into the run's after validating)
    return load_data(routed(cfg)[0], environment.rows)

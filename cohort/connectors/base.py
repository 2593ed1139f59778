"""The one interface every hub of tasks or environments answers (`Connector`), so that no site of the run asks which
hub it has.

A connector is one hub (reasoning-gym, a TRL `environment_factory` class, OpenEnv, Gymnasium, verifiers, TextArena),
made from the spelling that names it (`environment: <prefix><id>`, or the field its hub has always had) and the hub's
own arguments. It answers the same questions for every hub:

- `matches(spec)` / `claims(obj)`: whether a spelling (by its prefix) or an imported object (an OpenEnv or Gymnasium
  class) is this hub's; the registry (cohort/connectors/registry.py) asks each in turn, once per run.
- `problems()`: its config checks, before anything loads, one line each naming the field and the fix.
- `rows()`: the rows it brings (`HubRows`: train, held-out, reward specs), or None when the data comes from elsewhere.
- `reward_specs()`: the rewards its episodes bring, composed first in the run's reward set (cohort/plan/run_rewards.py:
  an agent hub's episode reward sits in the column `with_seats` reads).
- how an episode runs: `runs` names the engine wrapper (`task`: one turn, none; `tools`: the tool loop, which
  instantiates `environment_class(timeout_s)` per trajectory; `agent`: the agent endpoint, which runs `agent(model)`
  per request); its record kind is that wrapper's (`record`: the tool loop's `tool_loop`, the endpoint's `agent_run`).
- how it fails: an episode its environment failed is `EpisodeRecord.failed` (scored by nothing, counted); a service
  gone raises `cohort.tools.session_episode.EnvironmentLost` (the step fails, the run keeps its checkpoint). `before_load`
  checks what must hold before any weights load (an OpenEnv server's capacity for the sessions a step keeps open).
- `field`: the config field its hub has always had (data.task, tools.environment, agent.environment), into which
  the one spelling `environment:` is read, so the sections below keep reading what they read.

A hub is then one module with a subclass, and a line in the registry. Left out: a hub that is both a task and an
episode at once (none so far: a reasoning-gym task beside a tools environment is two connectors, each asked its own
questions, cohort/plan/run_environment.py).
"""

from __future__ import annotations

from typing import Any, ClassVar

from cohort.config import CohortConfig
from cohort.data.run_data import HubRows, placeholder_rows

FIELDS = {"task": "data.task", "tools": "tools.environment", "agent": "agent.environment"}
ARGS_FIELDS = {"task": "data.task_config", "agent": "agent.environment_args"}  # (a tools environment takes none)


class Connector:
    """One hub behind the shared interface (module docstring). `spec`: the spelling (a class given from Python is
    its own spec), `args`: the hub's own arguments, `cfg`: the run's config, `named_by`: the field that named it (for
    messages)."""

    name: ClassVar[str] = ""  # the hub, as the docs and messages name it
    prefixes: ClassVar[tuple[str, ...]] = ()
    runs: ClassVar[str] = "task"  # task | tools | agent (FIELDS)
    record: ClassVar[str | None] = None  # the episode record kind its episodes carry (None: single-turn rows)
    requires: ClassVar[tuple[str, str] | None] = None  # (module, pip requirement): the optional dependency it needs

    def __init__(self, spec: Any, args: dict[str, Any], cfg: CohortConfig, named_by: str | None = None):
        self.spec, self.args, self.cfg = spec, dict(args or {}), cfg
        self.named_by = named_by or self.field

    @property
    def field(self) -> str:
        return FIELDS[self.runs]

    @classmethod
    def matches(cls, spec: Any) -> bool:
        return isinstance(spec, str) and spec.startswith(cls.prefixes)

    @classmethod
    def claims(cls, obj: Any) -> bool:
        """Whether an imported object (a class named by import path, or given from Python) is this hub's."""
        return False

    def problems(self) -> list[str]:
        return []

    def rows(self) -> HubRows | None:
        return None

    def reward_specs(self) -> list[dict[str, Any]]:
        return []

    def environment_class(self, timeout_s: float) -> type | None:
        """runs = tools: the class the tool loop builds one instance of per trajectory (checked now; ValueError with the
        fix otherwise)."""
        return None

    def agent(self, model_name: str) -> Any:
        """runs = agent: the `async (client, row)` that plays one episode per request against the agent endpoint."""
        raise NotImplementedError(f"{type(self).__name__} runs no agent")

    def before_load(self, sessions: int, why: str, timeout_s: float) -> None:
        """Checks that must hold before any weights load, for `sessions` trajectories in flight at once (`why` says
        where that number comes from); raises ConfigError with the fix."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r})"


class ToolsConnector(Connector):
    """A hub whose episodes run in the tool loop (cohort/tools/loop.py): an environment class, one instance per
    trajectory. Without data of the run's own it owns the data, as TRL's `environment_factory` without a
    `train_dataset`: placeholder rows whose prompt `reset` returns (cohort/data/run_data.py)."""

    runs: ClassVar[str] = "tools"
    record: ClassVar[str | None] = "tool_loop"

    def rows(self) -> HubRows | None:
        data = self.cfg.data
        if data.train_files or data.dataset_name or data.task is not None:
            return None
        return HubRows(placeholder_rows(self.cfg), f"placeholder rows ({self.named_by} owns the data)")


class AgentConnector(Connector):
    """A hub whose episodes run against the agent endpoint (cohort/agents/engine.py): each request one episode,
    its reward the run's, its failures the episode's only (`episode_only`: scored by nothing, training goes on)."""

    runs: ClassVar[str] = "agent"
    record: ClassVar[str | None] = "agent_run"


"""Each environment a run names, resolved once per process and carried in its plan (`RunPlan.environment`).

`RunEnvironment(cfg)` resolves on first use and keeps what it resolved:
- `tools`: tools.functions and tools.environment (cohort/tools/tool_schemas.py's `ToolResolution`: the functions, the
  environment class with its tools' schemas — a TRL class checked, an OpenEnv server's schema read, a gym id's probe
  made — the schemas the prompts show, the reward spec the environment adds);
- `verifiers()`: agent.environment's verifiers environment loaded with its tasks (cohort/data/verifiers.py's
  `load_tasks`), from which both the run's rows and its agent's episodes come.

Validation asks each where it checks it (the tools check; the data read), so config problems are still named before
anything loads and nothing is resolved that validation would not have resolved; the trainer's setup and `cohort eval`
ask the same object afterwards, so nothing is resolved twice. A plan handed to another process
(`RunPlan.for_another_process`: a Ray actor) carries none: that process makes its own, once.

Left out: agent.function, an import that Python keeps (cohort/agents/agent_checks.py's `resolve_agent`).
"""

from __future__ import annotations

from typing import Any

from cohort.config import CohortConfig
from cohort.data.run_data import load_data
from cohort.data.verifiers import load_tasks
from cohort.tools.tool_schemas import ToolResolution


class RunEnvironment:
    """The run's environments, each resolved at most once (module docstring)."""

    def __init__(self, cfg: CohortConfig):
        self.tools = ToolResolution(cfg.tools)
        self._agent = cfg.agent
        self._verifiers: tuple[Any, list] | None = None

    def verifiers(self) -> tuple[Any, list] | None:
        """(the verifiers environment, its tasks) of agent.environment; None when it is unset."""
        a = self._agent
        if a.environment is None:
            return None
        if self._verifiers is None:
            self._verifiers = load_tasks(a.environment, a.environment_args, a.num_examples)
        return self._verifiers

    def verifiers_tasks(self) -> list:
        """agent.environment's tasks (the rows' source: `load_data(cfg, environment_tasks=...)`)."""
        return self.verifiers()[1]


def run_data(cfg: CohortConfig, environment: RunEnvironment):
    """`load_data(cfg)` with the run's loaded environment tasks: (train, eval or None, the built-in task's specs)."""
    return load_data(cfg, environment.verifiers_tasks)

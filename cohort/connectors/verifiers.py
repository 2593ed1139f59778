"""verifiers (v1, `verifiers>=0.4`) environments as a connector: `environment: verifiers:<id>` (or
`agent.environment`), its config `environment_args` (read as agent.environment_args).

The environment is loaded once per run with its tasks (cohort/data/verifiers.py's `load_tasks`): its rows are one
per task, and its episodes run against the agent endpoint through verifiers' own eval path
(cohort/agents/verifiers.py's `VerifiersAgent`), each episode's reward the run's (`verifiers_reward`), one seat per
trace for a multi-agent environment. Its checks (the module installed, a local runtime, a bounded taskset) run before
anything loads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cohort.agents.verifiers import VerifiersAgent, verifiers_reward
from cohort.connectors.base import AgentConnector
from cohort.data import verifiers
from cohort.data.run_data import HubRows


class Verifiers(AgentConnector):
    """`verifiers:<module or owner/name@version>` (module docstring)."""

    name: ClassVar[str] = "verifiers"
    prefixes: ClassVar[tuple[str, ...]] = (verifiers.PREFIX,)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._loaded: tuple[Any, list] | None = None

    def loaded(self) -> tuple[Any, list]:
        """(the environment, its tasks), loaded on first use and kept."""
        if self._loaded is None:
            self._loaded = verifiers.load_tasks(self.spec, self.args, self.cfg.agent.num_examples)
        return self._loaded

    def problems(self) -> list[str]:
        return verifiers.check_environment(self.spec, self.args, self.cfg.agent.num_examples)

    def rows(self) -> HubRows:
        return HubRows(verifiers.task_rows(self.loaded()[1]), f"environment {self.spec}")

    def reward_specs(self) -> list[dict[str, Any]]:
        return [{"name": verifiers_reward, "weight": 1.0}]

    def agent(self, model_name: str) -> VerifiersAgent:
        return VerifiersAgent(self.spec, self.args, model_name, self.cfg.agent.num_examples, loaded=self.loaded())

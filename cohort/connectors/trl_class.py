"""A class written for TRL's `GRPOTrainer(environment_factory=...)` as a connector: `environment: my_module.MyEnv`
(or `tools.environment`), the registry's last resort for an import path no other hub claims.

The class is checked as cohort/tools/tool_schemas.py says (a `reset`, at least one public method as a tool); its
episodes run in the tool loop, one instance per trajectory; its `get_reward()`, when it has one, is one more reward of
weight 1 (`ToolResolution.reward_specs`). Without data of the run's own it owns the data (placeholder rows).
"""

from __future__ import annotations

from typing import ClassVar

from cohort.connectors.base import ToolsConnector
from cohort.tools.tool_schemas import checked_class, import_object


class TrlClass(ToolsConnector):
    """An `environment_factory` class by import path, or the class itself from Python."""

    name: ClassVar[str] = "TRL environment_factory"

    @classmethod
    def matches(cls, spec) -> bool:
        return True  # (the registry asks it last: any import path or class)

    def environment_class(self, timeout_s: float) -> type:
        cls = import_object(self.spec, self.named_by) if isinstance(self.spec, str) else self.spec
        return checked_class(self.spec, cls)

"""Gymnasium text environments as a connector: `environment: gym:<id>` (`gym:<module>:<id>`, `gym:<module>.<Env
class>`), or a `gymnasium.Env` subclass (claimed once imported), through the adapter in cohort/tools/gym_text.py: one
`step(action)` tool, the episode's summed reward as its `get_reward()`. One environment is made at the check, so a
bad id or a space the adapter cannot write is refused before any model loads.
"""

from __future__ import annotations

from typing import Any, ClassVar

from cohort.connectors.base import ToolsConnector
from cohort.tools import gym_text


class Gym(ToolsConnector):
    """`gym:<id>` or a gymnasium.Env subclass (module docstring)."""

    name: ClassVar[str] = "Gymnasium"
    prefixes: ClassVar[tuple[str, ...]] = (gym_text.PREFIX,)

    @classmethod
    def claims(cls, obj: Any) -> bool:
        return gym_text.is_gym_spec(obj)

    def environment_class(self, timeout_s: float) -> type:
        return gym_text.gym_environment(self.spec, timeout_s)

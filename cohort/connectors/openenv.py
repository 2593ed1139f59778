"""OpenEnv environments as a connector: a running server, `environment: ws://host:port` (or `openenv:ws://...`), or
an `Environment` subclass by import path (claimed once imported), through the adapter in cohort/tools/openenv.py.

Its episodes run in the tool loop (one `step` tool, or an MCP environment's tools); a server that is gone raises
`EnvironmentLost` (the step fails, the run keeps its checkpoint). Before any weights load it opens as many sessions as
a step keeps in flight (`before_load`: a server of one session refuses the second, and would fail the run later).
"""

from __future__ import annotations

from typing import Any, ClassVar

from cohort.connectors.base import ToolsConnector
from cohort.tools import openenv
from cohort.tools.tool_schemas import import_object

PREFIX = "openenv:"


class OpenEnv(ToolsConnector):
    """An OpenEnv server URL or Environment class (module docstring)."""

    name: ClassVar[str] = "OpenEnv"
    prefixes: ClassVar[tuple[str, ...]] = (PREFIX, "ws://", "wss://", "http://", "https://")

    @classmethod
    def claims(cls, obj: Any) -> bool:
        return openenv.is_openenv_class(obj)

    @property
    def target(self) -> Any:
        """The URL, or the class (imported when named by path)."""
        spec = self.spec.removeprefix(PREFIX) if isinstance(self.spec, str) else self.spec
        if isinstance(spec, str) and not openenv.is_server_url(spec):
            return import_object(spec, self.named_by)
        return spec

    def environment_class(self, timeout_s: float) -> type:
        return openenv.openenv_environment(self.target, timeout_s)

    def before_load(self, sessions: int, why: str, timeout_s: float) -> None:
        target = self.target
        if openenv.is_server_url(target):
            openenv.check_capacity(target.rstrip("/"), sessions, timeout_s, why)

"""Which connector a spelling names, decided once, by prefix: the registry of hubs (`CONNECTORS`) and the one
spelling (`environment:`) read into the field each hub has always had.

`connector_class(spec)`: the first connector whose prefix the spelling has (`reasoning_gym:`, `verifiers:`,
`textarena:`, `gym:`, `openenv:` and WebSocket URLs); else the spelling is an import path (or, from Python, the object
itself): imported, the first connector that claims the object (an OpenEnv `Environment`, a `gymnasium.Env`) takes it,
and any other class is TRL's `environment_factory` shape (`TrlClass`, last). A new hub is a module with a `Connector`
subclass and a line in `CONNECTORS`.

`routed(cfg)`: the config with `environment` / `environment_args` read into the hub's own fields (data.task and
data.task_config, tools.environment, agent.environment and agent.environment_args), so every section keeps reading
what it reads; an explicit, different value in that field is a conflict, refused naming both fields. A tools
environment without data of the run's own owns the data (data.task None: its placeholder rows), as for
tools.environment (cohort/config/resolve.py's `environment_owns_data`).

`chosen(cfg)`: the connectors a (routed) config names, one per spelling (a reasoning-gym task beside a tools
environment is two), each with the field that named it, and `spelling_problems(cfg)`: a spelling in a field its hub
does not read (`agent.environment: gym:...`), a missing optional dependency.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from cohort.config import CohortConfig
from cohort.connectors.base import ARGS_FIELDS, FIELDS, Connector
from cohort.connectors.gym import Gym
from cohort.connectors.openenv import OpenEnv
from cohort.connectors.reasoning_gym import ReasoningGym
from cohort.connectors.textarena import TextArena
from cohort.connectors.trl_class import TrlClass
from cohort.connectors.verifiers import Verifiers
from cohort.data.datasets import own_data
from cohort.tools.tool_schemas import DEFAULT_TIMEOUT_S, import_object

CONNECTORS: tuple[type[Connector], ...] = (ReasoningGym, Verifiers, TextArena, Gym, OpenEnv, TrlClass)  # TrlClass last: it takes any class


def connector_class(spec: Any, named_by: str = "environment") -> type[Connector]:
    """The connector a spelling names (module docstring); an import path that does not import goes to `TrlClass`,
    whose check raises the import's error."""
    for cls in CONNECTORS:
        if cls.prefixes and cls.matches(spec):
            return cls
    obj = spec
    if isinstance(spec, str):
        try:
            obj = import_object(spec, named_by)
        except ValueError:
            return TrlClass
    return next((cls for cls in CONNECTORS if cls.claims(obj)), TrlClass)


def _task_hub(task: str | None) -> type[Connector] | None:
    """The task connector a data.task names by prefix (None: a built-in task, no hub)."""
    return next((cls for cls in CONNECTORS if cls.runs == "task" and cls.prefixes and cls.matches(task)), None)


def spellings(cfg: CohortConfig) -> list[tuple[str, Any, dict[str, Any]]]:
    """(field, spec, args) for every environment the config names, the one spelling first."""
    out = []
    if cfg.environment is not None:
        out.append(("environment", cfg.environment, cfg.environment_args))
    if cfg.data.task is not None and not own_data(cfg.data) and _task_hub(cfg.data.task) is not None:
        out.append(("data.task", cfg.data.task, cfg.data.task_config))
    if cfg.tools.environment is not None:
        out.append(("tools.environment", cfg.tools.environment, {}))
    if cfg.agent.environment is not None:
        out.append(("agent.environment", cfg.agent.environment, cfg.agent.environment_args))
    return out


def routed(cfg: CohortConfig) -> tuple[CohortConfig, list[str]]:
    """(the config with `environment` read into its hub's field, the conflicts); the config itself without one (a
    new object otherwise: `cfg` is never written)."""
    if cfg.environment is None:
        return cfg, []
    cls = connector_class(cfg.environment)
    section_name, name = FIELDS[cls.runs].split(".")
    section = getattr(cfg, section_name)
    update: dict[str, Any] = {name: cfg.environment}
    problems = []
    current = getattr(section, name)
    if current is not None and current != cfg.environment and (name in section.model_fields_set or name != "task"):
        problems.append(f"environment = {cfg.environment!r} and {FIELDS[cls.runs]} = {current!r} name two environments; "
                        f"keep one (environment is the one spelling; {FIELDS[cls.runs]} the older one)")
    if cfg.environment_args:
        args_field = ARGS_FIELDS.get(cls.runs)
        if args_field is None:
            problems.append(f"environment_args: {cls.name} environments are built with no arguments; unset environment_args")
        else:
            args_name = args_field.split(".")[1]
            given = getattr(section, args_name)
            if given and given != cfg.environment_args:
                problems.append(f"environment_args = {cfg.environment_args} and {args_field} = {given} give the environment "
                                f"two configs; keep one (environment_args beside environment)")
            update[args_name] = dict(cfg.environment_args)
    updates = {section_name: section.model_copy(update=update)}
    data = cfg.data
    if cls.runs == "tools" and not own_data(data) and "task" not in data.model_fields_set:
        updates["data"] = data.model_copy(update={"task": None})  # the environment owns the data (module docstring)
    return cfg.model_copy(update=updates), problems


def chosen(cfg: CohortConfig) -> list[Connector]:
    """The connectors a config names (`spellings`), each made once: the same spec in two fields is one connector."""
    out: dict[str, Connector] = {}
    for field, spec, args in spellings(cfg):
        key = spec if isinstance(spec, str) else repr(spec)
        if key not in out:
            out[key] = connector_class(spec, field)(spec, args, cfg, named_by=field)
    return list(out.values())


def spelling_problems(connector: Connector) -> list[str]:
    """A connector named in a field its hub does not read, or whose optional dependency is missing ([] when fine)."""
    if connector.named_by != "environment" and connector.named_by != connector.field:
        takes = [f"{c.prefixes[0]}<...>" for c in CONNECTORS if c.prefixes and FIELDS[c.runs] == connector.named_by]
        alternatives = f"; {connector.named_by} takes {', '.join(takes)}" if takes else ""
        return [f"{connector.named_by} = {connector.spec!r} names a {connector.name} environment, which {connector.field} "
                f"takes{alternatives}: write it as environment: {connector.spec}"]
    if connector.requires is not None and importlib.util.find_spec(connector.requires[0]) is None:
        return [f"{connector.named_by} = {connector.spec!r} needs the {connector.requires[0]} package: "
                f"pip install '{connector.requires[1]}'"]
    return []


def resolve_environment(spec: Any, timeout_s: float = DEFAULT_TIMEOUT_S, cfg: CohortConfig | None = None) -> type | None:
    """The tool-loop class a tools environment's spelling names (its connector's `environment_class`), for callers
    without a run (tests, notebooks); `timeout_s` bounds each message to a server."""
    connector = connector_class(spec, "tools.environment")(spec, {}, cfg or CohortConfig(), named_by="tools.environment")
    return connector.environment_class(timeout_s)

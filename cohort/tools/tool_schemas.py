"""Tools and environments: plain Python functions (or an environment class's public methods) and their JSON schemas.

A tool is a plain function, `def` or `async def`, typed and with a Google-style docstring: its JSON schema is what
`transformers.utils.get_json_schema` builds (the schema chat templates render in their tools block), so a TRL
tool function works unchanged. `tools.functions` names them by import path (`my_module.multiply` or
`my_module:multiply`); the Python API may pass the functions themselves.

An environment (`tools.environment: my_module.MyEnv`) is a class written the way TRL's
`GRPOTrainer(environment_factory=...)` takes it: one instance per trajectory, built with no arguments; `reset(**row)`
(required, as in TRL) gets the dataset row and may return a first observation (appended to the prompt's last user message with no
separator, as TRL does: cohort/tools/loop.py); its public methods (not `reset`, `close`, `get_reward`, nor names
starting with `_`) are the trajectory's tools, on top of `tools.functions`, and one that raises answers
`{"error": message}` (TRL's); `get_reward()`, when it has one, is one more reward of weight 1
(`environment_reward`); a `done` attribute that is true after a turn's calls ends the trajectory; `close()`, when it
has one, runs when the trajectory ends, whatever ended it (the instance's attributes stay readable, so a reward
function receiving `environments=` can still read its state). Other hubs' environments (OpenEnv, Gymnasium) come
through adapters that are such classes; which hub a spelling names is the connectors' business (cohort/connectors).

`ToolResolution(tools, environment_class)` is the tools section resolved once: its functions, its environment class
(as the run's connector builds it: a TRL class checked, an OpenEnv server's schema read, a gym id's probe made) with
its tools' schemas, the schemas the prompts show, and the reward
spec the environment adds. Each is resolved on first use and kept, so the config check, the prompts' tools block and
the tool loop share one resolution (a run carries it in its plan: cohort/plan/run_environment.py).

Left out: tools with side effects shared across trajectories are the user's business (each call runs on its own
thread); schemas written by hand (the function's signature is the schema).
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from transformers.utils import get_json_schema

from cohort.config.module_names import import_failure

RESERVED_METHODS = ("reset", "close", "get_reward")
SOCKET_TIMEOUT_SHARE = 0.9  # a server's answer is awaited for this share of tools.timeout_s: the session fails first
DEFAULT_TIMEOUT_S = 10.0  # a server's schema is read within this when tools.timeout_s is not a time (its check says so)


def import_object(path: str, what: str) -> Any:
    """The object at `path` (`module.name` or `module:name`); a ValueError saying what is wrong otherwise."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"{what} {path!r} is not an import path; write 'my_module.name' or 'my_module:name'")
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - a missing module, or the user's module raising as it imports
        raise ValueError(f"{what} {path!r}: {import_failure(module_name, exc)}") from exc
    for part in attr.split("."):
        if not hasattr(target, part):
            close = difflib.get_close_matches(part, [n for n in dir(target) if not n.startswith("_")], n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(repr(f'{module_name}.{c}') for c in close)}?" if close else ""
            raise ValueError(f"{what} {path!r}: module {module_name!r} has no attribute {attr!r}{hint}")
        target = getattr(target, part)
    return target


def tool_schema(function: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The function's JSON schema as transformers builds it ({"type": "function", "function": {...}})."""
    label = name or getattr(function, "__name__", repr(function))
    given = getattr(function, "__tool_schema__", None)  # a schema the tool brings (an MCP tool's: cohort/tools/openenv.py)
    if given is not None:
        return copy.deepcopy(given)
    try:
        schema = get_json_schema(function)
    except Exception as exc:  # noqa: BLE001 - transformers raises several kinds; all mean the same to the user
        raise ValueError(f"tool {label!r}: no JSON schema can be built from its signature and docstring ({exc}). A tool "
                         "needs a type hint on every argument and a docstring with an 'Args:' entry for each") from exc
    if name:
        schema["function"]["name"] = name
    return schema


@dataclass(frozen=True)
class Tool:
    """One callable tool: its name, the function, its schema."""

    name: str
    function: Callable[..., Any]
    schema: dict[str, Any]
    environment: bool = False  # an environment's method: an exception becomes its result {"error": message} (TRL's)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function)


def resolve_tools(specs: Sequence[str | Callable[..., Any]]) -> list[Tool]:
    """`tools.functions` entries (import paths or callables) as Tools; a duplicate name or a bad entry raises."""
    tools, seen = [], set()
    for i, spec in enumerate(specs):
        function = import_object(spec, f"tools.functions[{i}]") if isinstance(spec, str) else spec
        if not callable(function):
            raise ValueError(f"tools.functions[{i}] = {spec!r} is a {type(function).__name__}, not a function")
        tool = Tool(function.__name__, function, tool_schema(function))
        if tool.name in seen:
            raise ValueError(f"tools.functions: two tools are named {tool.name!r}; tool names must be unique")
        seen.add(tool.name)
        tools.append(tool)
    return tools


def environment_schemas(cls: type | None) -> list[dict[str, Any]]:
    """The public methods' schemas of a resolved environment class ([] for none), built once to check them."""
    return [] if cls is None else [tool_schema(method, name) for name, method in environment_methods(cls).items()]


def checked_class(spec: str | type, cls: Any) -> type:
    """A TRL `environment_factory` class, refused (ValueError with the fix) when it is none."""
    if not inspect.isclass(cls):
        raise ValueError(f"tools.environment = {spec!r} is a {type(cls).__name__}, not a class")
    if not callable(getattr(cls, "reset", None)):  # (TRL refuses it too)
        raise ValueError(f"tools.environment {cls.__name__} has no reset method; add `def reset(self, **kwargs)` (called "
                         "at the start of each episode with the row's columns; it may return the first observation)")
    if not environment_methods(cls):
        raise ValueError(f"tools.environment {cls.__name__}: no public method to offer as a tool (methods other than "
                         f"{RESERVED_METHODS} whose names do not start with '_')")
    return cls


def environment_methods(owner: Any) -> dict[str, Callable[..., Any]]:
    """The public methods of an environment class or instance, by name (bound when `owner` is an instance)."""
    out = {}
    for name in dir(owner):
        if name.startswith("_") or name in RESERVED_METHODS:
            continue
        member = getattr(owner, name)
        if inspect.isfunction(member) or inspect.ismethod(member):
            out[name] = member
    return out


def environment_tools(instance: Any) -> list[Tool]:
    """An environment instance's tools: its public methods, bound to it."""
    return [Tool(name, method, tool_schema(method, name), environment=True)
            for name, method in environment_methods(instance).items()]


def environment_reward(completions: list[Any], environments: list[Any], **kwargs: Any) -> list[float | None]:
    """The environment's own reward: each trajectory's `environment.get_reward()` (None without an environment)."""
    return [env.get_reward() if env is not None else None for env in environments]


def environment_reward_specs(environment: type | None) -> list[dict[str, Any]]:
    """The reward spec a resolved environment class adds to the run's rewards ([] without `get_reward()`; an OpenEnv or
    gym adapter has one)."""
    if environment is None or not callable(getattr(environment, "get_reward", None)):
        return []
    return [{"name": environment_reward, "weight": 1.0, "alias": "environment"}]


class ToolResolution:
    """The tools section resolved once, on first use (module docstring); each method raises the ValueError its
    resolution raised (not kept: asked again, it tries again). `environment_class(timeout_s)`: the run's environment
    as its connector builds it (cohort/plan/run_environment.py); None: no environment."""

    def __init__(self, tools, environment_class: Callable[[float], type | None] | None = None):
        self.tools = tools
        self._environment_class = environment_class
        self._functions: list[Tool] | None = None
        self._environment: tuple[type | None, list[dict[str, Any]]] | None = None

    def functions(self) -> list[Tool]:
        """tools.functions as Tools."""
        if self._functions is None:
            self._functions = resolve_tools(self.tools.functions)
        return self._functions

    def environment(self) -> type | None:
        """The environment's class (None without one); a server's messages wait tools.timeout_s × SOCKET_TIMEOUT_SHARE."""
        if self._environment is None:
            timeout = self.tools.timeout_s * SOCKET_TIMEOUT_SHARE if self.tools.timeout_s > 0 else DEFAULT_TIMEOUT_S
            if self._environment_class is None and self.tools.environment is not None:
                raise RuntimeError(f"tools.environment = {self.tools.environment!r} has no connector here: resolve it through the "
                                 "run's environment (cohort.plan.run_environment.RunEnvironment(cfg).tools)")
            cls = self._environment_class(timeout) if self._environment_class is not None else None
            self._environment = cls, environment_schemas(cls)
        return self._environment[0]

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's schema: tools.functions', then the environment's public methods' (as its instances offer them)."""
        self.environment()
        return [tool.schema for tool in self.functions()] + self._environment[1]

    def shown(self) -> list[dict[str, Any]] | None:
        """The schemas a tools run shows the model in every prompt (TRL's `apply_chat_template(..., tools=)`); None when
        no tools are set or tools.in_prompt is false."""
        return self.schemas() if self.tools.enabled and self.tools.in_prompt else None

    def reward_specs(self) -> list[dict[str, Any]]:
        """The environment's reward spec (`environment_reward_specs`; [] without an environment)."""
        return environment_reward_specs(self.environment()) if self._environment_class is not None else []

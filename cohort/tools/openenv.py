"""OpenEnv environments in the tool loop: an adapter that presents an OpenEnv `reset()`/`step(Action)` environment as a
tool-loop environment (one instance per trajectory, public methods as tools), so OpenEnv needs no second rollout path.

    tools:
      environment: my_module.GuessEnv      # an openenv Environment subclass, run in this process
      environment: ws://127.0.0.1:8000     # or a running OpenEnv server, one WebSocket session per trajectory

What the model sees: `reset(**row)` is the environment's reset with the row's columns it accepts (its signature's
parameters; the server drops the others itself), its observation rendered as text (the one field besides `done`,
`reward`, `metadata`, or all of them as JSON; None ones left out) and appended to the prompt like any environment's first observation;
one tool, `step`, whose arguments are the Action model's fields (its JSON schema: `metadata` left out), whose result
is the next observation rendered the same way. `done` ends the trajectory (the loop reads the instance's `done`).
`get_reward()` is the sum of the episode's rewards (None ones skipped), one more reward of weight 1; a failed episode
has no reward (None: it trains nothing unless another reward function scores it).

Served environments speak the `/ws` protocol only (`{"type": "reset"|"step"|"close", "data": ...}` answered by
`{"type": "observation"|"error", "data": ...}`): the HTTP `/reset` and `/step` routes build a fresh environment per
request and lose the episode, so `http://` URLs are refused. The client here is `websockets`' own synchronous one,
not openenv's (whose reconnect behaviour differs between 0.3 and 0.10): it never reconnects, so a server that dropped
or restarted fails the episode instead of silently starting a fresh one. Every message waits at most
`timeout_s` (tools.timeout_s). A connection that cannot be made, drops or times out raises `EnvironmentLost`: the
tool loop fails that episode with the reason and the step (the run stops with its last checkpoint saved; `cohort
train --resume` continues once the server is back). An error the environment itself raised (in-process, or the
server's EXECUTION_ERROR) fails only that episode, with the environment's message.

Concurrency: a server refuses sessions past its `max_concurrent_envs` (CAPACITY_REACHED, default 1).
`check_capacity` opens as many sessions as the run keeps trajectories in flight before training and refuses with
the fix (a `ConfigError`: `cohort train` exits 2 before any weights load, as for any config problem). In-process, each
trajectory builds its own instance.

MCP environments (openenv's `MCPEnvironment`, served with `CallToolAction`/`CallToolObservation`, as OpenEnv's
`echo_env` and `finqa_env` are): their tools are read with a `list_tools` action (one session, before anything
loads) and each is offered to the model as its own tool, under its own name, with its own input schema and the
first paragraph of its description; a call is a `call_tool` step on the episode's session. The model reads the
tool's text content (or its data as JSON); a tool error (`error`, or a result marked `is_error`) is read as
`error: <message>`, and the episode goes on, as MCP clients see it. Rewards and `done` are the observations', as for
any OpenEnv environment (an MCP environment sets them in its own `step`, e.g. on a `submit_answer` call). An
observation with no field of its own (a bare `Observation`: only `done`, `reward`, `metadata`, which the server does
not send) shows nothing.

Left out: the `/mcp` JSON-RPC route (the `/ws` session carries the same actions), Docker images and Hugging Face
Spaces (start the server yourself and give its URL), observations that are not JSON (images are passed as their JSON).
"""

from __future__ import annotations

import inspect
import json
import typing
import urllib.request
from typing import Any

from cohort.config import ConfigError
from cohort.tools.session_episode import EnvironmentLost, SessionEpisode


SCHEMES = ("ws://", "wss://")
HTTP_SCHEMES = ("http://", "https://")
SKIPPED_FIELDS = ("metadata",)  # Action fields not offered to the model
OBSERVATION_EXTRAS = ("done", "reward", "metadata")
CLOSE_TIMEOUT_S = 1.0  # a session's close waits at most this for the server's answer (a frozen server: not 10 s each)
MCP_RESULT_FIELDS = ("tool_name", "result", "error")  # a CallToolObservation's own fields
MCP_RESERVED = ("reset", "close", "get_reward", "done", "rewards", "failure", "observation", "source", "timeout_s")
JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def is_server_url(spec: Any) -> bool:
    return isinstance(spec, str) and spec.startswith(SCHEMES + HTTP_SCHEMES)


def is_mcp_class(env_cls: type) -> bool:
    """An openenv `MCPEnvironment` subclass: its actions are MCP's list_tools / call_tool."""
    try:
        from openenv.core.env_server.mcp_environment import MCPEnvironment
    except ImportError:
        return False
    return issubclass(env_cls, MCPEnvironment)


def is_mcp_schema(action_schema: dict[str, Any]) -> bool:
    """A served environment's Action schema is MCP's CallToolAction (or a subclass): a tool name and its arguments."""
    return {"tool_name", "arguments"} <= set(action_schema.get("properties", {}))


def is_openenv_class(obj: Any) -> bool:
    """An openenv `Environment` subclass (False when openenv is not installed)."""
    try:  # optional dependency: only OpenEnv users have it
        from openenv.core.env_server.interfaces import Environment
    except ImportError:
        return False
    return inspect.isclass(obj) and issubclass(obj, Environment)


# ------------------------------------------------------------------ the Action's fields as the `step` tool

def action_class(env_cls: type) -> type:
    """The Action model of an in-process environment: `step`'s `action` annotation, else the first type argument of
    its `Environment[Action, Observation, State]` base."""
    try:
        hints = typing.get_type_hints(env_cls.step)
    except Exception:  # noqa: BLE001 - unresolvable annotations: try the base's type arguments
        hints = {}
    candidates = [hints.get("action")] + [a for base in getattr(env_cls, "__orig_bases__", ()) for a in typing.get_args(base)[:1]]
    for candidate in candidates:
        if inspect.isclass(candidate) and hasattr(candidate, "model_json_schema"):
            return candidate
    raise ValueError(f"tools.environment {env_cls.__name__}: cannot tell its Action class; annotate `def step(self, action: "
                     "MyAction, ...)` or subclass `Environment[MyAction, MyObservation, MyState]`")


def step_signature(action_schema: dict[str, Any], what: str) -> tuple[inspect.Signature, dict[str, Any], str]:
    """(signature, annotations, docstring) of the `step` tool from the Action's JSON schema."""
    properties = {k: v for k, v in action_schema.get("properties", {}).items() if k not in SKIPPED_FIELDS}
    if not properties:
        raise ValueError(f"tools.environment {what}: its Action has no field to offer the model as `step` arguments")
    required = set(action_schema.get("required", ()))
    params, annotations, lines = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)], {}, []
    for name, prop in sorted(properties.items(), key=lambda item: item[0] not in required):
        kind = JSON_TYPES.get(prop.get("type"), Any)
        default = inspect.Parameter.empty if name in required else prop.get("default")
        params.append(inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=kind))
        annotations[name] = kind
        lines.append(f"        {name}: {prop.get('description') or prop.get('title') or name}")
    title = action_schema.get("description") or f"Take one step of the environment with a {action_schema.get('title', 'action')}."
    doc = f"{title.strip().splitlines()[0]}\n\n    Args:\n" + "\n".join(lines) + "\n"
    return inspect.Signature(params), annotations, doc


def render(result: dict[str, Any]) -> str:
    """An observation as the model reads it: its one field's value, or its fields as JSON, fields that are None left out
    (an observation whose `question` is set on reset and `score`, `correct_answer` on the step reads as the question,
    then as the other two); an MCP tool call's result as its text (`render_tool_result`); "" for an observation with
    no field set."""
    fields = {k: v for k, v in result["observation"].items() if k not in OBSERVATION_EXTRAS}
    if set(MCP_RESULT_FIELDS) <= set(fields):
        return render_tool_result(fields)
    fields = {k: v for k, v in fields.items() if v is not None}  # (a field unset this step: OpenEnv's reasoning_gym_env)
    if not fields:
        return ""
    if len(fields) == 1:
        value = next(iter(fields.values()))
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(fields, default=str)


def render_tool_result(fields: dict[str, Any]) -> str:
    """A CallToolObservation's fields as the model reads them: `error: <message>` for a framework error (bad arguments,
    unknown tool, timeout) or a result marked `is_error`; else the result's text content, or its data as JSON."""
    error, result = fields.get("error"), fields.get("result")
    if error:
        return f"error: {error.get('message', error) if isinstance(error, dict) else error}"
    if not isinstance(result, dict):
        return "" if result is None else (result if isinstance(result, str) else json.dumps(result, default=str))
    texts = [item.get("text", "") for item in result.get("content") or [] if isinstance(item, dict) and item.get("type") == "text"]
    text = "\n".join(texts) if texts else json.dumps(result.get("data", result), default=str)
    return f"error: {text}" if result.get("is_error") or result.get("isError") else text


def mcp_tool_method(tool: dict[str, Any]):
    """The episode's method for one MCP tool (`list_tools`' {name, description, input_schema}): a `call_tool` step.
    Its schema is the tool's own (`__tool_schema__`, read by cohort/tools/tool_schemas.py), the description cut to its
    first paragraph; the server checks the arguments (a bad one comes back as the tool's error)."""
    name = tool["name"]

    def call(self, **arguments: Any) -> str:
        return self._act({"type": "call_tool", "tool_name": name, "arguments": arguments})

    summary = (tool.get("description") or name).strip().split("\n\n")[0].strip()
    parameters = dict(tool.get("input_schema") or {"type": "object", "properties": {}})
    parameters.setdefault("type", "object")
    parameters.setdefault("properties", {})
    call.__name__, call.__doc__ = name, summary
    call.__tool_schema__ = {"type": "function", "function": {"name": name, "description": summary, "parameters": parameters}}
    return call


def mcp_tool_methods(open_session, what: str) -> dict[str, Any]:
    """{tool name: method} for an MCP environment: its tools read with one `list_tools` action on a session of its
    own; ValueError when it lists none or a name would hide the episode's own methods."""
    session = open_session()
    try:
        tools = session.step({"type": "list_tools"})["observation"].get("tools") or []
    finally:
        session.close()
    if not tools:
        raise ValueError(f"tools.environment {what}: an MCP environment that lists no tools (list_tools answered none); "
                         "register them with @mcp.tool on the FastMCP server it passes to MCPEnvironment")
    clashes = sorted(t["name"] for t in tools if t["name"] in MCP_RESERVED or t["name"].startswith("_"))
    if clashes:
        raise ValueError(f"tools.environment {what}: MCP tool(s) {clashes} would take the name of the episode's own "
                         f"method or hide it (reserved: {', '.join(MCP_RESERVED)}, and names starting with '_'); rename them")
    return {tool["name"]: mcp_tool_method(tool) for tool in tools}


# ------------------------------------------------------------------ sessions: in-process and over /ws

class LocalSession:
    """One in-process environment instance."""

    def __init__(self, env_cls: type, action_cls: type):
        self.env, self.action_cls = env_cls(), action_cls

    def reset(self, row: dict[str, Any]) -> dict[str, Any]:
        parameters = inspect.signature(self.env.reset).parameters
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            row = {k: v for k, v in row.items() if k in parameters}  # (as the server's _get_valid_kwargs does)
        return _as_result(self.env.reset(**row))

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.env_server.serialization import deserialize_action  # (the server's reading: MCP actions routed)

        return _as_result(self.env.step(deserialize_action(action, self.action_cls)))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()


def _as_result(observation: Any) -> dict[str, Any]:
    """An Observation as the wire carries it: {observation: fields, reward, done}."""
    fields = observation.model_dump(mode="json", exclude=set(OBSERVATION_EXTRAS))  # (as the server sends it)
    return {"observation": fields, "reward": observation.reward, "done": bool(observation.done)}


class SocketSession:
    """One WebSocket session with an OpenEnv server (`/ws`); never reconnects (module docstring)."""

    def __init__(self, url: str, timeout_s: float):
        from websockets.sync.client import connect  # (websockets comes with openenv)

        self.url, self.timeout_s = url, timeout_s
        try:
            # (entered by hand: the session outlives this call; close() ends it)
            self.ws = connect(f"{url.rstrip('/')}/ws", open_timeout=timeout_s, close_timeout=CLOSE_TIMEOUT_S,
                              max_size=100 * 2**20).__enter__()
        except Exception as exc:  # noqa: BLE001 - refused, unreachable, bad handshake: all mean no session
            raise EnvironmentLost(f"cannot open a session at {url}/ws: {type(exc).__name__}: {exc}") from exc

    def call(self, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            self.ws.send(json.dumps({"type": kind, "data": data or {}}, default=str))
            reply = json.loads(self.ws.recv(timeout=self.timeout_s))
        except TimeoutError as exc:
            raise EnvironmentLost(f"the OpenEnv server at {self.url} sent no answer to {kind!r} in {self.timeout_s:g} s") from exc
        except (ConnectionClosed, OSError) as exc:
            raise EnvironmentLost(f"the connection to the OpenEnv server at {self.url} dropped during {kind!r} "
                                  f"({type(exc).__name__}: {exc})") from exc
        if reply.get("type") == "error":
            error = reply.get("data", {})
            if error.get("code") == "CAPACITY_REACHED":
                raise EnvironmentLost(f"the OpenEnv server at {self.url} refused a session: {error.get('message')} "
                                      "(CAPACITY_REACHED)")
            raise RuntimeError(f"the environment failed: {error.get('message')} ({error.get('code')})")
        return reply.get("data", {})

    def reset(self, row: dict[str, Any]) -> dict[str, Any]:
        return self.call("reset", row)

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        return self.call("step", action)

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        except Exception:  # noqa: BLE001 - best effort: the server may be gone
            pass
        self.ws.close()


# ------------------------------------------------------------------ the adapter

class OpenEnvEpisode(SessionEpisode):
    """One OpenEnv episode as a tool-loop environment (module docstring; the bookkeeping is
    cohort/tools/session_episode.py's). Subclasses made by `openenv_environment` set `_open_session` (a LocalSession
    or SocketSession) and the `step` tool (or the MCP tools)."""

    def _render(self, result: dict[str, Any]) -> str:
        return render(result)


def _step_method(signature: inspect.Signature, annotations: dict[str, Any], doc: str):
    def step(self, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(self, *args, **kwargs)
        return self._act({k: v for k, v in bound.arguments.items() if k != "self"})

    step.__signature__ = signature
    step.__annotations__ = dict(annotations, **{"return": str})
    step.__doc__ = doc
    return step


def openenv_environment(spec: Any, timeout_s: float = 10.0) -> type:
    """The tool-loop environment class for an OpenEnv class or server URL (`tools.environment`)."""
    if is_server_url(spec):
        if spec.startswith(HTTP_SCHEMES):
            raise ValueError(f"tools.environment = {spec!r}: write the server as ws://host:port (wss:// with TLS): cohort runs "
                             "each episode over the server's WebSocket session (/ws); its HTTP /reset and /step build a "
                             "fresh environment per request and lose the episode")
        url = spec.rstrip("/")
        schema = server_schema(url, timeout_s)
        name, opener = f"OpenEnv({url})", lambda timeout: SocketSession(url, timeout)
        mcp = is_mcp_schema(schema)
    else:
        mcp = is_mcp_class(spec)
        if mcp:
            from openenv.core.env_server.mcp_types import CallToolAction

        action_cls = CallToolAction if mcp else action_class(spec)
        schema = action_cls.model_json_schema()
        name, opener = spec.__name__, lambda timeout: LocalSession(spec, action_cls)
    if mcp:  # each MCP tool a tool of its own
        methods = mcp_tool_methods(lambda: opener(timeout_s), name)
    else:
        methods = {"step": _step_method(*step_signature(schema, name))}
    return type(f"OpenEnvEpisode[{name}]", (OpenEnvEpisode,),
                {"source": name, "timeout_s": timeout_s, "_open_session": lambda self: opener(self.timeout_s), **methods,
                 "__module__": __name__, "__doc__": f"One episode of {name} (cohort.tools.openenv)."})


def http_url(url: str) -> str:
    return "http" + url[len("ws"):] if url.startswith("ws") else url


def server_schema(url: str, timeout_s: float) -> dict[str, Any]:
    """The server's Action JSON schema (GET /schema)."""
    try:
        with urllib.request.urlopen(f"{http_url(url)}/schema", timeout=timeout_s) as response:  # noqa: S310 - the user's URL
            return json.loads(response.read())["action"]
    except Exception as exc:  # noqa: BLE001 - unreachable, not an OpenEnv server: the same fix
        raise ValueError(f"tools.environment = {url!r}: cannot read the OpenEnv server's action schema at "
                         f"{http_url(url)}/schema ({type(exc).__name__}: {exc}); is the server running (e.g. `uvicorn "
                         "my_env.server.app:app --port 8000`)?") from exc


def check_capacity(url: str, sessions: int, timeout_s: float, why: str) -> None:
    """Open `sessions` WebSocket sessions at once; raise ConfigError with the fix when the server refuses any (a
    problem of the run's setup, found before any weights load: the command line exits 2, as for any config problem)."""
    opened, refused, reason = [], 0, ""
    try:
        for _ in range(sessions):
            session = SocketSession(url, timeout_s)
            opened.append(session)
            try:
                session.call("state")
            except EnvironmentLost as exc:
                refused, reason = refused + 1, str(exc)
            except RuntimeError:
                pass  # the session exists; its environment has no readable state
    finally:
        for session in opened:
            session.close()
    if refused:
        raise ConfigError([
            f"tools.environment = {url!r}: the OpenEnv server accepted {sessions - refused} of the {sessions} concurrent "
            f"sessions this run keeps open ({why}): {reason}. Serve it with `create_app(MyEnv, MyAction, MyObservation, "
            f"max_concurrent_envs={sessions})` and set `SUPPORTS_CONCURRENT_SESSIONS = True` on the environment class "
            "(only if its instances share no state), or lower train.prompts_per_step"])

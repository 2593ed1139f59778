"""Gymnasium text environments in the tool loop: an adapter that presents a `gymnasium.Env` whose observations are
text as a tool-loop environment (one `gymnasium.make` per trajectory, one `step` tool), so Gymnasium needs no rollout
path of its own. The spellings of `tools.environment` (anything after `gym:` that `gymnasium.make` takes, or a class):

    tools:
      environment: gym:Hangman-v0                 # an id registered with gymnasium.register (its module imported)
      environment: gym:my_games:Hangman-v0        # gymnasium's own "module:id": import my_games (it registers), then make
      environment: gym:my_games.HangmanEnv        # a gymnasium.Env subclass by import path, made without registering
      environment: my_games.HangmanEnv            # the same (TRL's spelling; a run's saved config names a class so)

Each trajectory's environment is `gymnasium.make(spec)` as users make it, so the registered wrappers apply:
TimeLimit from `max_episode_steps` (truncation), the passive env checker, order enforcing. An unregistered class is
made from an `EnvSpec` of its own (no TimeLimit: `tools.max_turns` bounds it).

What the model sees: `reset(**row)` is `env.reset(seed=row["seed"], options=<the row's other columns but the
prompt>)` (seed None and options None when the row has none), its observation appended to the prompt after a blank
line (TRL's rule, cohort/tools/loop.py). The text is the observation itself for a `spaces.Text` observation space,
else `env.render()` of an environment made with `render_mode="ansi"` (Gymnasium's text rendering: FrozenLake, Taxi,
CliffWalking); any other environment is refused. One tool, `step(action)`: for a `spaces.Text` action space the
model writes the action as a string, for `spaces.Discrete(n, start)` its number; an action outside the space is not
stepped, and the model is told why (its mistake, not a failure, like a bad tool argument). The answer is the next
observation as text. `terminated` or `truncated` ends the trajectory (the adapter's `done`; both are kept on the
instance, with the last `info`). `get_reward()` is the episode's rewards summed, one more reward of weight 1
(`environment`), as for OpenEnv: the episode bookkeeping is `cohort.tools.session_episode.SessionEpisode`'s. An exception
from `gymnasium.make`, `reset` or `step` fails that episode only (status error, the message recorded, no reward).

Left out: other action spaces (Box, MultiDiscrete, Dict: no text form a model can write), `info` shown to the model,
vector environments, `gymnasium.make` keyword arguments in the config (register an id with `kwargs=` instead, as
Gymnasium users do), the reply itself as the action (the tool loop's turns end at a reply without a call).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from typing import Any

from cohort.tools.session_episode import SessionEpisode

try:  # optional dependency: only Gymnasium users have it (is_gym_spec and env_spec say so without it)
    import gymnasium
    from gymnasium import spaces
except ImportError:
    gymnasium = spaces = None

PREFIX = "gym:"
FIRST_OBSERVATION_SEPARATOR = "\n\n"  # Gymnasium observations are not written as prompt suffixes: a blank line first
SKIPPED_COLUMNS = ("seed", "prompt")  # the row's columns that are not reset's `options`


def is_gym_spec(spec: Any) -> bool:
    """`gym:<id or class path>`, a gymnasium.Env subclass (from Python), or its import path without `gym:` (how a
    run's saved config names a class given from Python: `--resume` must find the same environment)."""
    if isinstance(spec, str) and spec.startswith(PREFIX):
        return True
    if gymnasium is None:
        return False
    if isinstance(spec, str):
        return _env_class("", spec)[0] is not None
    return inspect.isclass(spec) and issubclass(spec, gymnasium.Env)


# ------------------------------------------------------------------ the spelling -> an EnvSpec, checked

def env_spec(spec: str | type) -> Any:
    """The `gymnasium.EnvSpec` the spelling names; a ValueError with the fix, before anything loads, otherwise."""
    if gymnasium is None:
        raise ValueError(f"tools.environment = {spec!r} needs gymnasium: pip install 'gymnasium>=1.0'")
    if not isinstance(spec, str) or not spec.startswith(PREFIX):  # a class, or its import path (is_gym_spec)
        cls = spec if not isinstance(spec, str) else _env_class("", spec)[0]
        return gymnasium.envs.registration.EnvSpec(id=cls.__name__, entry_point=cls)
    text = spec[len(PREFIX):]
    if not text:
        raise ValueError(f"tools.environment = {spec!r}: write gym:<id> (an id registered with gymnasium.register), "
                         "gym:<module>:<id> (import the module that registers it) or gym:<module>.<Env class>")
    module, _, env_id = text.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ValueError(f"tools.environment = {spec!r}: cannot import {module!r} ({exc}); is it on PYTHONPATH?") from exc
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        not_registered = str(exc).rstrip(".")
    cls, why = _env_class(module, env_id)
    if cls is not None:
        return gymnasium.envs.registration.EnvSpec(id=cls.__name__, entry_point=cls)
    if why is None:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.6)
        why = not_registered + (f"; closest registered: {', '.join(close)}" if close else
                                "" if module else "; import the module that registers it: gym:<module>:<id>")
    raise ValueError(f"tools.environment = {spec!r}: {why}")


def _env_class(module: str, name: str) -> tuple[type | None, str | None]:
    """`module:Class` or `package.module.Class` as a gymnasium.Env subclass: (the class,
    None), or (None, why) when the module imports but holds no such class, or (None, None) when it is no import path."""
    if not module:
        module, _, name = name.rpartition(":" if ":" in name else ".")
    if not module or not name.isidentifier():
        return None, None
    try:
        target = importlib.import_module(module)
    except (ImportError, ValueError):  # (no such module, or not a module name: not an import path here)
        return None, None
    except Exception as exc:  # the module raised as it imported (a missing API key): not gym's to word, but say it
        return None, f"importing {module!r} raised {type(exc).__name__}: {exc}"
    cls = getattr(target, name, None)
    if inspect.isclass(cls) and issubclass(cls, gymnasium.Env):
        return cls, None
    if cls is not None:
        return None, f"{module}.{name} is a {type(cls).__name__}, not a gymnasium.Env subclass"
    envs = [n for n, v in vars(target).items() if inspect.isclass(v) and issubclass(v, gymnasium.Env)]
    close = difflib.get_close_matches(name, envs, n=3, cutoff=0.5)
    hint = f"; closest: {', '.join(f'{module}.{c}' for c in close)}" if close else ""
    return None, f"no registered id {name!r} and no gymnasium.Env subclass {name!r} in {module!r}{hint}"


def text_source(env: Any, what: str) -> str:
    """Where an environment's text comes from: "observation" (a Text observation space), "ansi" (render_mode="ansi"
    renders it), or a ValueError with the fix."""
    if isinstance(env.observation_space, spaces.Text):
        return "observation"
    if "ansi" in (env.metadata or {}).get("render_modes", ()):
        return "ansi"
    raise ValueError(f"{what}: its observations are {env.observation_space}, not text, and it "
                     "has no 'ansi' render mode; give it a gymnasium.spaces.Text observation space (or render_mode 'ansi' "
                     "returning text)")


def action_doc(space: Any, what: str) -> tuple[type, str]:
    """(the `action` argument's type, its description) for a Text or Discrete action space; a ValueError otherwise."""
    if isinstance(space, spaces.Text):
        chars = "".join(sorted(space.character_set))
        return str, (f"your move as text, {space.min_length} to {space.max_length} characters"
                     + (f" from {chars!r}" if len(chars) <= 64 else ""))
    if isinstance(space, spaces.Discrete):
        first = int(space.start)
        return int, f"the number of your move, {first} to {first + int(space.n) - 1}"
    raise ValueError(f"{what}: its action space is {space}; the model can write actions of a "
                     "gymnasium.spaces.Text (as text) or spaces.Discrete (as its number) space only")


# ------------------------------------------------------------------ one episode

class GymSession:
    """One `gymnasium.make` environment, speaking the adapter's results ({observation, reward, done, ...})."""

    def __init__(self, spec: Any, render_ansi: bool):
        self.render_ansi = render_ansi
        self.env = gymnasium.make(spec, render_mode="ansi") if render_ansi else gymnasium.make(spec)

    def reset(self, row: dict[str, Any]) -> dict[str, Any]:
        seed = row.get("seed")
        options = {k: v for k, v in row.items() if k not in SKIPPED_COLUMNS} or None
        observation, info = self.env.reset(seed=None if seed is None else int(seed), options=options)
        return self._result(observation, None, False, False, info)

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        value, space = action["action"], self.env.action_space
        if isinstance(value, str) and isinstance(space, spaces.Discrete) and value.strip().lstrip("-").isdigit():
            value = int(value)  # (a parser that reads every argument as text)
        if not space.contains(value):
            return {"observation": {"text": f"invalid action {value!r}: not in {space}; nothing happened"},
                    "reward": None, "done": False}
        observation, reward, terminated, truncated, info = self.env.step(value)
        return self._result(observation, reward, bool(terminated), bool(truncated), info)

    def _result(self, observation: Any, reward: Any, terminated: bool, truncated: bool, info: Any) -> dict[str, Any]:
        text = self.env.render() if self.render_ansi else observation
        return {"observation": {"text": str(text)}, "reward": None if reward is None else float(reward),
                "done": terminated or truncated, "terminated": terminated, "truncated": truncated, "info": info}

    def close(self) -> None:
        self.env.close()


class GymEpisode(SessionEpisode):
    """One Gymnasium episode as a tool-loop environment (module docstring); `gym_environment` makes the subclass with
    its spec and `step` tool."""

    spec: Any = None
    render_ansi: bool = False

    def __init__(self):
        super().__init__()
        self.terminated = self.truncated = False
        self.info: Any = None

    def _open_session(self) -> GymSession:
        return GymSession(self.spec, self.render_ansi)

    def reset(self, **row: Any) -> str:
        return FIRST_OBSERVATION_SEPARATOR + super().reset(**row)

    def _render(self, result: dict[str, Any]) -> str:
        return result["observation"]["text"]

    def _record(self, result: dict[str, Any]) -> str:
        self.terminated, self.truncated = result.get("terminated", False), result.get("truncated", False)
        self.info = result.get("info", self.info)
        return super()._record(result)


def _step_tool(kind: type, description: str):
    def step(self, action) -> str:
        return self._act({"action": action})

    step.__annotations__ = {"action": kind, "return": str}
    step.__doc__ = f"Take one move in the game.\n\n    Args:\n        action: {description}\n"
    return step


def gym_environment(spec: str | type, timeout_s: float = 10.0) -> type:
    """The tool-loop environment class for `gym:<id>` or a gymnasium.Env subclass (`tools.environment`): the spec is
    resolved and one environment made now, to check its spaces before any model loads."""
    found = env_spec(spec)
    try:
        probe = gymnasium.make(found)
    except Exception as exc:  # noqa: BLE001 - the environment's own constructor: the user's message, one line
        raise ValueError(f"tools.environment = {spec!r}: gymnasium.make({found.id!r}) raised {type(exc).__name__}: {exc}") from exc
    try:
        render_ansi = text_source(probe, f"tools.environment = {spec!r}") == "ansi"
        kind, description = action_doc(probe.action_space, f"tools.environment = {spec!r}")
    finally:
        probe.close()
    return type(f"GymEpisode[{found.id}]", (GymEpisode,),
                {"source": found.id, "timeout_s": timeout_s, "spec": found, "render_ansi": render_ansi,
                 "step": _step_tool(kind, description), "__module__": __name__,
                 "__doc__": f"One episode of the Gymnasium environment {found.id} (cohort.tools.gym_text)."})

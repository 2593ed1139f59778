"""verifiers (v1, `verifiers>=0.4`) environments as data: `agent.environment: verifiers:<id>` names one, and its tasks
are the run's dataset, one row per task (`task_rows`: `{"prompt": its opening messages, "vf_task": index,
"vf_key": its key}`; the agent checks the key it finds at that index). `check_environment` is what validation asks
before anything loads: the module installed (an unknown id is refused with the closest installed names: verifiers'
built-in tasksets and the top-level modules of installed distributions that depend on verifiers), verifiers'
config valid (an unknown field is named in one line with the fields its config class has: `config_problems`), and a
local runtime for every seat's harness (verifiers' default is Prime's remote sandboxes; a multi-seat environment
declares each seat as an `AgentConfig` field of its own, `agent` for the single-agent one). The episodes themselves
are cohort/agents/verifiers.py's.

Bounds: `agent.num_examples` takes the first N tasks (verifiers' `select.limit`, vf-eval's `-n`), the one way to
bound an infinite taskset whose config has no size field; an infinite taskset without it is refused. A task without
a prompt (a multi-seat game gives each seat its own) gets a placeholder row prompt, its name (`task_messages`).

Left out: the 0.1.x API (gone from 0.4).
"""

from __future__ import annotations

import difflib
import importlib.util
import pkgutil
from importlib import metadata
from typing import Any, get_args

from cohort.config.module_names import distribution_modules

PREFIX = "verifiers:"
REMOTE_RUNTIMES = ("prime", "modal", "e2b")  # runtimes that need a provider's service (and its key)


def environment_id(spec: str) -> str:
    """`verifiers:<id>` -> `<id>` (a module name or `owner/name@version`)."""
    return spec[len(PREFIX):].strip() if spec.startswith(PREFIX) else spec


def module_name(env_id: str) -> str:
    """The module verifiers imports for `env_id` (its loaders' rule: `owner/` and `@version` dropped, `-` -> `_`)."""
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def installed_environments() -> list[str]:
    """Module names that may be verifiers tasksets: verifiers' built-in ones and the top-level modules of installed
    distributions that depend on verifiers."""
    from verifiers.v1 import tasksets  # the optional verifiers package: only verifiers environments need it

    names = {m.name for m in pkgutil.iter_modules(tasksets.__path__)}
    for dist in metadata.distributions():  # (editable installs too: vf-init's hatchling .pth, setuptools' finders)
        if any((req or "").split(";")[0].strip().lower().startswith("verifiers") for req in dist.requires or []):
            names |= distribution_modules(dist)
    return sorted(names)


def _findable(module: str) -> bool:
    for name in (f"verifiers.v1.tasksets.{module}", module):
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def check_environment(spec: str, args: dict[str, Any], num_examples: int | None = None) -> list[str]:
    """Problems with agent.environment / agent.environment_args ([] when fine); an unknown id is refused before
    its module (or anything else) loads."""
    if not spec.startswith(PREFIX):
        return [f"agent.environment = {spec!r}: write verifiers:<module or owner/name@version> (the only kind so far)"]
    try:
        import verifiers.v1  # noqa: F401 - the optional dependency
    except ImportError:
        return [f"agent.environment = {spec!r} needs the verifiers package (pip install 'verifiers>=0.4')"]
    env_id = environment_id(spec)
    module = module_name(env_id)
    if not env_id or not _findable(module):
        close = difflib.get_close_matches(module, installed_environments(), n=3, cutoff=0.5)
        hint = f"; the closest installed: {', '.join(close)}" if close else "; install it first (pip install, or prime env install)"
        return [f"agent.environment = {spec!r}: no verifiers environment module {module!r} is installed{hint}"]
    try:
        config = env_config(spec, args)
    except Exception as exc:  # noqa: BLE001 - verifiers' validation message is the useful part
        return config_problems(spec, exc)
    problems = []
    for seat, agent in seats(config).items():
        runtime = getattr(agent, "runtime", None)
        if getattr(runtime, "type", None) in REMOTE_RUNTIMES:
            problems.append(f"agent.environment = {spec!r}: seat {seat!r} runs its harness in {runtime.type}'s remote "
                            f"sandboxes (verifiers' default); set agent.environment_args.{seat}.runtime.type=subprocess "
                            "to run it here")
    if num_examples is None and _infinite(config):
        problems.append(f"agent.environment = {spec!r}: its taskset is infinite; set agent.num_examples (vf-eval's -n) "
                        "to train on its first N tasks")
    return problems


def seats(config) -> dict[str, Any]:
    """The environment's seats: each `AgentConfig` field of its config by name (`agent` for a single-agent env)."""
    import verifiers.v1 as vf

    return {name: value for name, value in config if isinstance(value, vf.AgentConfig)}


def _infinite(config) -> bool:
    from verifiers.v1.utils.loaders import taskset_class

    return bool(getattr(taskset_class(config.taskset.id), "INFINITE", False))


def config_problems(spec: str, exc: Exception) -> list[str]:
    """verifiers' refusal of agent.environment_args, one line: each wrong field by its path, with the fields its
    config class has and the fix (a pydantic ValidationError; anything else as its type and message)."""
    errors = exc.errors() if hasattr(exc, "errors") and callable(exc.errors) else None
    if not errors:
        return [f"agent.environment = {spec!r} with agent.environment_args: {type(exc).__name__}: {exc}"]
    parts = []
    for error in errors:
        loc = [str(x) for x in error.get("loc", ())]
        where = ".".join(["agent.environment_args", *loc])
        if error.get("type") == "extra_forbidden":
            owner = _config_class(spec, loc[:-1])
            known = f" ({owner.__name__}'s fields: {', '.join(owner.model_fields)})" if owner is not None else ""
            hint = ("; a taskset without a size field is bounded by agent.num_examples (vf-eval's -n)"
                    if loc[:1] == ["taskset"] else "")
            parts.append(f"{where} is not a field{known}: remove it or spell one of those{hint}")
        else:
            parts.append(f"{where}: {error.get('msg')} (got {error.get('input')!r:.60})")
    return [f"agent.environment = {spec!r}: " + "; ".join(parts)]


def _config_class(spec: str, loc: list[str]):
    """The pydantic class of the config at `loc` under the environment's EnvConfig (None when it cannot be told)."""
    from pydantic import BaseModel
    from verifiers.v1.utils.loaders import env_config_type, taskset_config_type

    try:
        cls = env_config_type(environment_id(spec))
        for k, name in enumerate(loc):
            if k == 0 and name == "taskset":
                cls = taskset_config_type(environment_id(spec))
                continue
            annotation = cls.model_fields[name].annotation
            cls = next(t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel))
        return cls
    except Exception:  # noqa: BLE001 - the line is still said, without the field list
        return None


def env_config(spec: str, args: dict[str, Any]):
    """verifiers' EnvConfig for the environment with `args` (its `--env.*` fields as a dict) over it."""
    import verifiers.v1 as vf

    raw = {key: (dict(value) if isinstance(value, dict) else value) for key, value in (args or {}).items()}
    raw["taskset"] = {**(raw.get("taskset") or {}), "id": environment_id(spec)}
    return vf.resolve_env_config(raw)


def task_messages(task) -> list[dict[str, Any]]:
    """A task's opening messages as plain chat messages (system prompt, then the prompt)."""
    data = task.data
    if data.prompt is None:  # a task whose seats get their own prompts (multi-seat games): its name as a placeholder
        return [{"role": "user", "content": data.name or f"task {data.idx}"}]
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        for message in data.prompt or []:
            item = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
            messages.append({"role": item.get("role", "user"), "content": item.get("content") or ""})
    return messages


def load_tasks(spec: str, args: dict[str, Any], num_examples: int | None = None):
    """(the environment, its tasks in order: the first `num_examples` when set); ValueError for an infinite taskset
    without `num_examples`. A run loads them once and carries them (cohort/plan/run_environment.py): its rows and its
    agent's episodes come from the same load."""
    import verifiers.v1 as vf

    env = vf.load_environment(env_config(spec, args))
    taskset = env.taskset.take(num_examples) if num_examples is not None else env.taskset
    if not taskset.bounded:
        raise ValueError(f"agent.environment = {spec!r}: its taskset is infinite; set agent.num_examples (vf-eval's -n)")
    return env, list(taskset)


def task_rows(tasks) -> list[dict[str, Any]]:
    """One dataset row per loaded task (module docstring: "Rows")."""
    return [{"prompt": task_messages(task), "vf_task": i, "vf_key": task.key} for i, task in enumerate(tasks)]


def environment_rows(spec: str, args: dict[str, Any], num_examples: int | None = None) -> list[dict[str, Any]]:
    """The environment loaded and its `task_rows` (for a caller without a run's loaded tasks)."""
    return task_rows(load_tasks(spec, args, num_examples)[1])

"""verifiers (v1, `verifiers>=0.4`) environments as data: `agent.environment: verifiers:<id>` names one, and its tasks
are the run's dataset, one row per task (`environment_rows`: `{"prompt": its opening messages, "vf_task": index,
"vf_key": its key}`; the agent checks the key it finds at that index). `check_environment` is what validation asks
before anything loads: the module installed (an unknown id is refused with the closest installed names: verifiers'
built-in tasksets and the top-level modules of installed distributions that depend on verifiers), verifiers'
config valid, and a local runtime for the harness (verifiers' default is Prime's remote sandboxes). The episodes
themselves are cohort/agents/verifiers.py's.

Left out: infinite tasksets (bound them in agent.environment_args.taskset), the 0.1.x API (gone from 0.4).
"""

from __future__ import annotations

import difflib
import importlib.util
import pkgutil
from importlib import metadata
from typing import Any

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


def check_environment(spec: str, args: dict[str, Any]) -> list[str]:
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
        return [f"agent.environment = {spec!r} with agent.environment_args: {type(exc).__name__}: {exc}"]
    problems = []
    runtime = getattr(getattr(config, "agent", None), "runtime", None)
    if getattr(runtime, "type", None) in REMOTE_RUNTIMES:
        problems.append(f"agent.environment = {spec!r} runs its harness in {runtime.type}'s remote sandboxes "
                        f"(verifiers' default); set agent.environment_args.agent.runtime.type=subprocess to run it here")
    return problems


def env_config(spec: str, args: dict[str, Any]):
    """verifiers' EnvConfig for the environment with `args` (its `--env.*` fields as a dict) over it."""
    import verifiers.v1 as vf

    raw = {key: (dict(value) if isinstance(value, dict) else value) for key, value in (args or {}).items()}
    raw["taskset"] = {**(raw.get("taskset") or {}), "id": environment_id(spec)}
    return vf.resolve_env_config(raw)


def task_messages(task) -> list[dict[str, Any]]:
    """A task's opening messages as plain chat messages (system prompt, then the prompt)."""
    data = task.data
    messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        for message in data.prompt or []:
            item = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
            messages.append({"role": item.get("role", "user"), "content": item.get("content") or ""})
    return messages


def load_tasks(spec: str, args: dict[str, Any]):
    """(the environment, its tasks in order); ValueError for an infinite taskset."""
    import verifiers.v1 as vf

    env = vf.load_environment(env_config(spec, args))
    if not env.taskset.bounded:
        raise ValueError(f"agent.environment = {spec!r}: its taskset is infinite; bound it in its config "
                         "(agent.environment_args.taskset.*)")
    return env, list(env.taskset)


def environment_rows(spec: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    """One dataset row per task (module docstring: "Rows")."""
    _, tasks = load_tasks(spec, args)
    return [{"prompt": task_messages(task), "vf_task": i, "vf_key": task.key} for i, task in enumerate(tasks)]

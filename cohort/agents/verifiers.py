"""verifiers (v1, `verifiers>=0.4`) environments as agent runs: `agent.environment: verifiers:<id>`.

To cohort a verifiers environment is an agent whose episodes verifiers runs against the loopback endpoint
(cohort/agents/engine.py): `VerifiersAgent(client, row)` plays row's task as one episode through verifiers' own
in-process path, the one `vf-eval` runs (`load_environment(config)`, then `Env.serving()` once and
`Env.run_episode(task, ModelContext(model, EvalClientConfig(base_url)))` per episode): its harness program talks to
verifiers' interception server, whose eval client relays each call, streamed, to cohort's endpoint with `X-Session-ID`
= the trace id. The agent joins each trace id to its run as verifiers mints it (`join_session`, before any call), so
every call lands in the run's ledger and the run's trajectory is the tokens cohort sampled. The episode's reward (the
trace's weighted `@vf.reward` sum; the mean over its traces when an environment plays several seats) is the run's
reward, each named reward its `agent/<name>` metric.

Why the eval client and not verifiers' train client (prime-rl's, `POST /inference/v1/generate` with client-side
tokenization): cohort already records token ids, log-probs and policy versions at its endpoint, so the text
endpoint loses nothing, and the train client needs a `renderers` map entry for each model's template, which a
checkpoint of one's own lacks.

Failures: an episode that ends with errors (the environment raised, the endpoint answered an error, the harness
program failed) raises `EpisodeFailed` with verifiers' messages; the run's `AgentRun.error` keeps it, `verifiers_reward`
gives that run no reward (None: advantage 0) instead of stopping training, and `agent/failed` counts it.

What this machine must give (`check_environment` says which, before anything loads): the environment's module
installed (an unknown id is refused with the closest installed names); a local runtime (verifiers' default for the
harness is Prime's remote sandboxes: `agent.environment_args.agent.runtime.type: subprocess`); the harness's program,
which verifiers prepares with `uv sync --script`: without `uv`, the chat harnesses (`null`, `bash`) run on this
interpreter when it has their dependencies.

Rows: one per task of the taskset (`environment_rows`), `{"prompt": its messages, "vf_task": index, "vf_key": key}`;
the agent checks the key it finds at that index. Left out: infinite tasksets, the 0.1.x API (gone from 0.4),
pushing results to Prime's platform (nothing is pushed).
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import importlib.util
import pkgutil
import shutil
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Sequence

from cohort.agents.sessions import join_session

PREFIX = "verifiers:"
REMOTE_RUNTIMES = ("prime", "modal", "e2b")  # runtimes that need a provider's service (and its key)
API_KEY_VAR = "COHORT_VERIFIERS_API_KEY"  # the eval client's key variable: unset is fine ("EMPTY"); runs are told apart by X-Session-ID


class EpisodeFailed(RuntimeError):
    """A verifiers episode ended with errors; the message is verifiers' own."""


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
    modules_of = metadata.packages_distributions()  # module -> distributions
    dependents = set()
    for dist in metadata.distributions():
        if any((req or "").split(";")[0].strip().lower().startswith("verifiers") for req in dist.requires or []):
            dependents.add(dist.metadata["Name"])
    names |= {module for module, dists in modules_of.items() if dependents.intersection(dists)}
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


def use_this_interpreter_for_chat_programs() -> None:
    """Without `uv`: verifiers' chat harness program (null, bash) runs on this interpreter, registered as the one
    `uv sync --script` would have prepared, when this interpreter has the program's dependencies."""
    if shutil.which("uv") is not None:
        return
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    if not all(importlib.util.find_spec(m) for m in ("openai", "mcp", "httpx", "tenacity", "certifi")):
        return  # (verifiers then says it cannot prepare the script, and the episode fails with that)
    directory = Path(SubprocessRuntime.scripts_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{hashlib.sha256(CHAT_PROGRAM_SOURCE.encode()).hexdigest()}.py"
    if not path.is_file() or path.read_text() != CHAT_PROGRAM_SOURCE:
        path.write_text(CHAT_PROGRAM_SOURCE)
    SubprocessRuntime._interpreters.setdefault(str(path), sys.executable)


class VerifiersAgent:
    """`async (client, row)`: row's task played as one verifiers episode against `client`'s endpoint (module docstring)."""

    def __init__(self, spec: str, args: dict[str, Any], model_name: str):
        self.spec, self.model_name = spec, model_name
        self.env, self.tasks = load_tasks(spec, args)
        use_this_interpreter_for_chat_programs()
        self._serving = None  # the env's `serving()` context, entered by the first episode on the engine's loop
        self._lock: asyncio.Lock | None = None

    async def __call__(self, client, row: dict[str, Any]) -> dict[str, float | None]:
        import verifiers.v1 as vf

        task = self.tasks[row["vf_task"]]
        if task.key != row.get("vf_key"):
            raise ValueError(f"task {row['vf_task']} of {self.spec} is not the row's ({task.key} != {row.get('vf_key')}): "
                             "the taskset's order changed between loading the rows and the run")
        await self._serve()
        ctx = vf.ModelContext(model=self.model_name, client=vf.EvalClientConfig(base_url=str(client.base_url).rstrip("/"),
                                                                               api_key_var=API_KEY_VAR))
        episode = await self.env.run_episode(task, ctx, on_trace=lambda trace: join_session(trace.id))
        return episode_outcome(episode)

    async def _serve(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._serving is None:
                serving = self.env.serving()
                await serving.__aenter__()
                self._serving = serving

    async def aclose(self) -> None:
        if self._serving is not None:
            serving, self._serving = self._serving, None
            await serving.__aexit__(None, None, None)


def episode_outcome(episode) -> dict[str, float | None]:
    """{"reward": the traces' mean reward, <reward name>: its mean score, ...}; EpisodeFailed with verifiers' messages
    when the episode or a trace ended with errors."""
    errors = [_error_text(e) for e in episode.errors] + [_error_text(e) for t in episode.traces for e in t.errors]
    if errors or not episode.traces:
        raise EpisodeFailed("; ".join(errors) or "the episode ran no agent")
    out: dict[str, float | None] = {}
    rewards = [t.reward for t in episode.traces]
    out["reward"] = None if any(r is None for r in rewards) else sum(rewards) / len(rewards)
    names: dict[str, list[float]] = {}
    for trace in episode.traces:
        for name, reward in (trace.rewards or {}).items():
            if reward.score is not None:
                names.setdefault(name, []).append(float(reward.score))
    out.update({name: sum(scores) / len(scores) for name, scores in names.items() if name != "reward"})
    return out


def _error_text(error) -> str:
    kind, message = getattr(error, "type", None), getattr(error, "message", None)
    return f"{kind}: {message}" if kind and message else str(error)


def verifiers_reward(completions: Sequence[Any], agent_runs: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """Each completion's episode reward; None for a failed episode (no reward, advantage 0: training goes on, and
    `agent/failed` counts it) or a completion that is no agent run."""
    if agent_runs is None:
        return [None] * len(completions)
    return [None if run is None or run.error is not None or run.outcome is None else run.outcome.get("reward")
            for run in agent_runs]

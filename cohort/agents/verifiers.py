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

Seats: an episode with several traces (a multi-agent env: one trace per seat, `trace.agent.name` the seat's field,
each with its own reward, e.g. a zero-sum payoff) reports each trainable trace as a seat (`"seats"` in the outcome:
{trace id: {"seat": name, "reward": its reward, ...its named scores}}; a name played twice is `name#k` in completion
order); the engine makes each seat's calls (those that came with its trace id) a trajectory of its own, and the
trainer trains every seat on its own reward (cohort/trainer/agent_samples.py's `with_seats`). A trace verifiers marks
untrainable (`agents.user.trainable = False`: user-sim's modeled user) is no seat: its calls are not trained.

Why the eval client and not verifiers' train client (prime-rl's, `POST /inference/v1/generate` with client-side
tokenization): cohort already records token ids, log-probs and policy versions at its endpoint, so the text
endpoint loses nothing, and the train client needs a `renderers` map entry for each model's template, which a
checkpoint of one's own lacks.

Failures: an episode that ends with errors (the environment raised, the endpoint answered an error, the harness
program failed) raises `EpisodeFailed` with verifiers' messages; the run's `AgentRun.error` keeps it, and since
`VerifiersAgent.episode_only` makes any failure of its runs (a timeout too) the episode's own, the episode is
scored by nothing (`AgentRun.failed`: no reward from the environment or any added `rewards`, advantage 0) instead of
stopping training, and `agent/failed` counts it.

What this machine must give (cohort/data/verifiers.py's `check_environment` says which, before anything loads): the environment's module
installed (an unknown id is refused with the closest installed names); a local runtime (verifiers' default for the
harness is Prime's remote sandboxes: `agent.environment_args.agent.runtime.type: subprocess`); the harness's program,
which verifiers prepares with `uv sync --script`: without `uv`, the chat harnesses (`null`, `bash`) run on this
interpreter when it has their dependencies.

Rows: one per task (cohort/data/verifiers.py's `task_rows`, from the same load as the agent's tasks: the run loads the
environment once, cohort/plan/run_environment.py); the agent checks the task key its row carries.
Left out: the 0.1.x API (gone from 0.4), pushing results to Prime's platform (nothing is pushed).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

from cohort.agents.sessions import join_session
from cohort.data.verifiers import load_tasks, seats

API_KEY_VAR = "COHORT_VERIFIERS_API_KEY"  # the eval client's key variable: unset is fine ("EMPTY"); runs are told apart by X-Session-ID


class EpisodeFailed(RuntimeError):
    """A verifiers episode ended with errors; the message is verifiers' own. That episode only fails
    (`VerifiersAgent.episode_only`: scored by nothing, cohort/agents/runs.py); training goes on."""


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
    """`async (client, row)`: row's task played as one verifiers episode against `client`'s endpoint (module docstring).
    `episode_only`: any failure of a run (verifiers' errors, a timeout) fails that episode only: scored by nothing,
    by `verifiers_reward` and any added `rewards` alike (AgentRun.failed), and training goes on."""

    episode_only = True

    def __init__(self, spec: str, args: dict[str, Any], model_name: str, num_examples: int | None = None, *,
                 loaded: tuple[Any, list] | None = None):
        """`loaded`: the environment and its tasks as the run loaded them for its rows (`load_tasks`; loaded here when
        None)."""
        self.spec, self.model_name = spec, model_name
        self.env, self.tasks = loaded if loaded is not None else load_tasks(spec, args, num_examples)
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
        return episode_outcome(episode, seat_order=list(seats(self.env.config)))

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


def episode_outcome(episode, seat_order: Sequence[str] = ()) -> dict[str, Any]:
    """{"reward": the traces' mean reward, <reward name>: its mean score, ..., "seats": each trainable trace's (module
    docstring: "Seats"; only for an episode of several traces, in `seat_order`: the env config's seat fields)}; EpisodeFailed with verifiers' messages when the
    episode or a trace ended with errors."""
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
    trainable = [t for t in episode.traces if getattr(t.agent, "trainable", True)]
    if len(episode.traces) > 1 or len(trainable) < len(episode.traces):
        rank = {name: k for k, name in enumerate(seat_order)}
        out["seats"] = seat_outcomes(sorted(trainable, key=lambda t: rank.get(t.agent.name, len(rank))))
    return out


def seat_outcomes(traces) -> dict[str, dict[str, Any]]:
    """{trace id: {"seat": its agent's name (`name#k` for the k-th trace of a name played more than once), "reward":
    its reward, <reward name>: its score}}."""
    names = [t.agent.name for t in traces]
    seen: dict[str, int] = {}
    out = {}
    for trace, name in zip(traces, names):
        k = seen[name] = seen.get(name, -1) + 1
        seat = name if names.count(name) == 1 else f"{name}#{k}"
        scores = {n: float(r.score) for n, r in (trace.rewards or {}).items() if r.score is not None and n != "reward"}
        out[str(trace.id)] = {"seat": seat, "reward": trace.reward, **scores}
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

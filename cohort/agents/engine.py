"""Agent functions as rollouts: `AgentEngine(inner, chat, agent, ...)` speaks the request-level protocol on top of
any request-level engine, and each request it is given is one run of the user's `async def agent(client, row)`.

On `submit`, each request starts one run on the engine's event loop (one background thread for every run): the
agent gets an `openai.AsyncOpenAI` client whose base_url is the loopback endpoint (cohort/agents/loopback.py) and
whose API key is the run's own, and the request's dataset row (`rows(request)`, as the tool loop's environments
get it). Each `/v1/chat/completions` call the agent makes is answered by the endpoint's `ChatCompletions`
(cohort/agents/chat.py) with the run's `Conversation`; the endpoint's `sample` puts its engine requests in a queue
and waits. The engine's own `poll` (called by the rollout scheduler, cohort/rollout/scheduler.py) moves the queue
into the inner engine and routes finished trajectories back to the waiting calls, so the scheduler's admission rules
govern every run and every call, and the inner engine is only ever touched from the scheduler's side.

Sampling during a run: each call's temperature, top_p and top_k are the request's (rollout.*: the trainer scores
with rollout.temperature, so an agent's own values would make the log-probs disagree); its max_tokens is the
smaller of the call's and what the request's budget and the engine's context have left (rollout.max_completion_length
over the run's completion, model and tool tokens, as in the tool loop; a spent budget, or a later call's prompt past
the context, answers with nothing and finish_reason "length", so the run ends as the tool loop's trajectory whose
tool turn does not fit; a first prompt past the context is the agent's mistake: 400). The endpoint's own context
check is left to this (`wrap_engine` gives it no bound), since it would refuse the call instead. Seeds: the run's first call samples with the request's seed, call k with
`continuation_seed(seed, k)`, the tool loop's rule (so the same tokens come out of both paths).

When the agent returns, its calls become the run's trajectory (cohort/agents/runs.py: one trajectory with loss
mask 0 on what the agent added between calls, or one sample per call when it rewrote its history), carrying an
`AgentRun` as its `episode`: the returned reward and metrics, or the error. Failures: an agent that raises, returns
something that is not a number or a dict with a numeric `reward`, or runs past `timeout_s` (cancelled) finishes with
`AgentRun.error` set and its calls so far; the agent reward (cohort/agents/reward.py) then fails like a reward
function that raises (one message, the last good state saved, cohort/trainer/failure.py). A call the endpoint refused
(a `ChatRequestError`, 400: e.g. tools under a template without a tools block) is named in the failed run's error with
its fix, whatever the agent made of the 400. `abort` cancels the run,
aborts its calls in the inner engine and returns its calls so far with status "aborted" (it cannot be resumed:
validation refuses partial rollouts with an agent).

Frameworks that run their own client (verifiers): inside a run, `join_session(session_id)` makes the endpoint take
calls carrying `X-Session-ID: session_id` as this run's, whatever their API key (cohort/agents/sessions.py;
cohort/agents/verifiers.py joins
each trace id as verifiers mints it). An agent object with an `aclose()` coroutine has it awaited on `close`, for at
most AGENT_CLOSE_S (a hung one is cancelled and the rest closed). Seats: an
agent that returns `"seats"` ({session id: {"seat": name, "reward": ...}}, `as_seats`) gets one trajectory per seat
from the calls that came with that session id (`AgentRun.seats`; the trainer trains each on its own reward), and a
seat's budget counts only its own calls.

Left out: resuming an aborted run (the agent program's state is gone).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

from cohort.agents.chat import ChatRequestError
from cohort.agents.loopback import LoopbackServer, new_key
from cohort.agents.runs import AgentRun, run_trajectory
from cohort.agents.sessions import JOIN
from cohort.rollout.base import Request, RequestEngineMixin, Trajectory, WrappedEngine, continuation_seed

WAIT_S = 0.05  # how long one poll waits for calls to arrive while runs are busy outside the engine
GATHER_QUIET_S = 0.01  # before the engine steps: wait while runs between calls keep sending calls this often...
GATHER_MAX_S = 0.25  # ...but never longer than this (an agent's slow tool must not stall the others)
AGENT_CLOSE_S = 10.0  # `close` waits this long for the agent's aclose() (verifiers' serving context, its servers)...
HTTP_CLOSE_S = 2.0  # ...and this long for the runs' HTTP client; past either, it is left behind and the rest closed


class RunCancelled(Exception):
    """The run was aborted or timed out while one of its calls waited for the engine."""


@dataclass
class _Run:
    request: Request
    key: str
    conversation: Any  # cohort.agents.chat.Conversation
    future: concurrent.futures.Future | None = None  # the agent coroutine on the event loop
    calls_made: int = 0  # engine requests sent (each call's seed is continuation k of the run's)
    waiting: dict[str, concurrent.futures.Future] = field(default_factory=dict)  # engine request id -> its call's future
    messages: list[dict[str, Any]] = field(default_factory=list)  # the last call's messages and its answer
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: dict[int, str | None] = field(default_factory=dict)  # id(SampledCall) -> the X-Session-ID it came with
    refused: str | None = None  # the first call the endpoint refused (a ChatRequestError, 400): its message and fix


class AgentEngine(RequestEngineMixin, WrappedEngine):
    """Each request is one agent run over `inner` (see the module docstring). `chat(sample)` builds the endpoint's
    `ChatCompletions` around a sample callable; `new_conversation()` makes a run's `Conversation`."""

    def __init__(self, inner, chat: Callable[[Callable], Any], new_conversation: Callable[[], Any],
                 agent: Callable[..., Any], *, rows: Callable[[Request], dict[str, Any]] | None = None,
                 timeout_s: float = 300.0, model_name: str = "cohort", max_model_len: int | None = None):
        self.inner, self.agent, self.rows, self.timeout_s = inner, agent, rows, timeout_s
        self.max_model_len = max_model_len  # the engine's: prompt + completion of one call
        self.chat, self.new_conversation = chat(self._sample), new_conversation
        self._runs: dict[str, _Run] = {}
        self._done: list[Trajectory] = []
        self._queue: queue.Queue = queue.Queue()  # (run, request, future): calls waiting to enter the engine
        self._calls: dict[str, _Run] = {}  # engine request id -> its run (poll's routing table)
        self._current = threading.local()  # the run whose HTTP call this thread is answering
        self._wake = threading.Event()
        self._http = None  # the runs' shared httpx.AsyncClient (`_drive`)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="cohort-agents", daemon=True)
        self._loop_thread.start()
        self.server = LoopbackServer(self._answer, model_name)

    # ---------------------------------------------------------------- the engine protocol

    def submit(self, requests: Sequence[Request]) -> None:
        for r in requests:
            if r.request_id in self._runs:
                raise ValueError(f"request id {r.request_id!r} is already in flight")
            if r.resume is not None:
                raise ValueError(f"request {r.request_id!r}: an agent run cannot be resumed (a cut-off run starts over: "
                                 "AgentRun.resumable, cohort/rollout/partial.py)")
        for r in requests:
            run = _Run(r, new_key(), self.new_conversation())
            self._runs[r.request_id] = run
            self.server.register(run.key, run)
            row = self.rows(r) if self.rows is not None else {}
            run.future = asyncio.run_coroutine_threadsafe(self._drive(run, row), self._loop)
            run.future.add_done_callback(lambda _: self._wake.set())

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._enter_calls()
            self._finish_runs()
            if self._done or not self._runs or (deadline is not None and time.monotonic() >= deadline):
                done, self._done = self._done, []
                return done
            left = WAIT_S if deadline is None else min(WAIT_S, max(0.0, deadline - time.monotonic()))
            if self.inner.in_flight and self._gather(deadline):
                continue
            if self.inner.in_flight:
                for t in self.inner.poll(left):
                    self._route(t)
            else:  # every run is in its own code (or its HTTP round trip): wait for a call or an ending
                self._wake.wait(left)
                self._wake.clear()

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        """Cancel these runs: each open one comes back "aborted" with its calls so far; one finished and not polled
        yet comes back finished."""
        self._finish_runs()  # (a run that has just returned is finished, not aborted)
        wanted = None if request_ids is None else set(request_ids)
        ids = [rid for rid in self._runs if wanted is None or rid in wanted]
        for rid in ids:
            self._runs[rid].future.cancel()  # (cancels the agent's task on the loop)
        calls = [cid for cid, run in self._calls.items() if run.request.request_id in ids]
        for t in self.inner.abort(calls) if calls else []:
            self._route(t)
        aborted = [self._end(self._runs[rid], status="aborted") for rid in ids]
        finished = [t for t in self._done if wanted is None or t.request_id in wanted]
        self._done = [t for t in self._done if t not in finished]
        return finished + aborted

    @property
    def in_flight(self) -> int:
        return len(self._runs) + len(self._done)

    def close(self) -> None:
        """Abort the runs, stop the endpoint, await the agent's `aclose()` (an agent object holding resources:
        cohort/agents/verifiers.py's environment) and the runs' HTTP client, then stop the loop and close the inner
        engine. Each wait is bounded (AGENT_CLOSE_S, HTTP_CLOSE_S): one that hangs is cancelled, said on stderr (the
        engine log), and the rest is closed anyway, so a hung `aclose` costs seconds, not the minute it once did."""
        self.abort()
        self.server.close()
        try:
            if hasattr(self.agent, "aclose"):
                self._await_closing(self.agent.aclose(), AGENT_CLOSE_S, "the agent's aclose()")
            if self._http is not None:
                self._await_closing(self._http.aclose(), HTTP_CLOSE_S, "the agent runs' HTTP client")
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5)
            self.inner.close()

    def _await_closing(self, coroutine, timeout_s: float, what: str) -> None:
        """`coroutine` on the engine's loop, waited for at most `timeout_s`: past it, cancelled and left behind."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            print(f"cohort: {what} did not finish within {timeout_s:g} s; left behind (cancelled), the rest closed",
                  file=sys.stderr, flush=True)

    # ---------------------------------------------------------------- one run

    async def _drive(self, run: _Run, row: dict[str, Any]) -> Any:
        """The agent on this run's client, under the run's timeout; its return value."""
        import httpx  # (comes with openai)
        import openai  # the optional `agents` extra (pip install cohort[agents]); only agent runs need it

        if self._http is None:  # one connection pool for every run (made on the loop that uses it); no proxy for loopback
            self._http = openai.DefaultAsyncHttpxClient(trust_env=False, limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024))
        client = openai.AsyncOpenAI(base_url=self.server.url, api_key=run.key, max_retries=0, timeout=self.timeout_s,
                                    http_client=self._http)
        JOIN.set(lambda session_id: self.server.join(session_id, run.key))  # (this task's context: the run's own)
        return await asyncio.wait_for(self.agent(client, row), self.timeout_s)

    def _answer(self, run: _Run, body: dict[str, Any], session: str | None = None) -> dict[str, Any]:
        """One /v1/chat/completions call of `run` (on the HTTP server's thread): the endpoint, with the run's ledger;
        `session`: the call's X-Session-ID (a seat's trace, `_seat_trajectories`)."""
        self._current.run, self._current.session = run, session
        try:
            reply, calls = self.chat.create(body, conversation=run.conversation)
        except ChatRequestError as exc:  # (the agent gets it as a 400; the run's error carries it: `_end`)
            run.refused = run.refused or str(exc)
            raise
        finally:
            self._current.run = None
        run.sessions.update({id(call): session for call in calls})
        choice = (reply.get("choices") or [{}])[0]
        run.messages = list(body.get("messages") or []) + [choice.get("message", {})]
        return reply

    def _sample(self, requests: list[Request]) -> list[Trajectory]:
        """The endpoint's `sample` for the run this thread answers: its requests queued for `poll` to submit, each
        with the run's sampling, seed and remaining budget; blocks until the engine has sampled them."""
        run = self._current.run
        if run is None:
            raise RuntimeError("AgentEngine's endpoint sampled outside an agent run's call")
        futures = []
        for r in requests:
            request, budget = self._engine_request(run, r)
            future: concurrent.futures.Future = concurrent.futures.Future()
            if budget <= 0:  # the run's completion budget is spent: nothing more is sampled
                future.set_result(Trajectory([], [], "length", self.inner.policy_version, prompt_ids=list(r.prompt_ids)))
            else:
                with run.lock:
                    run.waiting[request.request_id] = future  # (between calls no more: `_gather`)
                self._queue.put((run, request, future))
                self._wake.set()
            futures.append(future)
        out = []
        for f in futures:
            try:
                out.append(f.result())
            except concurrent.futures.CancelledError:
                raise RunCancelled(f"agent run {run.request.request_id} was cancelled") from None
        return out

    def _engine_request(self, run: _Run, r: Request) -> tuple[Request, int]:
        """`r` as the engine gets it (module docstring: sampling, seed, budget); and the budget left before it."""
        base = run.request
        session = getattr(self._current, "session", None)  # (a seat's budget is its own calls')
        calls = [c for c in run.conversation.calls if run.sessions.get(id(c)) == session]
        first = list(calls[0].prompt_ids) if calls else list(r.prompt_ids)
        used = len(r.prompt_ids) - len(first) if list(r.prompt_ids[: len(first)]) == first else 0
        room = self.max_model_len - len(r.prompt_ids) if self.max_model_len is not None else base.sampling.max_tokens
        if room < 1 and not calls:  # the agent's own first prompt does not fit: its mistake, said as the endpoint says it
            raise ChatRequestError("messages", f"the prompt is {len(r.prompt_ids)} tokens and the model holds "
                                               f"{self.max_model_len} (prompt and completion); shorten it")
        budget = min(base.sampling.max_tokens - used, room)  # (a later call past the context: the run ends "length")
        with run.lock:
            k, run.calls_made = run.calls_made, run.calls_made + 1
        sampling = replace(base.sampling, max_tokens=max(1, min(r.sampling.max_tokens, budget)))
        seed = base.seed if k == 0 else continuation_seed(base.seed, k)
        return Request(f"{base.request_id}/c{k}", tuple(r.prompt_ids), sampling, seed), budget

    # ---------------------------------------------------------------- poll's side

    def _gather(self, deadline: float | None) -> bool:
        """Give the runs between two calls a moment to send their next one before the engine steps: a step holds
        the interpreter, so calls that arrive one per step make many small batches (measured on tool_calc: 8-15 s
        of generation per batch without this, a few seconds with it). Never past the poll's `deadline` (a caller's
        short timeout bounds how long it holds the engine's lock). True when calls arrived."""
        arrived, end = False, min(time.monotonic() + GATHER_MAX_S, deadline if deadline is not None else float("inf"))
        while time.monotonic() < end and any(not run.waiting and not run.future.done() for run in self._runs.values()):
            if not self._wake.wait(min(GATHER_QUIET_S, max(0.0, end - time.monotonic()))):
                break  # nobody sent anything for a quiet period: they are busy in their own code
            self._wake.clear()
            arrived = True
        return arrived

    def _enter_calls(self) -> None:
        """Submit the queued calls of live runs to the inner engine."""
        batch = []
        while True:
            try:
                run, request, future = self._queue.get_nowait()
            except queue.Empty:
                break
            if run.request.request_id not in self._runs or future.cancelled():
                future.cancel()
                continue
            self._calls[request.request_id] = run
            batch.append(request)
        if batch:
            self.inner.submit(batch)

    def _route(self, t: Trajectory) -> None:
        """A call's trajectory back to the HTTP thread waiting for it."""
        run = self._calls.pop(t.request_id, None)
        if run is None:
            self._done.append(t)  # not one of ours
            return
        with run.lock:
            future = run.waiting.pop(t.request_id, None)
        if future is not None and not future.done():
            future.set_result(t)

    def _finish_runs(self) -> None:
        for run in [run for run in self._runs.values() if run.future.done()]:
            self._done.append(self._end(run))

    def _end(self, run: _Run, status: str | None = None) -> Trajectory:
        """The run's trajectory with its `AgentRun`; the run forgotten (its key expires, waiting calls cancelled)."""
        self._runs.pop(run.request.request_id, None)
        self.server.unregister(run.key)
        with run.lock:
            waiting, run.waiting = dict(run.waiting), {}
        unanswered = [cid for cid in waiting if cid in self._calls]  # (a timed-out run's calls in the engine: taken out)
        for cid, future in waiting.items():
            future.cancel()
            self._calls.pop(cid, None)
        if unanswered:
            self.inner.abort(unanswered)
        record = AgentRun(turns=len(run.conversation.calls), conversation=run.messages)
        seats = {}
        if status is None:
            record.outcome, record.error, record.status, seats = _outcome(run.future, self.timeout_s)
            record.error = _with_refusal(record.error, run.refused)
            # an agent marked `episode_only` (verifiers' VerifiersAgent): any failure fails that episode only
            record.episode_only = record.error is not None and bool(getattr(self.agent, "episode_only", False))
        else:
            record.status, record.error = status, "the run was aborted"
        trajectory, samples = run_trajectory(list(run.conversation.calls), run.request.request_id, run.request.prompt_ids,
                                             self.inner.policy_version)
        record.samples, record.seats = samples, self._seat_trajectories(run, seats)
        return replace(trajectory, status=status or trajectory.status, episode=record)

    def _seat_trajectories(self, run: _Run, seats: dict[str, tuple[str, dict[str, float | None]]]) -> list[Trajectory]:
        """One trajectory per seat the agent reported ({session id: (seat name, its outcome)}): the calls that came with
        that session id, as a run's calls become a trajectory (runs.py), with the seat's own `AgentRun`."""
        out = []
        for session, (name, outcome) in seats.items():
            calls = [c for c in run.conversation.calls if run.sessions.get(id(c)) == session]
            trajectory, samples = run_trajectory(calls, f"{run.request.request_id}/{name}", run.request.prompt_ids,
                                                 self.inner.policy_version)
            out.append(replace(trajectory, episode=AgentRun(outcome=outcome, turns=len(calls), samples=samples, seat=name)))
        return out


def _outcome(future: concurrent.futures.Future, timeout_s: float) -> tuple[dict[str, float] | None, str | None, str, dict]:
    """(outcome, error, status, seats) of a finished agent coroutine: its reward and metrics, or why it failed; and
    the seats it reported (`as_seats`)."""
    try:
        value = future.result()
    except (asyncio.TimeoutError, TimeoutError):
        return None, (f"the agent did not return within agent.timeout_s = {timeout_s:g} s (every model call of the run "
                      "counts; a slow model or a busy machine needs more: raise agent.timeout_s)"), "timeout", {}
    except concurrent.futures.CancelledError:
        return None, "the run was cancelled", "aborted", {}
    except Exception as exc:  # noqa: BLE001 - the agent reward reports it (cohort/agents/reward.py)
        return None, f"the agent raised {_described(exc)}", "error", {}
    try:
        seats = as_seats(value.pop("seats", None) if isinstance(value, dict) else None)
        return as_outcome(value), None, "ok", seats
    except ValueError as exc:
        return None, str(exc), "error", {}


def _with_refusal(error: str | None, refused: str | None) -> str | None:
    """A failed run's error with the endpoint's refusal of one of its calls (its message and fix, which a framework
    between the endpoint and the agent, such as verifiers' harness, may word away), unless the error already says it."""
    if error is None or refused is None or refused in error:
        return error
    return f"{error} (the endpoint refused a call of this run: {refused})"


def as_seats(value: Any) -> dict[str, tuple[str, dict[str, float | None]]]:
    """An agent's `seats` ({session id: {"seat": name, "reward": ..., metric: ...}}, the sessions it joined with
    `join_session`) as {session id: (name, outcome)}; ValueError for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, dict) and isinstance(v.get("seat"), str) for v in value.values()):
        raise ValueError("the agent's `seats` must map each joined session id to a dict with its `seat` name and `reward`")
    return {str(k): (v["seat"], as_outcome({key: item for key, item in v.items() if key != "seat"})) for k, v in value.items()}


def _described(exc: BaseException) -> str:
    """The exception and its causes, one line ("APIConnectionError: Connection error. <- ConnectError: ...")."""
    parts, seen = [], 0
    while exc is not None and seen < 4:
        parts.append(f"{type(exc).__name__}: {exc}")
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return " <- ".join(parts)


def as_outcome(value: Any) -> dict[str, float | None]:
    """An agent's return value as {"reward": float | None, metric: float, ...}; ValueError for anything else."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return {"reward": None if value is None else float(value)}
    if isinstance(value, dict) and "reward" in value:
        out: dict[str, float | None] = {}
        for key, item in value.items():
            if not (isinstance(item, (int, float)) and not isinstance(item, bool)) and not (key == "reward" and item is None):
                raise ValueError(f"the agent returned {key!r}: {item!r}; every value of its dict must be a number "
                                 "(`reward` may be None: not applicable)")
            out[str(key)] = None if item is None else float(item)
        return out
    raise ValueError(f"the agent returned {type(value).__name__} {str(value)[:80]!r}; return a float (the reward) or a "
                     "dict with a numeric `reward` (its other keys become agent/<key> metrics)")

"""The multi-turn tool loop: `ToolEngine(inner, ...)` speaks the request-level protocol on top of any request-level
engine, and each trajectory advances through its turns on its own.

A request goes to the inner engine as it is. When its trajectory comes back ended by a stop token, the text of its
last assistant turn goes to the parser (cohort/tools/parsers.py): no call is the final answer and the trajectory is
returned; calls run on threads (each call on its own daemon thread, `async def` tools in their own event loop, at
most `max_parallel_calls` per turn, each under `tool_timeout_s`) while the inner engine keeps sampling the other
trajectories; when a turn's calls are done, the tool turn's tokens (cohort/tools/render.py: the chat template's
rendering suffix) are appended with loss mask 0, engine log-prob 0 and the engine's current policy version, and the
request is submitted again with `resume=` that trajectory: the engine continues from the token ids, never
re-tokenized, and its `Request.remaining` makes `max_tokens` one budget over every turn (model and tool tokens).
To the trainer the result is one `Trajectory` whose loss mask has zeros on tool tokens; `Trajectory.episode` holds
its `Episode` (cohort/tools/episode.py: the conversation, the environment instance, the tool status and counts).

Environments (cohort/tools/tool_schemas.py): the instance is built and `reset(**row)` when the request starts; a string it
returns is appended to the prompt's last user message (TRL's rule, `prompt_with`: the prompt tokens are rendered
again, and the trajectory carries them as its `prompt_ids`). A `reset` that raises, or an observation that makes the
prompt reach the engine's context (`max_model_len`), fails the episode: `Episode.failure` says why (also recorded
as a "reset" tool message, status error), the model answers the row's own prompt once, its loss mask is 0, and no
reward function scores it (cohort/rollout/collect.py's `failed_episodes`: every reward None, advantage 0); the run
goes on. A `reset` that raises `EnvironmentLost` fails the run's step. After a
turn's calls, an environment whose `done` is true ends the trajectory (the turn's results recorded, not appended).

Budgets and status: a call after `max_turns` assistant turns is not run; a tool turn that does not fit in the token
budget is not appended (the trajectory ends "length"); either makes the tool status "truncated", as does a response
cut to `max_tool_response_length`. A call past its timeout makes it "tool_timeout", a tool that raises "error"
(the worst status of a trajectory is kept: error > tool_timeout > truncated > ok). Under `failure_policy="mask"`
a trajectory whose status is tool_timeout or error gets loss mask 0 everywhere (it trains nothing; its reward still
counts in its group's statistics); under "reward" the reward decides. The model's own mistakes (an unparsable call,
an unknown tool, missing or unexpected arguments) are not failures: the error is the tool message, fed back to the
model, and counted (`parse_errors`, `argument_errors`).

Abort and resume (partial rollouts): `abort` returns a trajectory with its tokens so far, status "aborted", its
`episode` attached and its environment closed; submitted again with `resume=` it continues where it stopped (a turn
that had ended before its calls ran gets its calls run first), its record carried over; an environment is built
and reset afresh (its state before the abort is not restored).

Seeds: a trajectory's first turn is sampled with its request's seed, turn k + 1 with `continuation_seed(seed, k)`
(a fresh stream of random numbers, so a run is reproducible turn by turn). (vLLM's CPU sampler cannot rewind a
seeded request's generator after a partial prefill; the vLLM engine turns chunked prefill off on CPU for that.)

Left out: a hung synchronous tool cannot be killed (Python threads cannot be); its daemon thread is abandoned at
the timeout and its result ignored. Code from the model runs through the `python` tool (cohort/tools/builtin.py),
which uses the reward sandbox's confinement.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from cohort.rewards.calling import DaemonThreads
from cohort.rollout.base import Request, RequestEngineMixin, Trajectory, WrappedEngine, continuation_seed
from cohort.tools.session_episode import EnvironmentLost
from cohort.tools.episode import Episode
from cohort.tools.parsers import ParsedTurn, Parser, ToolCall, call_forms
from cohort.tools.render import ToolRenderer
from cohort.tools.tool_schemas import Tool, environment_tools

FAILED = ("tool_timeout", "error")
CLOSE_POLL_S = 0.05  # how long one inner poll may block while tool calls are running


@dataclass
class _Open:
    request: Request
    episode: Episode
    tools: dict[str, Tool]
    turn_start: int = 0  # where the current assistant turn starts in the completion
    failed: str | None = None  # the environment failed at reset: the first turn is the last


@dataclass
class _Result:
    name: str
    content: str
    outcome: str  # ok | timeout | error | lost | parse_error | argument_error | skipped


class ToolEngine(RequestEngineMixin, WrappedEngine):
    """Multi-turn tool calling over `inner` (any request-level engine); see the module docstring."""

    def __init__(self, inner, tokenizer, *, parser: Parser, tools: Sequence[Tool] = (), environment: type | None = None,
                 rows: Callable[[Request], dict[str, Any]] | None = None, max_turns: int = 4, max_parallel_calls: int = 4,
                 tool_timeout_s: float = 10.0, max_tool_response_length: int | None = None,
                 truncate_side: str = "right", failure_policy: str = "reward",
                 prompt_with: Callable[[dict[str, Any], str], list[int]] | None = None, max_model_len: int | None = None,
                 schemas: list[dict[str, Any]] | None = None):
        """`schemas`: the tools' JSON schemas the prompts were rendered with (tools.in_prompt), rendered with every tool
        turn too (cohort/tools/render.py)."""
        self.inner, self.tokenizer, self.parser = inner, tokenizer, parser
        self.max_model_len = max_model_len  # the engine's context: a longer prompt (observation included) fails its episode
        self.schemas = schemas or None
        self.prompt_with = prompt_with  # (row, observation) -> the row's prompt token ids with the observation appended
        self.tools, self.environment, self.rows = list(tools), environment, rows
        self.max_turns, self.max_parallel_calls, self.tool_timeout_s = max_turns, max_parallel_calls, tool_timeout_s
        self.failure_policy = failure_policy
        self.renderer = ToolRenderer(tokenizer, inner.stop_token_ids, max_response_tokens=max_tool_response_length,
                                     truncate_side=truncate_side)
        self.renderer.check(self.schemas)  # a template that cannot render tool turns as a suffix fails here, before any rollout
        self._open: dict[str, _Open] = {}
        self._running: dict[str, tuple[concurrent.futures.Future, Trajectory]] = {}
        self._done: list[Trajectory] = []
        self._threads = DaemonThreads()

    # ---------------------------------------------------------------- the engine protocol

    def submit(self, requests: Sequence[Request]) -> None:
        started = []
        try:
            for r in requests:
                if r.request_id in self._open:
                    raise ValueError(f"request id {r.request_id!r} is already in flight")
                self._open[r.request_id] = self._start(r)
                started.append(r.request_id)
            between_turns = [r for r in requests if _ended_a_turn(r.resume, self.inner.stop_token_ids)]
            self.inner.submit([self._open[r.request_id].request for r in requests if r not in between_turns])
            for r in between_turns:  # aborted after a turn, before its calls ran: run them now (as a fresh turn)
                self._retake_turn(self._open[r.request_id], r.resume)
        except BaseException:
            for rid in started:
                self._close_environment(self._open.pop(rid).episode)
            raise

    def poll(self, timeout: float | None = None) -> list[Trajectory]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._collect_tool_turns()
            if self._done or not self._open or (deadline is not None and time.monotonic() >= deadline):
                done, self._done = self._done, []
                return done
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self.inner.in_flight:
                wait = min(CLOSE_POLL_S, left if left is not None else CLOSE_POLL_S) if self._running else left
                for t in self.inner.poll(wait):
                    self._on_turn(t)
            elif self._running:
                concurrent.futures.wait([f for f, _ in self._running.values()], timeout=left,
                                        return_when=concurrent.futures.FIRST_COMPLETED)
            else:
                raise RuntimeError(f"ToolEngine: {len(self._open)} request(s) are neither in the engine nor running tools")

    def abort(self, request_ids: Iterable[str] | None = None) -> list[Trajectory]:
        """Stop these requests: each open one comes back "aborted" with its tokens so far (its environment closed);
        one already finished and not polled yet comes back finished."""
        wanted = None if request_ids is None else set(request_ids)
        ids = set(self._open) if wanted is None else wanted & set(self._open)
        out = [t for t in self.inner.abort(sorted(ids)) if t.request_id in self._open] if ids else []
        for rid in ids:
            if rid in self._running:  # between turns: its trajectory so far, as the last turn left it
                out.append(self._running.pop(rid)[1])
        aborted = [self._finish(self._open[t.request_id], replace(t, status="aborted")) for t in out]
        finished = [t for t in self._done if wanted is None or t.request_id in wanted]
        self._done = [t for t in self._done if not (wanted is None or t.request_id in wanted)]
        return finished + aborted

    @property
    def in_flight(self) -> int:
        return len(self._open) + len(self._done)

    def close(self) -> None:
        for rid in list(self._open):
            self._close_environment(self._open.pop(rid).episode)
        self.inner.close()

    # ---------------------------------------------------------------- one trajectory's turns

    def _start(self, request: Request) -> _Open:
        """A new episode, or for a resumed request (an aborted multi-turn trajectory) its episode continued: the
        record (conversation, counts) carried over, the current turn starting after the last tool token, and with an
        environment a fresh instance (the old one was closed at the abort)."""
        resume = request.resume
        episode, tools = Episode(), {t.name: t for t in self.tools}
        if resume is not None and isinstance(resume.episode, Episode):
            episode = replace(resume.episode, conversation=list(resume.episode.conversation), environment=None,
                              calls=Counter(resume.episode.calls), segments=list(resume.episode.segments))
        failed = None
        if self.environment is not None:
            row = self.rows(request) if self.rows is not None else {}
            observation, failed = self._reset(request, episode, row)
            if failed is None:
                tools.update({t.name: t for t in environment_tools(episode.environment)})
            if observation and resume is None and self.prompt_with is not None and row:  # TRL's rule: the
                prompt_ids = tuple(self.prompt_with(row, observation))  # observation ends the last user message
                failed = self._past_context(episode, len(prompt_ids))
                if failed is None:
                    episode.observation, request = observation, replace(request, prompt_ids=prompt_ids)
            elif observation and resume is None:
                episode.observation = observation
        if failed is not None:
            episode.failure = failed
        if resume is not None and resume.prompt_ids:  # its tokens were sampled after this prompt (observation included)
            request = replace(request, prompt_ids=tuple(resume.prompt_ids))
        tool_positions = [i for i, m in enumerate(resume.loss_mask) if m == 0] if resume is not None else []
        return _Open(request, episode, tools, turn_start=tool_positions[-1] + 1 if tool_positions else 0, failed=failed)

    def _reset(self, request: Request, episode: Episode, row: dict[str, Any]) -> tuple[str | None, str | None]:
        """Build the trajectory's environment and reset it with the row: (observation, None), or (None, why) when
        the environment raised (the episode fails: status error, the message recorded; the run goes on). A lost
        service (`EnvironmentLost`) raises: every episode would fail the same way."""
        name = getattr(self.environment, "__name__", repr(self.environment))
        try:
            episode.environment = self.environment()
            reset = getattr(episode.environment, "reset", None)
            observation = reset(**row) if reset is not None else None
        except EnvironmentLost as exc:
            raise RuntimeError(f"tools.environment {name}: {exc} (request {request.request_id}, at reset)") from exc
        except Exception as exc:  # noqa: BLE001 - the environment's own failure fails its episode, never the run
            why = f"tools.environment {name}: reset(**row) failed (row columns {sorted(row)}): {type(exc).__name__}: {exc}"
            episode.mark("error")
            episode.conversation.append({"role": "tool", "name": "reset", "content": f"error: {why}"})
            return None, why
        return (str(observation) if observation else None), None

    def _past_context(self, episode: Episode, length: int) -> str | None:
        """None when a prompt of `length` tokens (the observation appended) leaves the engine room to sample; else why
        the episode fails (the model answers the row's own prompt once, and nothing scores it)."""
        if self.max_model_len is None or length < self.max_model_len:
            return None
        name = getattr(self.environment, "__name__", repr(self.environment))
        why = (f"tools.environment {name}: reset's observation makes the prompt {length} tokens, past the engine's "
               f"context of {self.max_model_len}; return a shorter observation from reset")
        episode.mark("error")
        episode.conversation.append({"role": "tool", "name": "reset", "content": f"error: {why}"})
        return why

    def _retake_turn(self, entry: _Open, resume: Trajectory) -> None:
        """Handle a resumed trajectory's last turn (complete, its calls never run) as if it had just come back."""
        episode = entry.episode
        if episode.segments and episode.segments[-1][2] == "assistant":  # recorded before the abort: taken again
            episode.segments.pop()
            episode.conversation.pop()
            episode.turns -= 1
        self._on_turn(replace(resume, status="stop", request_id=entry.request.request_id))

    def _on_turn(self, t: Trajectory) -> None:
        """An assistant turn came back from the inner engine: finish the trajectory or start its tool calls."""
        entry = self._open.get(t.request_id)
        if entry is None:
            self._done.append(t)  # not one of ours
            return
        episode = entry.episode
        turn_ids = t.token_ids[entry.turn_start:]
        episode.segments.append((entry.turn_start, len(t.token_ids), "assistant"))
        text = self.tokenizer.decode(turn_ids[:-1] if t.status == "stop" else turn_ids, skip_special_tokens=True)
        episode.conversation.append({"role": "assistant", "content": text})
        episode.turns += 1
        if t.status != "stop" or entry.failed:  # length (the budget is spent), aborted, error, or no environment
            self._done.append(self._finish(entry, t))
            return
        parsed = self._parse(text)
        written = call_forms(text)  # every call the turn wrote, by form, whatever the parser read
        episode.call_forms.update(written)
        episode.ignored_calls += max(0, sum(written.values()) - len(parsed.calls) - len(parsed.errors))
        if parsed.calls:  # the turn as TRL records it: its calls apart, the text outside them as its content
            episode.conversation[-1] = {"role": "assistant", "content": text if parsed.content is None else parsed.content,
                                        "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                                       for c in parsed.calls]}
        if not parsed.wants_tools:
            self._done.append(self._finish(entry, t))
            return
        if episode.turns >= self.max_turns:
            episode.mark("truncated")
            self._done.append(self._finish(entry, t))
            return
        self._running[t.request_id] = (self._threads.submit(self._run_calls, entry, parsed), t)

    def _parse(self, text: str) -> ParsedTurn:
        try:
            return self.parser(text)
        except Exception as exc:  # noqa: BLE001 - a user parser's bug is a parse error, not a crash
            return ParsedTurn(errors=[f"the tool-call parser failed: {type(exc).__name__}: {exc}"])

    def _collect_tool_turns(self) -> None:
        """Append each finished tool turn and send its trajectory back to the engine (or finish it)."""
        for rid in [rid for rid, (f, _) in self._running.items() if f.done()]:
            future, t = self._running.pop(rid)
            entry = self._open[rid]
            calls, results = future.result()
            lost = [r for r in results if r.outcome == "lost"]
            if lost:  # the service behind the environment is gone: this step cannot finish (EnvironmentLost)
                raise RuntimeError(f"tools.environment: {lost[0].content[len('error: '):]} (request {rid}; "
                                   f"{len(self._open)} episode(s) in flight fail with it)")
            # the calls ran (an environment stepped, its reward counts): their results are recorded even where they are
            # not appended as tokens (the episode is over, or no room is left to answer after them)
            entry.episode.conversation += [{"role": "tool", "name": r.name, "content": r.content} for r in results]
            if getattr(entry.episode.environment, "done", False) is True:
                self._done.append(self._finish(entry, t))
                continue
            ids = self.renderer.tool_ids([(c.name, c.arguments) for c in calls], [(r.name, r.content) for r in results],
                                         self.schemas)
            if len(t.token_ids) + len(ids) >= entry.request.sampling.max_tokens:  # no room to answer after it
                entry.episode.mark("truncated")
                self._done.append(self._finish(entry, replace(t, status="length")))
                continue
            n, version = len(ids), self.inner.policy_version
            grown = Trajectory(t.token_ids + ids, t.logprobs + [0.0] * n if t.logprobs else [], t.status,
                               t.policy_version, t.versions + [version] * n, t.loss_mask + [0] * n, t.prompt_ids,
                               t.request_id)
            entry.episode.segments.append((len(t.token_ids), len(grown.token_ids), "tool"))
            entry.turn_start = len(grown.token_ids)
            turn_seed = continuation_seed(entry.request.seed, entry.episode.turns)  # (module docstring: Seeds)
            self.inner.submit([replace(entry.request, resume=grown, seed=turn_seed)])

    def _finish(self, entry: _Open, t: Trajectory) -> Trajectory:
        self._open.pop(t.request_id, None)
        episode = entry.episode
        if not self._close_environment(episode):
            episode.mark("error")
        mask = t.loss_mask
        if episode.failure is not None or (self.failure_policy == "mask" and episode.status in FAILED):
            mask = [0] * len(t.token_ids)  # (a failed episode trains nothing, whatever the policy)
        return replace(t, loss_mask=mask, episode=episode)

    @staticmethod
    def _close_environment(episode: Episode) -> bool:
        """Run the environment's close(), if any; False when it raised (the trajectory's tool status becomes error)."""
        close = getattr(episode.environment, "close", None)
        if close is None:
            return True
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - one environment's cleanup failing must not stop the run
            episode.conversation.append({"role": "tool", "name": "close", "content": f"error: close() failed: {exc}"})
            return False
        return True

    # ---------------------------------------------------------------- running one turn's calls (on a thread)

    def _run_calls(self, entry: _Open, parsed: ParsedTurn) -> tuple[list[ToolCall], list[_Result]]:
        """Every call of one turn, at most max_parallel_calls at once, all under one tool_timeout_s deadline."""
        episode = entry.episode
        calls = parsed.calls[: self.max_parallel_calls]
        futures = [self._threads.submit(self._call, entry.tools, call) for call in calls]
        deadline = time.monotonic() + self.tool_timeout_s
        results = [self._outcome(call, future, deadline, entry.tools) for call, future in zip(calls, futures)]
        results += [_Result(c.name, f"error: at most {self.max_parallel_calls} tool calls per turn; this one was not run",
                            "skipped") for c in parsed.calls[self.max_parallel_calls:]]
        results += [_Result("error", f"error: {message}", "parse_error") for message in parsed.errors]
        for r in results:
            self._count(episode, r)
        return calls + parsed.calls[self.max_parallel_calls:] + [ToolCall("error", {}) for _ in parsed.errors], results

    def _outcome(self, call: ToolCall, future: concurrent.futures.Future, deadline: float, tools: dict[str, Tool]) -> _Result:
        try:
            value = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            return _Result(call.name, f"error: the tool {call.name!r} timed out after {self.tool_timeout_s:g} s", "timeout")
        except _ArgumentError as exc:
            return _Result(call.name, f"error: {exc}", "argument_error")
        except EnvironmentLost as exc:
            return _Result(call.name, f"error: {exc}", "lost")
        except Exception as exc:  # noqa: BLE001 - the model sees the failure; the status records it
            tool = tools.get(call.name)
            if tool is not None and tool.environment:  # an environment's method: TRL's {"error": message}
                return _Result(call.name, json.dumps({"error": str(exc)}), "error")
            return _Result(call.name, f"error: {type(exc).__name__}: {exc}", "error")
        content = value if isinstance(value, str) else json.dumps(value, default=str)
        content, cut = self.renderer.truncate(content)
        return _Result(call.name, content, "truncated" if cut else "ok")

    @staticmethod
    def _call(tools: dict[str, Tool], call: ToolCall) -> Any:
        tool = tools.get(call.name)
        if tool is None:
            raise _ArgumentError(f"there is no tool {call.name!r}; the tools are {sorted(tools)}")
        arguments = _named_arguments(tool, call.arguments)
        if tool.is_async:
            return asyncio.run(tool.function(**arguments))
        return tool.function(**arguments)

    @staticmethod
    def _count(episode: Episode, r: _Result) -> None:
        if r.outcome in ("ok", "truncated", "timeout", "error", "lost"):
            episode.calls[r.name] += 1
        if r.outcome in ("timeout", "error", "lost"):
            episode.failed_calls += 1
        episode.timeouts += r.outcome == "timeout"
        episode.parse_errors += r.outcome == "parse_error"
        episode.argument_errors += r.outcome == "argument_error"
        episode.mark({"timeout": "tool_timeout", "error": "error", "lost": "error", "truncated": "truncated"}.get(r.outcome, "ok"))


def _ended_a_turn(resume: Trajectory | None, stop_token_ids: Sequence[int]) -> bool:
    """A resumed trajectory whose last token ends an assistant turn (so the engine has nothing to continue)."""
    return resume is not None and bool(resume.token_ids) and resume.loss_mask[-1] == 1 and resume.token_ids[-1] in stop_token_ids


class _ArgumentError(Exception):
    """The model called a tool that does not exist, or with arguments its signature does not take."""


def _named_arguments(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by name (the compact parser's positional keys "0", "1", ... in signature order), checked
    against the signature: a missing or unexpected argument is the model's mistake, fed back to it (TRL #4881)."""
    signature = inspect.signature(tool.function)
    names = list(signature.parameters)
    named = {}
    for key, value in arguments.items():
        if key.isdigit():
            if int(key) >= len(names):
                raise _ArgumentError(f"{tool.name!r} takes {len(names)} argument(s) ({', '.join(names)}); got more")
            key = names[int(key)]
        named[key] = value
    try:
        signature.bind(**named)
    except TypeError as exc:
        raise _ArgumentError(f"{tool.name}({', '.join(names)}): {exc}") from None
    return named

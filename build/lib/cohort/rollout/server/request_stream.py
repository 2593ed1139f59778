"""The rollout server's request stream: requests submitted over HTTP, driven by one thread, finished ones in an outbox.

`RequestStream` keeps the server's side of the request-level protocol
(cohort/rollout/base.py): `/submit` hands requests to the engine, one
background driver thread calls `engine.poll(timeout=DRIVER_POLL_S)` while any
of them is still generating and moves what finished into an outbox, `/poll`
long-polls the outbox (returns as soon as one trajectory is there), `/abort`
stops requests and returns what each had so far. A request counts as in
flight from its `/submit` until a `/poll` or `/abort` has handed it back.

Every engine call (the driver's polls, /submit, /abort, /generate, /score,
/weights) holds `EngineLock` (cohort/rollout/base.py): vLLM's engine is not re-entrant, and a weight
load under running requests (/weights with in_flight=1) happens between two
driver polls, never inside one. The driver
takes the lock only when no HTTP handler is waiting for it, so an /abort gets
in between two engine polls instead of racing the driver for it. With an
engine that samples whole batches (`BatchRequests`) one engine poll samples
everything queued, so an /abort waits for that batch and gets its requests back
finished; with a streaming engine each poll is one short slice of generation.

An engine failure inside a poll turns every request still generating into a
trajectory with status "error" and the reason (the client decides what to do);
requests the engine silently dropped are reported the same way, so a client
never waits for a request that no longer exists.

`run(requests)` is the blocking form for the server's own callers (the
OpenAI-compatible /v1/chat/completions): it submits, waits for exactly these
requests and hands them back; until then they are claimed, so a /poll, or an
/abort of every request, from the trainer neither returns nor stops them (they
still count as generating, so /generate and a sync /weights wait for them too).
Left out: more than one client of /submit per server (request ids are the
client's; one trainer drives a server).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Sequence

from cohort.rollout.base import EngineLock, Request, Trajectory
from cohort.rollout.driver import EngineDriver
from cohort.rollout.server.bodies import BadRequest

DRIVER_POLL_S = 0.02  # the longest one engine poll may run while HTTP handlers wait for the lock
MAX_POLL_WAIT_S = 30.0  # the longest one /poll holds its connection open; the client polls again


class Conflict(RuntimeError):
    """A call the server cannot serve in its current state (HTTP 409); the message says what to do first."""


class RequestStream:
    """The server's in-flight requests, the outbox of finished trajectories and the driver thread."""

    def __init__(self, engine, lock: EngineLock):
        self.engine = engine
        self.lock = lock
        self.pending: dict[str, Request] = {}  # submitted, not yet handed back by /poll or /abort
        self.outbox: dict[str, Trajectory] = {}  # finished, not yet handed back
        self.claimed: set[str] = set()  # ids a `run` caller waits for: never handed to /poll or /abort(None)
        self.ready = threading.Condition()  # guards pending and outbox
        self.driver = EngineDriver("cohort-rollout-driver", lock, busy=lambda: self.generating > 0, step=self._step)
        self.driver.start()

    @property
    def generating(self) -> int:
        """Requests the engine is still working on (in flight, not in the outbox)."""
        return len(self.pending) - len(self.outbox)

    def refuse_while_generating(self, what: str) -> None:
        """Conflict when requests are generating (call with the engine lock held)."""
        with self.ready:
            busy = self.generating
        if busy:
            raise Conflict(f"{what}: {busy} request(s) submitted through /submit are still generating; "
                           "poll them to the end or /abort them first (the trainer syncs weights only when idle)")

    def submit(self, requests: Sequence[Request]) -> None:
        with self.lock:
            with self.ready:
                taken = [r.request_id for r in requests if r.request_id in self.pending]
                if taken:
                    raise BadRequest(f"submit: request id(s) {taken[:5]} are already in flight on this server; "
                                     "ids must be unique among requests not yet returned by /poll or /abort")
                self.pending.update((r.request_id, r) for r in requests)
            try:
                self.engine.submit(list(requests))
            except BaseException:
                with self.ready:
                    for r in requests:
                        self.pending.pop(r.request_id, None)
                raise
            with self.ready:
                self.ready.notify_all()
            self.driver.wake()

    @property
    def unclaimed(self) -> int:
        """Requests in flight for /submit's client (not claimed by a `run` caller); call with `ready` held."""
        return sum(1 for i in self.pending if i not in self.claimed)

    def poll(self, timeout_s: float) -> list[Trajectory]:
        """The finished trajectories, waiting up to timeout_s (capped) for one; [] when nothing is in flight."""
        def finished() -> list[str]:
            return [i for i in self.outbox if i not in self.claimed]

        with self.ready:
            self.ready.wait_for(lambda: finished() or not self.unclaimed, timeout=min(timeout_s, MAX_POLL_WAIT_S))
            return self._hand_back(finished())

    def run(self, requests: Sequence[Request]) -> list[Trajectory]:
        """Submit these requests and wait for their trajectories (in order), which only this caller gets back."""
        ids = [r.request_id for r in requests]
        with self.ready:
            self.claimed.update(ids)
        try:
            self.submit(requests)
            with self.ready:
                while not all(i in self.outbox for i in ids):
                    if self.driver.failure is not None:
                        raise RuntimeError(f"the engine driver stopped: {type(self.driver.failure).__name__}: {self.driver.failure}")
                    self.ready.wait(timeout=1.0)
                return self._hand_back(ids)
        finally:
            with self.ready:
                self.claimed.difference_update(ids)

    def abort(self, request_ids: Iterable[str] | None) -> list[Trajectory]:
        """Stop these requests (None: all in flight); each one's trajectory so far, finished ones as they finished."""
        with self.lock:
            with self.ready:
                candidates = self.pending if request_ids is None else dict.fromkeys(request_ids)
                ids = [i for i in candidates if i in self.pending and i not in self.claimed]
                running = [i for i in ids if i not in self.outbox]
            partial = self.engine.abort(running) if running else []
            with self.ready:
                self._collect(partial)
                self._lost(running)
                return self._hand_back([i for i in ids if i in self.outbox])

    def close(self) -> None:
        self.driver.close(timeout_s=0)

    # ------------------------------------------------------------------ internals (self.ready held)

    def _hand_back(self, ids: list[str]) -> list[Trajectory]:
        out = [self.outbox.pop(i) for i in ids]
        for i in ids:
            del self.pending[i]
        self.ready.notify_all()
        return out

    def _collect(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            if t.request_id in self.pending and t.request_id not in self.outbox:
                self.outbox[t.request_id] = t
        self.ready.notify_all()

    def _lost(self, ids: Iterable[str], reason: str = "the engine dropped this request without an answer") -> None:
        """An "error" trajectory (resumed tokens kept) for each of `ids` the engine gave nothing back for."""
        version = self.engine.policy_version
        for i in ids:
            if i in self.pending and i not in self.outbox:
                self.outbox[i] = self.pending[i].complete(Trajectory([], [], "error", version, error=reason))
        self.ready.notify_all()

    # ------------------------------------------------------------------ one poll of the driver thread

    def _step(self) -> None:
        """One engine poll (driver lock held): what finished goes to the outbox; an engine failure, or requests the
        engine silently dropped, become "error" trajectories for every request still generating."""
        try:
            got, failure = self.engine.poll(timeout=DRIVER_POLL_S), None
        except Exception as exc:  # the engine failed: every request still generating gets the reason
            got, failure = [], f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                self.engine.abort(None)
        with self.ready:
            self._collect(got)
            running = [i for i in self.pending if i not in self.outbox]
            if failure is not None:
                self._lost(running, failure)
            elif running and not got and not self.engine.in_flight:
                self._lost(running)

"""One thread that drives an engine: the rollout server's driver and the scheduler's pump are this one component.

An engine that generates in steps (vLLM in-process, transformers' continuous batching) makes progress only while
someone calls its `poll`; a rollout server's client only collects while it polls. `EngineDriver` is that someone,
on its own thread: while `busy()` says requests are in flight it takes the engine lock on the driver's side
(`EngineLock.driver`: callers go first, so a weight push or an /abort waits at most for the poll in progress) and
calls `step()`, one short poll whose results the owner files away; while nothing is in flight it sleeps until
`wake()` (a submit) or `close()`, polling nothing. The time it sleeps is counted (`idle_s`): the engine's idle time.

An exception from `step` ends the thread; it is kept in `failure` and the owner's `on_failure` is called, so the
owner can wake whoever waits on it (the trainer re-raises it on its own thread). What a failed poll means for the
requests in flight is the owner's business (the server reports each as an "error" trajectory; the trainer stops).

Left out: more than one thread polling one engine (the lock would serialise them anyway).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from cohort.rollout.base import EngineLock, engine_thread

IDLE_WAIT_S = 0.5  # an idle driver re-checks `busy()` at least this often (a wake() or close() is seen at once)


class EngineDriver:
    """A thread calling `step()` under the lock's driver side while `busy()`; asleep otherwise (module docstring)."""

    def __init__(self, name: str, lock: EngineLock, busy: Callable[[], bool], step: Callable[[], None],
                 on_failure: Callable[[BaseException], None] | None = None):
        self.name, self.lock, self.busy, self.step, self.on_failure = name, lock, busy, step, on_failure
        self.cond = threading.Condition()
        self.woken = False  # a wake() not yet seen by the thread
        self.stopping = False
        self.idle_s = 0.0  # time asleep with nothing in flight (read and reset by the owner's metrics)
        self.failure: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread (once; later calls only wake it)."""
        if self.thread is None:
            self.thread = threading.Thread(target=engine_thread(self._run), name=self.name, daemon=True)
            self.thread.start()
        self.wake()

    def wake(self) -> None:
        """Something was submitted: an idle driver starts polling now."""
        with self.cond:
            self.woken = True
            self.cond.notify_all()

    def take_idle_s(self) -> float:
        with self.cond:
            idle, self.idle_s = self.idle_s, 0.0
        return idle

    def _run(self) -> None:
        try:
            while not self.stopping:
                with self.lock.driver():
                    busy = self.busy()
                    if busy:
                        self.step()
                if not busy:
                    self._sleep()
        except BaseException as exc:  # the engine failed: the owner decides what the requests in flight become
            self.failure = exc
            if self.on_failure is not None:
                self.on_failure(exc)

    def _sleep(self) -> None:
        with self.cond:
            start = time.perf_counter()
            self.cond.wait_for(lambda: self.woken or self.stopping, timeout=IDLE_WAIT_S)
            self.idle_s += time.perf_counter() - start
            self.woken = False

    def close(self, timeout_s: float = 30.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)

"""Stopping a run on purpose: signals, and non-finite numbers.

- `GracefulStop`: the first SIGINT or SIGTERM only sets a flag; the driver loop
  finishes the step it is in, saves a checkpoint and exits 0 with the command
  that resumes. A second signal raises `KeyboardInterrupt` at once (no save),
  and the process exits within `abort_after_s` whatever it is doing: a hung
  episode (an environment's seat waiting on a remote sandbox, an agent blocked in a
  thread) can hold the main thread in C code, where no Python handler runs, or
  keep a non-daemon thread that the interpreter's exit waits for. So the signals
  also reach a watcher thread through `signal.set_wakeup_fd` (written by the C
  handler, whatever the main thread does); from the second on it ends the
  process (`os._exit(130)`) when, `abort_after_s` later, the main thread is still
  inside the loop, or the interpreter's exit has waited that long for a thread
  (threading's shutdown joins the executor threads a hung episode holds): no
  save, so the newest checkpoint on disk stays the last saved state. A caller
  that caught the KeyboardInterrupt and lives on (a notebook) is left alone. Handlers are installed only in the main thread and restored on exit.
- `check_finite`: called after the backward pass and before the optimizer step.
  A NaN or Inf loss or gradient norm raises `NonFiniteError` naming the step and
  the metric, so the weights and optimizer state are still the last good ones
  and the driver can save them.

Left out: retrying a bad step with a smaller learning rate or skipping the
batch. A non-finite loss is almost always a bug or a numerical limit the user
must see (an overflowing reward scale, fp16 overflow, a learning rate far too
high); silently skipping it hides that.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
from typing import Callable


class NonFiniteError(RuntimeError):
    """The loss or gradient norm of `step` is NaN or Inf; the optimizer step was not taken."""

    def __init__(self, step: int, metric: str, value: float):
        self.step, self.metric, self.value = step, metric, value
        super().__init__(f"non-finite {metric} ({value}) at step {step}; the optimizer step was not taken")


class RunHalted(RuntimeError):
    """The run stopped itself after saving its last good state; the message says why and how to go on."""


def check_finite(step: int, **values: float) -> None:
    """Raise `NonFiniteError` for the first of `values` (in argument order) that is NaN or ±Inf."""
    for metric, value in values.items():
        if not math.isfinite(value):
            raise NonFiniteError(step, metric, value)


class GracefulStop:
    """`with GracefulStop(notify) as stop:` … `if stop.requested: save and leave`."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, notify: Callable[[str], None] = print, abort_after_s: float = 10.0):
        self.notify = notify
        self.abort_after_s = abort_after_s
        self.requested: str | None = None  # the name of the first signal received
        self._previous: dict[int, object] = {}
        self._wakeup: tuple[int, int] | None = None  # (read end, write end) of the watcher's pipe
        self._previous_fd = -1
        self._inside = False  # between __enter__ and __exit__

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"second signal ({name}): aborting without saving")
        self.requested = name
        self.notify(f"received {name}: finishing the current step, then saving a checkpoint (send it again to abort at once)")

    def _watch(self, read_fd: int) -> None:
        """The watcher thread: counts the signals the C handler writes; from the second on, ends the process when the
        run is still inside the block `abort_after_s` later (the main thread never got back to Python), or when the
        interpreter's exit has waited `abort_after_s` for a thread (a hung episode's); never while the main thread
        lives on outside the block (a notebook that caught the KeyboardInterrupt)."""
        seen = 0
        try:
            while seen < 2:
                data = os.read(read_fd, 64)
                if not data:
                    return  # (the pipe was closed: the run left the block without a second signal)
                seen += sum(1 for b in data if b in (signal.SIGINT, signal.SIGTERM))
        except OSError:
            return
        finally:
            os.close(read_fd)
        deadline, exiting = time.monotonic() + self.abort_after_s, None
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            if exiting is None and (getattr(threading, "_SHUTTING_DOWN", False) or not threading.main_thread().is_alive()):
                exiting = now + self.abort_after_s  # (a clean exit ends the process well before this)
            if now >= deadline and (self._inside or (exiting is not None and now >= exiting)):
                sys.stderr.write(f"cohort: aborted: still running {self.abort_after_s:g} s after the second signal (a "
                                 "hung episode or thread); the newest checkpoint under RUN_DIR/checkpoints, if any, is "
                                 "the last saved state\n")
                sys.stderr.flush()
                os._exit(130)

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            self._previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
            self._wakeup = (read_fd, write_fd)
            threading.Thread(target=self._watch, args=(read_fd,), name="cohort-abort-watch", daemon=True).start()
        self._inside = True
        return self

    def __exit__(self, *exc_info) -> None:
        self._inside = False
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._previous_fd)
            os.close(self._wakeup[1])  # (a watcher past its second signal no longer reads it)
            self._wakeup = None

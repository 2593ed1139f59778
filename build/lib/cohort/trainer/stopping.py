"""Stopping a run on purpose: signals, and non-finite numbers.

- `GracefulStop`: the first SIGINT or SIGTERM only sets a flag; the driver loop
  finishes the step it is in, saves a checkpoint and exits 0 with the command
  that resumes. A second signal raises `KeyboardInterrupt` at once (no save).
  Handlers are installed only in the main thread and restored on exit.
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
import signal
import threading
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

    def __init__(self, notify: Callable[[str], None] = print):
        self.notify = notify
        self.requested: str | None = None  # the name of the first signal received
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None:
            raise KeyboardInterrupt(f"second signal ({name}): aborting without saving")
        self.requested = name
        self.notify(f"received {name}: finishing the current step, then saving a checkpoint (send it again to abort at once)")

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

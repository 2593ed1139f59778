"""Wall-clock timers of a step's named phases (generate, reward, logprob, update, critic, sync): `timing/<name>_s`.

The Trainer holds one `Phases`; its weight sync (cohort/trainer/weight_sync.py) and the rollout collection
(cohort/rollout/collect.py) time their own phases with it. A phase that is never entered in a step has no key in that
step's metrics. The innermost phase an exception left is kept for the error message (cohort/trainer/failure.py).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict


class Phases:
    """Wall-clock timing of named phases: `with phases("generate"): ...` adds to timing/generate_s."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.failed: str | None = None  # the innermost phase an exception left since the last pop() (for error messages)

    @contextlib.contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            self.failed = self.failed or name
            raise
        finally:
            self.seconds[name] += time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out = {f"timing/{k}_s": v for k, v in self.seconds.items()}
        self.seconds.clear()
        self.failed = None
        return out

"""Generating the next batch while the current one trains (`rollout.overlap`).

With overlap on, the driver loop asks the engine for generation batch k+1 in a
background thread right after batch k arrives, then scores and trains on batch
k while the engine samples. Batch k+1 therefore comes from the policy before
update k: one step stale. The update corrects it with truncated importance
weights pi_current / pi_sampler (cohort.algorithms.rollout_correction, fed the
engine's own log-probs of the sampled tokens) passed to the policy loss as
`token_weights`; the PPO ratio's denominator stays the current policy, detached.

Only the engine call runs in the thread (the batch's groups drained through the group stream,
`cohort.trainer.streaming.drain_batch`; they are scored group by group when the batch is taken): the sampler, the seeds, rewards,
advantages and every trainer-side pass stay on the main thread, and weights
are pushed into the engine only while no generation is in flight (the loop
waits for the pending batch first).

Where the engine runs decides how much really overlaps. With vLLM in the
trainer's process (rollout.mode=colocate) the two share one interpreter and
one OpenMP pool: the kernels release the GIL, but vLLM's Python scheduling and
the trainer's Python compete for it and both pools spin on the same cores, so
the gain on a small CPU machine is small. With rollout.mode=local_server the
engine is a child process bound to its own cores (`split_cores`) and the
background thread only waits on a loopback HTTP call, so generation and the
update run truly in parallel (measured in docs/performance.md).

Left out: more than one batch in flight (staleness would grow with the queue),
overlap with engines that share the trainer's module (`rollout.engine=hf`),
with batches reused for several optimizer steps, and with more than one
training process; exact resume drops a batch that was generated ahead.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from cohort.rollout.base import engine_thread


@dataclass
class PendingGeneration:
    """One requested generation batch: the prompts it holds and, once run, the engine's completions."""

    rows: list[int]  # dataset rows, each repeated G times
    prompts: list[list[int]]  # token ids, one entry per completion
    policy_version: int  # the policy version the engine held when sampling started
    seeds: list[int]  # one per completion
    sampling: Any  # the SamplingConfig of every request
    generation_index: int  # which generation batch (names its requests)
    run: Callable[[], list[Any]] | None = None  # the engine call, for a background generation
    future: Future | None = None
    _outs: list[Any] | None = field(default=None, repr=False)

    def result(self) -> list[Any]:
        """The completions: waits for a background generation, or runs the engine call now."""
        if self._outs is None:
            self._outs = self.future.result() if self.future is not None else self.run()
        return self._outs

    def wait(self) -> None:
        """Block until a background generation is done (keeping its result); a no-op otherwise."""
        if self.future is not None:
            self.result()


class BackgroundRollout:
    """One worker thread that runs at most one engine call at a time."""

    def __init__(self):
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cohort-rollout")

    def start(self, pending: PendingGeneration) -> PendingGeneration:
        pending.future = self._executor.submit(engine_thread(pending.run))
        return pending

    def close(self) -> None:
        self._executor.shutdown(wait=True)

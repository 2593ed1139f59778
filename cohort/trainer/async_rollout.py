"""Asynchronous training under a staleness bound (`rollout.max_staleness` = k).

The engine generates continuously: a pump thread polls it (in-process engines make progress inside `poll`;
a `cohort serve` child generates on its own cores and the poll only collects) and queues every group the
moment its G members are back. The trainer, on the main thread, takes each generation batch's B groups in
the order they finished, scores them (one reward call), trains, and pushes the new weights into the engine
between two of its steps with requests still in flight (`update_weights(..., in_flight=True)`): tokens
sampled afterwards carry the new version, so every token says which policy sampled it.

Admission control: generation batch n (B groups, the sampler's next prompts and the seeds of generation
index n, exactly as the synchronous trainer draws them) is submitted once the policy reaches version
n - k, so generation runs at most k versions ahead of training. A group can still be consumed later than
planned (its slowest member ran long and younger groups overtook it), so every group is checked when it
is taken: tokens more than k versions behind the policy that trains on them are masked out of the loss
(`rollout.stale_tokens = mask`, the rest of the completion still trains) or the whole group is dropped and
another taken (`drop`, whose replacement is a fresh prompt submitted at once). Hence `staleness/max` <= k.

k = 0 is the synchronous trainer: batch n is admitted only after update n - 1, with the weights of version n,
and its B groups are the only ones in flight; taken in submission order, they give the same completions,
rewards and updates.

Locking: one lock serialises every call into the engine (the pump's polls, the trainer's submits, weight
pushes, canary scores, aborts). It is an `EngineLock` (cohort/rollout/base.py): the trainer's calls go first,
the pump starting no poll while one waits, so the trainer waits at most for the poll in progress, which is short
(`POLL_S`: an engine step or a few, or one long-poll of a rollout server).
Liveness: an exception in the pump (the engine failed, a server is gone) is re-raised on the trainer's
thread; an engine that finishes nothing for `rollout.engine_timeout_s` while requests are in flight stops
the run with an error instead of hanging it.

Checkpoints: the groups admitted and not yet trained are saved as (rows, seeds) and resubmitted first on
resume, from the start (their partial tokens are not saved): the resumed run loses and repeats no prompt.

Metrics per generation batch: async/trainer_wait_frac (share of the time since the last batch the trainer
waited for groups), async/engine_idle_frac (share of that time the engine had nothing in flight; the pump then
sleeps until the next submit instead of polling),
async/stale_dropped (groups), async/stale_masked_tokens, async/in_flight_groups (admitted, not yet taken).

Left out: partial rollouts, dynamic sampling and rollout.overlap in this mode (validation refuses them),
several training processes.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from cohort.rollout.base import EngineLock, SamplingConfig, Trajectory, batch_requests, completion_seeds, engine_thread
from cohort.rollout.stream import FinishedGroup, GroupStream

POLL_S = 0.02  # longest single engine poll of the pump: how long a trainer's engine call may wait for the lock
IDLE_WAIT_S = 0.5  # an idle pump wakes at least this often (a submit or close wakes it at once)


@dataclass
class Admitted:
    """One admitted group: where its prompts and seeds came from."""

    generation_index: int
    rows: list[int]
    seeds: list[int]


class AsyncRollout:
    """The asynchronous generation side of a Trainer (module docstring)."""

    def __init__(self, trainer):
        cfg = trainer.cfg
        self.trainer, self.k, self.engine = trainer, cfg.rollout.max_staleness, trainer.engine
        self.g = trainer.plan.num_generations
        self.sampling = SamplingConfig(cfg.rollout.max_completion_length, cfg.rollout.temperature, cfg.rollout.top_p,
                                       cfg.rollout.top_k)
        self.timeout = cfg.rollout.engine_timeout_s
        self.stream = GroupStream(trainer.engine, "async")
        self.lock = EngineLock()  # every engine call; the trainer's before the pump's next poll
        self.cond = threading.Condition()  # self.done, self.failure, counters
        self.done: deque[FinishedGroup] = deque()
        self.admitted: dict[int, Admitted] = {}  # stream index -> its origin, until trained
        self.carry: list[Admitted] = []  # from a checkpoint: resubmitted first
        self.failure: BaseException | None = None
        self.stopping = False
        self.idle_s, self.submitted = 0.0, False  # the pump's time with nothing in flight; a submit not yet seen
        self.last_progress = time.monotonic()
        self.waited_s, self.since = 0.0, time.perf_counter()
        self.stale_dropped = self.stale_masked = 0
        self.thread: threading.Thread | None = None

    # ------------------------------------------------------------------ pump

    def start(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=engine_thread(self._pump), name="cohort-async-rollout", daemon=True)
            self.thread.start()

    def _pump(self) -> None:
        try:
            while not self.stopping:
                with self.lock.driver():
                    busy = self.stream.pending > 0
                    finished = self.stream.poll_once(POLL_S) if busy else []
                with self.cond:
                    if finished or not busy:
                        self.last_progress = time.monotonic()
                    if finished:
                        self.done.extend(finished)
                        self.cond.notify_all()
                    if not busy:  # nothing in flight: sleep until the trainer submits (no polling meanwhile)
                        idle_from = time.perf_counter()
                        self.cond.wait_for(lambda: self.submitted or self.stopping, timeout=IDLE_WAIT_S)
                        self.idle_s += time.perf_counter() - idle_from
                        self.submitted = False
        except BaseException as exc:  # the engine failed: the trainer's thread re-raises it
            with self.cond:
                self.failure = exc
                self.cond.notify_all()

    # ------------------------------------------------------------------ admission

    def admit(self) -> None:
        """Submit every generation batch the bound allows now: batch n once the policy is at version >= n - k."""
        t = self.trainer
        needed = t.plan.max_steps  # one generation batch per optimizer step in this mode
        entries, origins = [], []
        for item in self.carry:  # resumed from a checkpoint: first, from the start
            entries.append(([t.train_ids[i] for i in item.rows], item.seeds, item.rows))
            origins.append(item)
        self.carry = []
        while t.generation_index <= t.policy_version + self.k and t.generation_index < needed:
            rows = t.sampler.next_batch()
            seeds = completion_seeds(t.cfg.rollout.seed, t.generation_index, len(rows))
            for k in range(0, len(rows), self.g):
                entries.append(([t.train_ids[i] for i in rows[k:k + self.g]], seeds[k:k + self.g], rows[k:k + self.g]))
                origins.append(Admitted(t.generation_index, rows[k:k + self.g], seeds[k:k + self.g]))
            t.generation_index += 1
        self._submit(entries, origins)

    def _submit(self, entries: list[tuple], origins: list[Admitted]) -> None:
        if not entries:
            return
        with self.lock:
            indices = self.stream.submit_groups(entries, self.sampling)
        self.admitted.update(zip(indices, origins))
        with self.cond:  # wakes an idle pump
            self.submitted = True
            self.cond.notify_all()
        self.start()

    def _replace(self, origin: Admitted) -> None:
        """rollout.stale_tokens = drop: a fresh prompt in place of a dropped group, admitted now."""
        t = self.trainer
        rows = t.sampler.next_group()
        first = (origin.seeds[0] + 104_729 * (self.stale_dropped + 1)) % (2**31 - self.g - 1)
        seeds = list(range(first, first + self.g))
        self._submit([([t.train_ids[i] for i in rows], seeds, rows)], [Admitted(origin.generation_index, rows, seeds)])

    # ------------------------------------------------------------------ consumption

    def take(self, groups: int) -> list[FinishedGroup]:
        """The next `groups` groups in the order they finished, each within the staleness bound (module docstring);
        returned in submission order."""
        start = time.perf_counter()
        out: list[FinishedGroup] = []
        while len(out) < groups:
            group = self._next()
            if self._too_stale(group) and self.trainer.cfg.rollout.stale_tokens == "drop":
                self.stale_dropped += 1
                self._replace(self.admitted.pop(group.index))
                continue
            self.stale_masked += self._count_stale(group)
            out.append(group)
        for group in out:
            self.admitted.pop(group.index, None)
        self.waited_s += time.perf_counter() - start
        return sorted(out, key=lambda grp: grp.index)

    def _next(self) -> FinishedGroup:
        with self.cond:
            while not self.done:
                if self.failure is not None:
                    raise RuntimeError(f"the rollout engine failed while generating asynchronously: {self.failure}") from self.failure
                if self.stream.pending == 0 and self.thread is not None:
                    raise RuntimeError("asynchronous rollout: the trainer waits for groups but none is in flight "
                                       "(admission stopped early); please report this as a bug")
                stalled = time.monotonic() - self.last_progress
                if stalled > self.timeout:
                    raise RuntimeError(
                        f"the rollout engine finished nothing for {stalled:.0f} s with {self.stream.pending} group(s) in "
                        f"flight (rollout.engine_timeout_s = {self.timeout:g}); it has stalled or died. Check its logs; "
                        "raise rollout.engine_timeout_s if single completions really take this long")
                self.cond.wait(timeout=min(1.0, self.timeout))
            return self.done.popleft()

    def oldest_allowed(self) -> int:
        """The oldest policy version a token may come from when the current policy trains on it."""
        return self.trainer.policy_version - self.k

    def _too_stale(self, group: FinishedGroup) -> bool:
        return self._count_stale(group) > 0

    def _count_stale(self, group: FinishedGroup) -> int:
        return sum(1 for t in group.trajectories for v in t.versions if v < self.oldest_allowed())

    def metrics(self) -> dict[str, float]:
        now = time.perf_counter()
        with self.cond:
            elapsed = max(now - self.since, 1e-9)
            out = {"async/trainer_wait_frac": self.waited_s / elapsed,
                   "async/engine_idle_frac": min(1.0, self.idle_s / elapsed),
                   "async/stale_dropped": float(self.stale_dropped), "async/stale_masked_tokens": float(self.stale_masked),
                   "async/in_flight_groups": float(len(self.admitted))}
            self.idle_s = 0.0
        self.waited_s, self.since, self.stale_dropped, self.stale_masked = 0.0, now, 0, 0
        return out

    # ------------------------------------------------------------------ sharing the engine

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None) -> list[Trajectory]:
        """The engine's `generate` for someone else (the held-out eval) while groups are in flight: the pump is held
        off and this call polls for both, routing the stream's trajectories to it, so neither loses any."""
        requests = batch_requests(prompts, sampling, seeds)
        index = {r.request_id: i for i, r in enumerate(requests)}
        out: list[Trajectory | None] = [None] * len(requests)
        with self.lock:
            self.engine.submit(requests)
            missing, quiet_since = len(requests), time.monotonic()
            while missing:
                got = self.engine.poll(POLL_S)
                mine = [t for t in got if t.request_id in index]
                finished = self.stream.accept([t for t in got if t.request_id not in index])
                if finished:
                    with self.cond:
                        self.done.extend(finished)
                        self.cond.notify_all()
                for t in mine:
                    if t.status == "error":
                        raise RuntimeError(f"the rollout engine failed on request {t.request_id}: {t.error}")
                    out[index[t.request_id]] = t
                    missing -= 1
                quiet_since = time.monotonic() if got else quiet_since
                if time.monotonic() - quiet_since > self.timeout:
                    raise RuntimeError(f"the rollout engine finished nothing for {self.timeout:g} s while evaluating "
                                       "(rollout.engine_timeout_s); it has stalled or died")
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ state, shutdown

    def state_dict(self) -> dict[str, Any]:
        """The groups admitted and not trained yet (resubmitted from the start on resume)."""
        pending = [self.admitted[i] for i in sorted(self.admitted)] + self.carry
        return {"admitted": [{"generation_index": a.generation_index, "rows": a.rows, "seeds": a.seeds} for a in pending]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint (or a failed step's rewind, before the run stops): these groups are what is admitted and
        untrained; anything this process still has in flight is abandoned."""
        self.carry = [Admitted(int(a["generation_index"]), list(a["rows"]), list(a["seeds"])) for a in state["admitted"]]
        self.admitted = {}

    def close(self) -> None:
        with self.cond:  # wakes an idle pump at once
            self.stopping = True
            self.cond.notify_all()
        if self.thread is not None:
            self.thread.join(timeout=30)
        with self.lock:
            if self.stream.pending:
                self.stream.abort()

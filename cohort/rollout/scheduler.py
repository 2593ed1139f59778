"""The rollout scheduler: requests in flight between the trainer and the engine, finished groups out, admission by
rules that compose.

One `Scheduler` serves every way of running. It submits groups (G requests each, through one `GroupStream` for the
whole run), queues each group the moment its G members are back, and hands them to the batch's collection
(cohort/rollout/collect.py), which scores them and decides what to keep: the trainer's one call per batch is
`collect(request)`, which returns the batch's kept groups. The methods below that admit, take, screen, drop and
cut groups are that collection's steps (and the tests'); the trainer itself uses `collect`, `generate` (the
held-out eval), `lock`, `engine`, `rules`, `token_staleness_bound`, `state_dict`/`load_state_dict` and `close`.
What is submitted, and when, follows the rules (`AdmissionRules`, read once from the config):

- **staleness bound k** (`pipeline.max_staleness`, unset = 0): when a batch is collected, new generation batches
  (B groups each: the sampler's next prompts, the seeds of the next generation index) are admitted while fewer
  than (a + 1) × B admitted groups wait to be taken, a batches ahead: with one batch taken per update, batch n
  starts once batch n − a − 1 is trained, so generation runs at most a ≤ k versions ahead. a is 1 while the engine
  keeps up (nothing admitted earlier is still generating when a batch is collected) and k while it is behind
  (`batches_ahead`): k is a bound, not a target, and tokens are no older than the engine's speed needs. k = 0 is the
  synchronous trainer: the next batch only after the update before it, with the weights it made; nothing else is
  in flight, and the collection takes the B groups in submission order. With k ≥ 1 a driver thread
  (cohort/rollout/driver.py) keeps polling the engine, so it generates through the update, and new weights are
  pushed between two of its steps with requests in flight: every token carries the version that sampled it. A
  group taken with tokens more than k versions behind the policy that trains on it has them masked out of the loss
  (`pipeline.stale_tokens = mask`) or is dropped and replaced by a fresh prompt (`drop`).
- **over-provisioning** (`pipeline.over_provision` = f > 1, partial rollouts): when a batch is admitted, extra new
  groups are submitted so that ceil(f × B) groups are in flight or queued; the batch takes the first B to finish.
  With k = 0 nothing may generate across an update, so at the batch's end the rest is interrupted: each group
  keeps what its members sampled (token ids, engine log-probs, versions) in the continuation buffer
  (cohort/rollout/partial.py) and is resumed first, from those tokens, when the next batch is admitted; a member
  cut off `pipeline.max_aborts` times pins its group (the batch waits for it). With k ≥ 1 nothing is aborted: the
  surplus keeps generating under the staleness bound and is taken by the next batches.
- **refills** (`pipeline.dynamic_sampling`): the collection drops a group whose rewards are all equal and asks for
  one replacement (`drop(index, refill=True)`), a new prompt whose seeds continue its generation batch's slot
  numbering.

The rules compose: every combination runs the same code, the only difference being who polls the engine (the
trainer's thread when k = 0, between its own calls; the driver thread when k ≥ 1) and whether a batch's end
interrupts the rest (k = 0 with f > 1).

Every engine call holds `lock` (an `EngineLock`: the trainer's calls before the driver's next poll). The held-out
eval generates through `generate`, which routes trajectories of groups in flight to the queue, so none is lost.
State for a checkpoint: the generation index (batches admitted: it seeds every completion's sampling), the groups
admitted and not taken (resubmitted from the start on resume: their partial tokens are not saved) and the
continuation buffer.

Left out: more than one training process with k ≥ 1 or f > 1 (validation refuses them).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from cohort.config.admission import AdmissionRules
from cohort.rollout.base import EngineLock, SamplingConfig, Trajectory, batch_requests, completion_seeds
from cohort.rollout.collect import BatchRequest, Collected, collect_batch
from cohort.rollout.driver import EngineDriver
from cohort.rollout.partial import BufferedGroup, ContinuationBuffer
from cohort.rollout.stream import FinishedGroup, GroupStream

POLL_S = 0.02  # the driver's longest single poll: how long a trainer's engine call may wait for the lock


@dataclass
class Origin:
    """Where a submitted group came from: its generation batch, rows and seeds, and the policy version it was
    (last) submitted under."""

    generation_index: int
    rows: list[int]
    seeds: list[int]
    version: int


class Scheduler:
    """Groups in flight under the admission rules (module docstring)."""

    def __init__(self, engine, sampler, prompt_ids: list[list[int]], sampling: SamplingConfig, group_size: int,
                 batch_groups: int, rules: AdmissionRules, *, seed: int, generations: int):
        self.sampler, self.prompt_ids = sampler, prompt_ids
        self.sampling, self.g, self.batch_groups, self.rules = sampling, group_size, batch_groups, rules
        self.seed, self.generations = seed, generations  # generations: how many batches the run needs (admitted ahead)
        self.generation_index = 0  # generation batches admitted (seeds every completion's sampling; checkpointed)
        self.stream = GroupStream(engine, "rollout")
        self.lock = EngineLock()
        self.cond = threading.Condition()  # guards done, and wakes a trainer waiting for a group
        self.done: deque[FinishedGroup] = deque()  # complete groups, not taken yet, in the order they finished
        self.origins: dict[int, Origin] = {}  # stream index -> origin, until taken
        self.submitted_for: dict[int, int] = {}  # generation index -> groups submitted for it (refill seeds)
        self.carry: list[Origin] = []  # from a checkpoint: resubmitted first
        self.buffer = ContinuationBuffer(rules.max_aborts) if rules.interrupts else None
        self.driver = (EngineDriver("cohort-rollout-pump", self.lock, busy=lambda: self.stream.pending > 0,
                                    step=self._drive_step, on_failure=self._wake_all)
                       if rules.generates_through_updates else None)
        self.last_progress = time.monotonic()
        self.waited_s, self.since = 0.0, time.perf_counter()
        self.tail_s = 0.0  # k = 0: polling time with fewer than half the batch's completions decoding (rollout/tail_s)
        self.stale_dropped = self.stale_masked = 0

    @property
    def engine(self):
        """The engine every group goes to (held by the stream)."""
        return self.stream.engine

    @engine.setter
    def engine(self, engine) -> None:
        self.stream.engine = engine

    def collect(self, request: BatchRequest) -> Collected:
        """One generation batch (cohort/rollout/collect.py): admit what the rules allow, then take, score and keep
        groups until the batch is whole; the trainer's one call per batch."""
        return collect_batch(self, request)

    # ------------------------------------------------------------------ admission

    def admit(self, version: int) -> None:
        """Submit what the rules allow now: carried groups first (from a checkpoint; with partial rollouts, the
        continuation buffer), then new generation batches while fewer than (k + 1) × B admitted groups wait, then
        extra groups up to ceil(f × B) in flight."""
        entries = [self._entry(o) for o in self.carry]
        origins, self.carry = list(self.carry), []
        waiting = len(self.origins) + len(origins)  # admitted, not taken (the buffer's groups are this batch's own)
        for o in origins:
            o.version = version
        partial: list[BufferedGroup | None] = [None] * len(entries)
        if self.buffer is not None:  # resumed first, from what they sampled
            groups, resumed = self.buffer.submissions(self.batch_groups, self.prompt_ids)
            entries += [e[:3] for e in resumed]
            origins += [Origin(self.generation_index, g.rows, g.seeds, version) for g in groups]
            partial += groups
        new_batches, ahead = 0, self.batches_ahead(behind=self.stream.pending > 0)
        # (batches ahead stop at the run's last one; the batch needed now is always admitted)
        while waiting < (ahead + 1) * self.batch_groups and (self.generation_index < self.generations or waiting == 0):
            rows = self.sampler.next_batch()
            seeds = completion_seeds(self.seed, self.generation_index, len(rows))
            for k in range(0, len(rows), self.g):
                origins.append(Origin(self.generation_index, rows[k:k + self.g], seeds[k:k + self.g], version))
                entries.append(self._entry(origins[-1]))
                partial.append(None)
            self.submitted_for[self.generation_index] = 0
            self.generation_index += 1
            waiting += len(rows) // self.g
            new_batches += 1
        self._submit(entries, origins, partial)
        if new_batches and self.rules.over_provision > 1:
            extra = math.ceil(self.rules.over_provision * self.batch_groups) - self.stream.pending - len(self.done)
            self._submit_new(self.generation_index - 1, version, max(0, extra))

    def batches_ahead(self, behind: bool) -> int:
        """Generation batches admitted beyond the one being collected: one (it generates through the update) unless the
        engine is `behind` (still generating groups admitted earlier when this batch is collected), then up to k. An
        engine that keeps up gains nothing from a second batch ahead: it would only generate it earlier, from older
        weights, and idle as long (the arith demo's k = 2 trained every token 2 versions old for no speed)."""
        k = self.rules.max_staleness
        return k if behind else min(k, 1)

    def _entry(self, origin: Origin) -> tuple:
        return [self.prompt_ids[i] for i in origin.rows], origin.seeds, origin.rows

    def _submit(self, entries: list[tuple], origins: list[Origin], partial: list[BufferedGroup | None]) -> None:
        if not entries:
            return
        with self.lock:
            indices = self.stream.submit_groups([(*e, p.members if p is not None else None, e[2])  # (each request
                                                 for e, p in zip(entries, partial)], self.sampling)  # carries its row)
            ready = self.stream.accept([])  # groups whose members were all finished already (partial rollouts)
        if ready:
            with self.cond:
                self.done.extend(ready)
                self.cond.notify_all()
        for index, origin, group in zip(indices, origins, partial):
            self.origins[index] = origin
            self.submitted_for[origin.generation_index] = self.submitted_for.get(origin.generation_index, 0) + 1
            if self.buffer is not None:
                self.buffer.record(index, group or BufferedGroup(list(origin.rows), list(origin.seeds), [None] * self.g,
                                                                 [0] * self.g))
        if self.driver is not None:
            self.driver.start()

    def _submit_new(self, generation_index: int, version: int, n: int) -> None:
        """`n` groups of new prompts for generation batch `generation_index`, seeds continuing its slot numbering."""
        base = completion_seeds(self.seed, generation_index, self.batch_groups * self.g)[0]  # the batch's first seed
        origins = []
        for k in range(n):
            first = base + (self.submitted_for.get(generation_index, 0) + k) * self.g
            origins.append(Origin(generation_index, self.sampler.next_group(), list(range(first, first + self.g)), version))
        self._submit([self._entry(o) for o in origins], origins, [None] * n)

    def drop(self, index: int, version: int, refill: bool) -> None:
        """Dynamic sampling dropped group `index`; with `refill`, one new group takes its place (its generation
        batch's next seeds)."""
        origin = self.origins.pop(index)
        if refill:
            self._submit_new(origin.generation_index, version, 1)

    def top_up(self, n: int, version: int) -> None:
        """`n` new groups for the batch being collected, when nothing it could take is left in flight."""
        self._submit_new(max(self.generation_index - 1, 0), version, n)

    # ------------------------------------------------------------------ taking groups

    @property
    def pending(self) -> int:
        """Groups submitted and not taken yet (generating, or complete in the queue)."""
        with self.cond:
            return self.stream.pending + len(self.done)

    @property
    def ready(self) -> int:
        """Complete groups that `next_group` returns without waiting."""
        with self.cond:
            return len(self.done)

    def next_group(self) -> FinishedGroup | None:
        """The next complete group in the order they finished (the trainer's thread polls the engine for it when
        k = 0); None when nothing is in flight or queued."""
        start = time.perf_counter()
        try:
            if self.driver is None:
                self._poll_until_one()
            with self.cond:
                while not self.done and self.stream.pending:
                    self._check_alive()
                    self.cond.wait(timeout=min(1.0, self.rules.engine_timeout_s))
                return self.done.popleft() if self.done else None
        finally:
            self.waited_s += time.perf_counter() - start

    def _poll_until_one(self) -> None:
        tail = self.batch_groups * self.g / 2  # fewer completions than this still decoding: the batch's tail
        while not self.done and self.stream.pending:
            start, decoding = time.perf_counter(), self.engine.in_flight
            with self.lock:
                got = self.stream.poll_once()
            if decoding < tail:
                self.tail_s += time.perf_counter() - start
            if not got and not self.engine.in_flight and self.stream.pending:
                raise RuntimeError(f"the rollout engine stopped with {self.stream.pending} group(s) unanswered")
            self.done.extend(got)

    def _drive_step(self) -> None:
        """One poll of the driver thread (k >= 1): complete groups go to the queue."""
        finished = self.stream.poll_once(POLL_S)
        with self.cond:
            self.last_progress = time.monotonic() if finished or not self.stream.pending else self.last_progress
            if finished:
                self.done.extend(finished)
                self.cond.notify_all()

    def _wake_all(self, _: BaseException) -> None:
        with self.cond:
            self.cond.notify_all()

    def _check_alive(self) -> None:
        """Raise on the trainer's thread when the driver failed or the engine stalled (self.cond held)."""
        failure = self.driver.failure if self.driver is not None else None
        if failure is not None:
            raise RuntimeError(f"the rollout engine failed while generating asynchronously: {failure}") from failure
        stalled = time.monotonic() - self.last_progress
        if stalled > self.rules.engine_timeout_s:
            raise RuntimeError(
                f"the rollout engine finished nothing for {stalled:.0f} s with {self.stream.pending} group(s) in flight "
                f"(pipeline.engine_timeout_s = {self.rules.engine_timeout_s:g}); it has stalled or died. Check its logs; "
                "raise pipeline.engine_timeout_s if single completions really take this long")

    def submitted_version(self, index: int) -> int:
        """The policy version group `index` (admitted, not taken) was last submitted under."""
        return self.origins[index].version

    def untaken_groups(self) -> list[int]:
        """The stream indices of the groups admitted and not taken yet, oldest first."""
        return sorted(self.origins)

    def screen(self, group: FinishedGroup, version: int) -> bool:
        """The staleness bound at take time (k >= 1): False when the group held tokens older than version − k and
        `stale_tokens = drop` (a fresh prompt was admitted in its place); else True, its stale tokens counted (they
        are masked out of the loss, `token_staleness_bound`)."""
        if not self.rules.generates_through_updates:
            return True  # (k = 0: the only older tokens are resumed partial rollouts, bounded by max_aborts)
        stale = sum(1 for t in group.trajectories for v in t.versions if v < version - self.rules.max_staleness)
        if stale and self.rules.stale_tokens == "drop":
            self.stale_dropped += 1
            self._replace_stale(self.origins.pop(group.index), version)
            return False
        self.stale_masked += stale
        return True

    def _replace_stale(self, origin: Origin, version: int) -> None:
        rows = self.sampler.next_group()
        first = (origin.seeds[0] + 104_729 * (self.stale_dropped + 1)) % (2**31 - self.g - 1)
        replacement = Origin(origin.generation_index, rows, list(range(first, first + self.g)), version)
        self._submit([self._entry(replacement)], [replacement], [None])

    @property
    def token_staleness_bound(self) -> float:
        """The oldest a trained token may be, in versions behind the policy training on it (k; unbounded when k = 0,
        where only resumed partial rollouts hold older tokens)."""
        return float(self.rules.max_staleness) if self.rules.generates_through_updates else math.inf

    def pinned_open(self) -> bool:
        """Partial rollouts: a pinned group is still generating (the batch may not end yet)."""
        return self.buffer is not None and self.buffer.pinned_open(self.stream)

    def pinned(self) -> set[int]:
        return self.buffer.counts.pinned_indices if self.buffer is not None else set()

    def end_batch(self, taken: list[FinishedGroup], surplus: list[FinishedGroup]) -> None:
        """The batch is `taken`. `surplus`: complete groups handed out but not in it. With k = 0 and partial rollouts
        everything else is interrupted into the continuation buffer; otherwise the surplus goes back to the front of
        the queue and what is in flight keeps generating."""
        for group in taken:
            self.origins.pop(group.index, None)
        if self.buffer is None:
            with self.cond:
                self.done.extendleft(reversed(sorted(surplus, key=lambda grp: grp.index)))
            return
        with self.lock:
            interrupted = self.stream.interrupt()  # (complete groups not handed out yet come back too)
        with self.cond:
            queued, self.done = list(self.done), deque()
        complete = [(grp.index, grp.trajectories) for grp in surplus + queued]
        complete += [(i, members) for i, _, members in interrupted if all(m is not None and m.finished for m in members)]
        self.buffer.put_interrupted([item for item in interrupted if not all(m is not None and m.finished for m in item[2])])
        for index, members in sorted(complete, key=lambda item: item[0]):
            self.buffer.put_complete(index, members)
        for index, _ in complete:
            self.origins.pop(index, None)
        for index, _, _ in interrupted:
            self.origins.pop(index, None)

    def abort(self) -> None:
        """Drop everything in flight or queued (a failed batch): nothing of it stays in the engine."""
        with self.lock:
            self.stream.abort()
        with self.cond:
            self.done.clear()
        self.origins.clear()

    def metrics(self, trained: list[Trajectory], batch_version: int) -> dict[str, float]:
        """Per batch: partial/* with partial rollouts (k = 0), async/* when generating through updates, and with
        k = 0 rollout/tail_s: the seconds the trainer's polls spent while fewer than half the batch's completions
        (B × G) were still decoding, the engine working on a handful of sequences (the long tail)."""
        out: dict[str, float] = {} if self.driver is not None else {"rollout/tail_s": self.tail_s}
        self.tail_s = 0.0
        if self.buffer is not None:
            out.update(self.buffer.counts.metrics(len(self.buffer), trained, batch_version))
        if self.driver is not None:
            now = time.perf_counter()
            elapsed = max(now - self.since, 1e-9)
            out.update({"async/trainer_wait_frac": self.waited_s / elapsed,
                        "async/engine_idle_frac": min(1.0, self.driver.take_idle_s() / elapsed),
                        "async/stale_dropped": float(self.stale_dropped),
                        "async/stale_masked_tokens": float(self.stale_masked),
                        "async/in_flight_groups": float(len(self.origins))})
            self.since = now
        self.waited_s, self.stale_dropped, self.stale_masked = 0.0, 0, 0
        return out

    # ------------------------------------------------------------------ sharing the engine

    def generate(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int] | None = None,
                 rows: list[int] | None = None) -> list[Trajectory]:
        """The engine's `generate` for someone else (the held-out eval), also while groups are in flight: the driver
        is held off and this call polls for both, queueing the groups' trajectories, so neither loses any."""
        requests = batch_requests(prompts, sampling, seeds, rows=rows)
        index = {r.request_id: i for i, r in enumerate(requests)}
        out: list[Trajectory | None] = [None] * len(requests)
        with self.lock:
            self.engine.submit(requests)
            missing, quiet_since = len(requests), time.monotonic()
            while missing:
                got = self.engine.poll(POLL_S)
                finished = self.stream.accept([t for t in got if t.request_id not in index])
                if finished:
                    with self.cond:
                        self.done.extend(finished)
                        self.cond.notify_all()
                for t in (t for t in got if t.request_id in index):
                    if t.status == "error":
                        raise RuntimeError(f"the rollout engine failed on request {t.request_id}: {t.error}")
                    out[index[t.request_id]] = t
                    missing -= 1
                quiet_since = time.monotonic() if got else quiet_since
                if time.monotonic() - quiet_since > self.rules.engine_timeout_s:
                    raise RuntimeError(f"the rollout engine finished nothing for {self.rules.engine_timeout_s:g} s while "
                                       "evaluating (pipeline.engine_timeout_s); it has stalled or died")
        return out  # type: ignore[return-value]

    # ------------------------------------------------------------------ state, shutdown

    def state_dict(self) -> dict[str, Any]:
        """The generation index, the groups admitted and not taken (resubmitted from the start on resume) and the
        continuation buffer."""
        admitted = [self.origins[i] for i in sorted(self.origins)] + self.carry
        state: dict[str, Any] = {"generation_index": self.generation_index,
                                 "admitted": [{"generation_index": o.generation_index, "rows": o.rows, "seeds": o.seeds}
                                              for o in admitted]}
        if self.buffer is not None:
            state.update(self.buffer.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """From a checkpoint (or a failed step's rewind, before the run stops): these groups are what is admitted and
        untaken; anything this process still has in flight is abandoned. (Checkpoints written before the scheduler
        held this state under "async_rollout" or "continuations": either half is read; the checkpoint module puts
        in the generation index of those that saved it beside the trainer's counters.)"""
        self.generation_index = int(state["generation_index"])
        self.carry = [Origin(int(a["generation_index"]), list(a["rows"]), list(a["seeds"]), 0)
                      for a in state.get("admitted", [])]
        self.origins = {}
        if self.buffer is not None and "groups" in state:
            self.buffer.load_state_dict(state)

    def close(self) -> None:
        if self.driver is not None:
            self.driver.close()
        with self.lock:
            if self.stream.pending:
                self.stream.abort()

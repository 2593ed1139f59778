"""Groups of G requests over the request-level engine protocol, each handed on as soon as its G members are done.

`GroupStream(engine, prefix)` submits a group with `submit_group(prompt_ids, sampling, seeds, key=...)`: one
`Request` per member (carrying its dataset row when the caller gives the rows), ids `<prefix>.<n>/g<group>/<slot>` (n unique in the process: an engine shared by several
trainers never mixes their requests) (the group and the slot are read back from the id, so
nothing depends on the order in which the engine returns them). Iterating the stream yields a `FinishedGroup`
(its G trajectories in slot order, and the caller's `key`) the moment its last member is polled; groups may be
submitted while iterating (a refill), and iteration ends when no submitted group is left (`next_group()` is one
step of it: None then; `ready` counts groups complete but not handed out, so a caller can take every group of
one poll before it decides anything). `abort()` stops
every member still in flight and forgets their groups.

Choices: the order in which groups are yielded is the order in which they finish, not the order of
submission; a caller that needs submission order (the trainer does, so a streamed batch equals the batch
path) indexes by `FinishedGroup.index`. A trajectory with status "error" raises, naming the request (a group
with a hole cannot be scored). Trajectories whose id is not one of this stream's are ignored: one engine may
serve several streams.

Partial groups (partial rollouts, cohort/rollout/partial.py): `submit_groups` takes, per group, an optional
list of what each member already has: a finished trajectory (kept as is, nothing submitted), an aborted one
(submitted again with `resume=` it: the engine continues from its token ids), or None (sampled from the
start). `interrupt(keep)` aborts every open group except those in `keep` and returns each one's members as
they stand (finished, or aborted with what they had sampled): what a continuation buffer holds.

Left out: admission (the rollout scheduler, cohort/rollout/scheduler.py, decides what to submit).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Sequence

from cohort.rollout.base import Request, SamplingConfig, Trajectory


_stream_ids = itertools.count()  # makes every stream's prefix unique in this process (engines outlive trainers)


@dataclass
class FinishedGroup:
    """One group whose G trajectories are all back: `index` counts groups in submission order from 0."""

    index: int
    key: Any  # the caller's label for the group (e.g. its dataset row)
    trajectories: list[Trajectory]  # slot order


@dataclass
class _OpenGroup:
    key: Any
    slots: list[Trajectory | None]
    missing: int = field(init=False)

    def __post_init__(self):
        self.missing = len(self.slots)


class GroupStream:
    """Submit groups of requests, iterate over them as each group completes (see the module docstring)."""

    def __init__(self, engine, prefix: str):
        self.engine = engine
        self.prefix = f"{prefix}.{next(_stream_ids)}"  # e.g. "gen3.17": request ids "gen3.17/g<group>/<slot>"
        self._open: dict[int, _OpenGroup] = {}
        self._submitted = 0  # groups submitted so far (the next group's index)
        self._ready: list[int] = []  # complete groups not yet handed out, in the order they will be

    @property
    def submitted(self) -> int:
        return self._submitted

    @property
    def pending(self) -> int:
        """Groups submitted and not yet handed out (complete or not)."""
        return len(self._open)

    def submit_group(self, prompt_ids: Sequence[Sequence[int]], sampling: SamplingConfig, seeds: Sequence[int | None],
                     key: Any = None) -> int:
        """Start one group: member `slot` samples `prompt_ids[slot]` with `seeds[slot]`. Returns the group's index."""
        return self.submit_groups([(prompt_ids, seeds, key)], sampling)[0]

    def submit_groups(self, groups: Sequence[tuple], sampling: SamplingConfig) -> list[int]:
        """Start several groups, each (prompt_ids, seeds, key), (prompt_ids, seeds, key, partial) or (prompt_ids,
        seeds, key, partial, rows), in one engine submit (one HTTP call for a rollout server, which keeps each group
        on one server); their indices.

        `partial[slot]` (module docstring): a finished trajectory is placed at once, an aborted one is resumed, None
        samples from the start. A group whose members are all finished is ready without a request. `rows[slot]`: the
        member's dataset row, carried by its request (`Request.row`)."""
        requests, indices = [], []
        for prompt_ids, seeds, key, *rest in groups:
            partial = rest[0] if rest and rest[0] is not None else [None] * len(prompt_ids)
            rows = rest[1] if len(rest) > 1 and rest[1] is not None else [None] * len(prompt_ids)
            if not (len(prompt_ids) == len(seeds) == len(partial)) or not prompt_ids:
                raise ValueError(f"a group needs one seed (and one partial entry) per member and at least one member; got "
                                 f"{len(prompt_ids)} prompts, {len(seeds)} seeds and {len(partial)} partial entries")
            index, self._submitted = self._submitted, self._submitted + 1
            group = self._open[index] = _OpenGroup(key, [None] * len(prompt_ids))
            for slot, (prompt, seed, done, row) in enumerate(zip(prompt_ids, seeds, partial, rows)):
                rid = f"{self.prefix}/g{index}/{slot}"
                if done is not None and done.finished:
                    group.slots[slot] = replace(done, request_id=rid)
                    group.missing -= 1
                else:
                    requests.append(Request(rid, tuple(int(t) for t in prompt), sampling, seed, resume=done, row=row))
            if group.missing == 0:
                self._ready.append(index)
            indices.append(index)
        if requests:
            self.engine.submit(requests)
        return indices

    def is_open(self, index: int) -> bool:
        """Group `index` was submitted and is not complete yet."""
        return index in self._open and index not in self._ready

    @property
    def ready(self) -> int:
        """Groups already complete (from the last poll) and not yet handed out: `next_group` returns them without polling."""
        return len(self._ready)

    def next_group(self) -> FinishedGroup | None:
        """The next complete group (polling the engine until one is); None when no submitted group is left."""
        while not self._ready and self._open:
            got = self.engine.poll()
            if not got and not self.engine.in_flight:
                raise RuntimeError(f"the rollout engine stopped with {len(self._open)} group(s) of stream "
                                   f"{self.prefix!r} unanswered")
            self._ready += sorted(index for t in got if (index := self._place(t)) is not None)  # lower index first
        if not self._ready:
            return None
        index = self._ready.pop(0)
        group = self._open.pop(index)
        return FinishedGroup(index, group.key, group.slots)  # type: ignore[arg-type]

    def poll_once(self, timeout: float | None = None) -> list[FinishedGroup]:
        """One engine poll (at most `timeout` seconds): the groups complete now, lower index first, handed out."""
        return self.accept(self.engine.poll(timeout) if self._open and len(self._ready) < len(self._open) else [])

    def accept(self, trajectories: Sequence[Trajectory]) -> list[FinishedGroup]:
        """Place trajectories someone else polled (ids not of this stream are ignored); the groups complete now."""
        self._ready += sorted(index for t in trajectories if (index := self._place(t)) is not None)
        out = [FinishedGroup(index, self._open[index].key, self._open.pop(index).slots) for index in self._ready]
        self._ready = []
        return out  # type: ignore[misc]

    def __iter__(self) -> Iterator[FinishedGroup]:
        while (group := self.next_group()) is not None:
            yield group

    def _place(self, trajectory: Trajectory) -> int | None:
        """Put a polled trajectory into its group's slot; the group's index when that completed it."""
        index, slot = self._parse(trajectory.request_id)
        group = self._open.get(index) if index is not None else None
        if group is None or not 0 <= slot < len(group.slots) or group.slots[slot] is not None:
            return None  # not one of ours (another stream on the same engine), or already placed
        if trajectory.status == "error":
            raise RuntimeError(f"the rollout engine failed on request {trajectory.request_id}: {trajectory.error}")
        group.slots[slot] = trajectory
        group.missing -= 1
        return index if group.missing == 0 else None

    def _parse(self, request_id: str) -> tuple[int | None, int]:
        head, _, rest = request_id.rpartition("/g")
        group, _, slot = rest.partition("/")
        if head != self.prefix or not group.isdigit() or not slot.isdigit():
            return None, -1
        return int(group), int(slot)

    def interrupt(self, keep: Iterable[int] = ()) -> list[tuple[int, Any, list[Trajectory | None]]]:
        """Abort every group not handed out except those in `keep`; each one's (index, key, members): finished
        trajectories, aborted ones with what they had sampled, None where the engine returned nothing."""
        keep = set(keep)
        taken = {index: group for index, group in self._open.items() if index not in keep}
        ids = [f"{self.prefix}/g{index}/{slot}" for index, group in taken.items()
               for slot, t in enumerate(group.slots) if t is None]
        for t in self.engine.abort(ids) if ids else []:
            index, slot = self._parse(t.request_id)
            if index in taken and 0 <= slot < len(taken[index].slots) and taken[index].slots[slot] is None:
                taken[index].slots[slot] = t
        for index in taken:
            del self._open[index]
        self._ready = [i for i in self._ready if i not in taken]
        return [(index, group.key, group.slots) for index, group in sorted(taken.items())]

    def abort(self) -> list[Trajectory]:
        """Stop every member still in flight; their groups are dropped. Returns what the engine gave back."""
        ids = [f"{self.prefix}/g{index}/{slot}" for index, group in self._open.items()
               for slot, t in enumerate(group.slots) if t is None]
        self._open.clear()
        self._ready.clear()
        return self.engine.abort(ids) if ids else []

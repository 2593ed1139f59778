"""Partial rollouts (APRIL): over-provision each generation batch, keep what was cut off, resume it next step.

With `pipeline.over_provision` = f > 1, a step submits ceil(f × B) groups for its B (the continuation buffer's
groups first, in the order they were buffered, then the batch's new prompts, then extra prompts from the
sampler). As soon as B whole groups are done and scored (and kept, under dynamic sampling) the step takes
them and interrupts the rest (`GroupStream.interrupt`): each unfinished group goes into the buffer whole —
members that finished keep their trajectory, members that were cut off keep the tokens they sampled with
their per-token engine log-probs and policy versions — and is resumed first next step. A member whose record
cannot be continued (`EpisodeRecord.resumable` False: an agent run, whose program died with the cut) starts over
from its prompt instead, with a fresh seed; its cut still counts towards the abort cap. Resuming submits the
request again with `resume=` its partial trajectory, so the engine continues from the token ids exactly as
sampled (never from re-tokenized text). Groups that completed beyond the step's B are buffered complete and
are the first ones taken next step. A group is never split across steps.

The abort cap (`pipeline.max_aborts`): a member cut off that many times pins its group; a step does not end
while a pinned group is still generating (it runs to the end; being first in line, it is usually done long
before), so no trajectory collects tokens from more than max_aborts + 1 policy versions.

Resumed members draw from a fresh seed (the original seed moved by the abort count): reusing the seed would
replay the random numbers that sampled the kept prefix against the continuation.

Tokens sampled by an older policy are off-policy when trained; `algorithm.off_policy_objective` decides how
they enter the loss (docs/algorithms.md). The buffer is trainer state: checkpoints save it (`state_dict`), so a
resumed run neither loses nor repeats a prompt; a member's multi-turn record is saved as it saves itself
(`Trajectory.to_state`, `EpisodeRecord.to_state`: plain data, no live instance).

Metrics per generation batch: partial/aborted (requests cut off), partial/resumed (requests continued),
partial/pinned (groups that had to run to the end), partial/buffered_groups (left for the next step),
partial/ratio (fraction of the batch's trajectories holding tokens from an earlier generation batch).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from cohort.rollout.base import Trajectory, continuation_seed


@dataclass
class BufferedGroup:
    """One group cut off (or completed beyond its step's batch): its dataset rows, members and abort counts."""

    rows: list[int]  # the dataset row of each member (the same row G times)
    seeds: list[int]  # each member's original seed
    members: list[Trajectory | None]  # finished, aborted (to resume), or None (start over)
    aborts: list[int]  # how often each member was cut off

    def pinned(self, max_aborts: int) -> bool:
        return any(n >= max_aborts for n in self.aborts)

    def submission(self, prompts: list[list[int]]) -> tuple:
        """(prompt_ids, seeds, key, partial) for `GroupStream.submit_groups`; the key is the rows, as for new groups."""
        seeds = [continuation_seed(s, n) if m is None or not m.finished else s
                 for s, n, m in zip(self.seeds, self.aborts, self.members)]
        return prompts, seeds, self.rows, self.members

    def to_state(self) -> dict[str, Any]:
        return {"rows": self.rows, "seeds": self.seeds, "aborts": self.aborts,
                "members": [m.to_state() if m is not None else None for m in self.members]}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BufferedGroup:
        members = [Trajectory.from_state(m) if m is not None else None for m in state["members"]]
        return cls(list(state["rows"]), list(state["seeds"]), members, list(state["aborts"]))


def _resumed(group: BufferedGroup, slot: int) -> list[int]:
    """The tokens member `slot` held when this step resumed it."""
    m = group.members[slot]
    return m.token_ids if m is not None else []


def _resumable(member: Trajectory) -> bool:
    """A cut-off member continues from its tokens unless its multi-turn record cannot (`EpisodeRecord.resumable`)."""
    return member.episode is None or member.episode.resumable


@dataclass
class StepCounts:
    """What one generation batch did with partial rollouts (its metrics)."""

    aborted: int = 0
    resumed: int = 0
    pinned: int = 0
    pinned_indices: set[int] = field(default_factory=set)  # stream indices of pinned groups

    def metrics(self, buffered: int, trained: list[Trajectory], generation_start: int) -> dict[str, float]:
        old = sum(1 for t in trained if t.versions and min(t.versions) < generation_start)
        return {"partial/aborted": float(self.aborted), "partial/resumed": float(self.resumed),
                "partial/pinned": float(self.pinned), "partial/buffered_groups": float(buffered),
                "partial/ratio": old / max(len(trained), 1)}


class ContinuationBuffer:
    """FIFO of `BufferedGroup`s between steps; trainer state (checkpointed through state_dict)."""

    def __init__(self, max_aborts: int):
        self.max_aborts = max_aborts
        self.groups: deque[BufferedGroup] = deque()
        self.counts = StepCounts()
        self.records: dict[int, BufferedGroup] = {}  # this step's stream index -> its group (rows, seeds, aborts)
        self.batch_groups = 0  # this step's B

    def __len__(self) -> int:
        return len(self.groups)

    def submissions(self, batch_groups: int, train_ids: list[list[int]]) -> tuple[list[BufferedGroup], list[tuple]]:
        """Empty the buffer for a new step: its groups (FIFO) and their `submit_groups` entries. (The extra new
        groups that make ceil(over_provision × B) in flight are the scheduler's admission rule, `Scheduler.admit`.)"""
        self.counts, self.records, self.batch_groups = StepCounts(), {}, batch_groups
        groups, self.groups = list(self.groups), deque()
        self.counts.resumed = sum(1 for g in groups for m in g.members if m is not None and not m.finished)
        return groups, [g.submission([train_ids[i] for i in g.rows]) for g in groups]

    def record(self, index: int, group: BufferedGroup) -> None:
        """Stream group `index` of this step is `group` (a buffered one, or a new one with no members yet)."""
        self.records[index] = group
        if group.pinned(self.max_aborts) and self.counts.pinned < self.batch_groups:  # (at most a batch of them)
            self.counts.pinned += 1
            self.counts.pinned_indices.add(index)

    def put_interrupted(self, interrupted: list[tuple[int, Any, list]]) -> None:
        """Buffer each interrupted group (stream index, key, members): members cut off count one more abort."""
        for index, _, members in interrupted:
            group = self.records[index]
            aborts = list(group.aborts)
            for slot, m in enumerate(members):
                if m is not None and not m.finished and len(m.token_ids) > len(_resumed(group, slot)):
                    aborts[slot] += 1  # (a member that sampled nothing before the cut was not cut off: no count)
                    self.counts.aborted += 1
                if m is not None and not m.finished and (not m.token_ids or not _resumable(m)):
                    members[slot] = None  # nothing sampled, or a record that cannot continue: start over next time
            self.groups.append(BufferedGroup(list(group.rows), list(group.seeds), list(members), aborts))


    def put_complete(self, index: int, members: list[Trajectory]) -> None:
        """A group that completed beyond the step's batch: buffered whole, taken first next step."""
        group = self.records[index]
        self.groups.append(BufferedGroup(list(group.rows), list(group.seeds), list(members), list(group.aborts)))

    def pinned_open(self, stream) -> bool:
        """A pinned group of this step is still generating (the step may not end yet)."""
        return any(stream.is_open(i) for i in self.counts.pinned_indices)

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_state() for g in self.groups]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = deque(BufferedGroup.from_state(g) for g in state["groups"])

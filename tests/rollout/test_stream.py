"""GroupStream over a fake engine that finishes requests out of order (pure logic: no model)."""

from __future__ import annotations

import pytest

from cohort.rollout.base import SamplingConfig, Trajectory
from cohort.rollout.stream import GroupStream

SAMPLING = SamplingConfig(max_tokens=4)


class ShuffledEngine:
    """Each poll returns the queued requests whose position in `order` comes next, `per_poll` at a time.

    The "completion" of a request is [seed]: a trajectory says which request produced it."""

    def __init__(self, per_poll: int, reverse: bool = True):
        self.queue = []
        self.per_poll = per_poll
        self.reverse = reverse
        self.polls = 0

    def submit(self, requests):
        self.queue.extend(requests)

    def poll(self, timeout=None):
        self.polls += 1
        order = sorted(self.queue, key=lambda r: r.seed, reverse=self.reverse)  # the newest requests finish first
        done, self.queue = order[: self.per_poll], order[self.per_poll:]
        return [Trajectory([r.seed], [0.0], "stop", request_id=r.request_id) for r in done]

    def abort(self, request_ids=None):
        ids = set(request_ids)
        dropped = [r for r in self.queue if r.request_id in ids]
        self.queue = [r for r in self.queue if r.request_id not in ids]
        return [Trajectory([], [], "aborted", request_id=r.request_id) for r in dropped]

    @property
    def in_flight(self):
        return len(self.queue)


def test_groups_arrive_whole_in_slot_order_when_the_engine_finishes_out_of_order():
    engine = ShuffledEngine(per_poll=3)
    stream = GroupStream(engine, "s")
    for g in range(3):  # group g: seeds 10g..10g+2, key "row<g>"
        stream.submit_group([[1, 2]] * 3, SAMPLING, [10 * g + slot for slot in range(3)], key=f"row{g}")
    got = [(group.index, group.key, [t.token_ids[0] for t in group.trajectories]) for group in stream]
    # Reverse seed order, 3 per poll: poll 1 returns 22, 21, 20 (group 2 whole), poll 2 group 1, poll 3 group 0.
    assert got == [(2, "row2", [20, 21, 22]), (1, "row1", [10, 11, 12]), (0, "row0", [0, 1, 2])]
    assert stream.pending == 0 and engine.polls == 3


def test_a_group_split_across_polls_is_yielded_only_when_its_last_member_arrives():
    engine = ShuffledEngine(per_poll=2)
    stream = GroupStream(engine, "s")
    stream.submit_group([[1]] * 3, SAMPLING, [0, 1, 2])
    stream.submit_group([[1]] * 3, SAMPLING, [3, 4, 5])
    seen = []
    for group in stream:
        seen.append((engine.polls, group.index))
    # Polls return {5,4}, {3,2}, {1,0}: group 1 is complete after poll 2, group 0 after poll 3.
    assert seen == [(2, 1), (3, 0)]


def test_groups_submitted_while_iterating_are_yielded_too():
    engine = ShuffledEngine(per_poll=100)
    stream = GroupStream(engine, "s")
    stream.submit_group([[1]] * 2, SAMPLING, [0, 1], key=0)
    order = []
    for group in stream:
        order.append(group.key)
        if group.key < 3:  # each finished group asks for one more: a refill
            stream.submit_group([[1]] * 2, SAMPLING, [10 * (group.key + 1), 10 * (group.key + 1) + 1], key=group.key + 1)
    assert order == [0, 1, 2, 3] and stream.submitted == 4


def test_abort_returns_the_members_still_in_flight_and_forgets_their_groups():
    engine = ShuffledEngine(per_poll=1)
    stream = GroupStream(engine, "s")
    stream.submit_group([[1]] * 2, SAMPLING, [0, 1])
    stream.submit_group([[1]] * 2, SAMPLING, [2, 3])
    iterator = iter(stream)
    first = next(iterator)  # polls 3, then 2: group 1
    assert first.index == 1
    aborted = stream.abort()
    assert sorted(t.request_id for t in aborted) == [f"{stream.prefix}/g0/0", f"{stream.prefix}/g0/1"]
    assert all(t.status == "aborted" for t in aborted) and stream.pending == 0 and engine.in_flight == 0
    assert list(iterator) == []


def test_other_streams_trajectories_are_ignored_and_errors_raise():
    engine = ShuffledEngine(per_poll=100)
    stream = GroupStream(engine, "s")
    stream.submit_group([[1]], SAMPLING, [0])
    engine.queue[0] = engine.queue[0].__class__("other/g0/0", (1,), SAMPLING, 5)  # another caller's request
    with pytest.raises(RuntimeError, match="1 group\\(s\\) of stream 's\\.[0-9]+' unanswered"):
        list(stream)

    class Failing(ShuffledEngine):
        def poll(self, timeout=None):
            return [Trajectory([], [], "error", request_id=r.request_id, error="boom") for r in self.queue]

    stream = GroupStream(Failing(per_poll=1), "t")
    stream.submit_group([[1]], SAMPLING, [0])
    with pytest.raises(RuntimeError, match="failed on request t\\.[0-9]+/g0/0: boom"):
        list(stream)

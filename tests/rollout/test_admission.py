"""The staleness bound's admission (cohort/rollout/scheduler.py, `Scheduler.admit`): k is a bound, not a target. While
the engine keeps up, one generation batch is admitted ahead of the one being collected; batches further ahead (up to
k) only while the engine is behind."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cohort.rollout.base import SamplingConfig
from cohort.rollout.scheduler import Scheduler
from cohort.config.admission import AdmissionRules

G, B = 2, 3  # completions per group, groups per generation batch


class _Sampler:
    def __init__(self):
        self.next_row = 0

    def next_batch(self) -> list[int]:
        rows = [r for r in range(self.next_row, self.next_row + B) for _ in range(G)]  # each prompt G times in a row
        self.next_row += B
        return rows


def _scheduler(k: int) -> tuple[Scheduler, SimpleNamespace]:
    """A scheduler whose submissions are only recorded (no engine): `stream.pending` says how many groups the engine
    is still generating."""
    scheduler = Scheduler(None, _Sampler(), [[1]] * 100, SamplingConfig(max_tokens=4), G, B, AdmissionRules(max_staleness=k),
                          seed=0, generations=100)
    stream = SimpleNamespace(pending=0)
    scheduler.stream = stream

    def record(entries, origins, partial):
        for origin in origins:
            scheduler.origins[len(scheduler.origins) + 1000 * origin.generation_index] = origin

    scheduler._submit = record
    return scheduler, stream


def _take_batch(scheduler: Scheduler) -> None:
    """The collection takes the oldest generation batch's B groups."""
    oldest = min(o.generation_index for o in scheduler.origins.values())
    for index in [i for i, o in scheduler.origins.items() if o.generation_index == oldest]:
        del scheduler.origins[index]


@pytest.mark.parametrize("k", [1, 2, 4])
def test_an_engine_that_keeps_up_gets_one_batch_ahead_whatever_k(k):
    scheduler, _ = _scheduler(k)
    scheduler.admit(version=0)
    # the batch collected now (generation 0) and one ahead (generation 1): 2 batches, not k + 1
    assert scheduler.generation_index == 2 and len(scheduler.origins) == 2 * B
    for version in range(1, 4):  # each update: one batch taken, one admitted (under weights `version`)
        _take_batch(scheduler)
        scheduler.admit(version)
        assert scheduler.generation_index == version + 2
        # waiting: the batch admitted at the previous update and the one admitted now; the first is trained now, one
        # version after the weights it was admitted under: each token 1 version old, not k
        assert {o.version for o in scheduler.origins.values()} == {version - 1, version}


@pytest.mark.parametrize(("k", "batches_waiting"), [(0, 1), (1, 2), (2, 3), (4, 5)])
def test_an_engine_that_is_behind_gets_up_to_k_batches_ahead(k, batches_waiting):
    scheduler, stream = _scheduler(k)
    scheduler.admit(version=0)  # nothing generating yet: min(k, 1) batches ahead
    _take_batch(scheduler)
    stream.pending = 1  # a group admitted earlier is still generating: the engine is the slower side
    scheduler.admit(version=1)
    # admitted and not taken: k + 1 batches (the one collected now and k ahead); k = 0 is synchronous: just the one
    assert len(scheduler.origins) == batches_waiting * B
    stream.pending = 0  # it caught up: nothing more until the waiting batches are taken down to one ahead
    before = scheduler.generation_index
    scheduler.admit(version=2)
    assert scheduler.generation_index == before

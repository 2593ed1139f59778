"""cohort/rollout/base.py's `EpisodeRecord` and the generic reads of cohort/rollout/collect.py: what the rollout layer
knows of a multi-turn record, with records of its own (no connector imported)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cohort.rollout.base import EpisodeRecord, Trajectory, record_from_state
from cohort.rollout.collect import episode_arguments, episode_metrics, failed_episodes, shown_prompts


@dataclass
class Played(EpisodeRecord):  # (no kind: never saved)
    score: float = 0.0

    def reward_arguments(self, prompt):
        return {"scores": self.score}

    @classmethod
    def batch_metrics(cls, records):
        return {"played/score_mean": sum(r.score for r in records) / len(records)}


@dataclass
class Skipped(EpisodeRecord):
    @property
    def failed(self):
        return True

    @classmethod
    def batch_metrics(cls, records):
        return {"skipped/count": float(len(records))}


def test_the_defaults_say_nothing_and_each_kind_reads_its_own_records():
    outs = [Trajectory([1], [-.1], "stop", episode=Played(1.0)), Trajectory([2], [-.2], "stop", episode=Skipped()),
            Trajectory([3], [-.3], "stop", episode=Played(0.5)), Trajectory([4], [-.4], "stop")]
    assert shown_prompts(outs, ["a", "b", "c", "d"]) == ["a", "b", "c", "d"]  # no observation: the row's prompt
    assert failed_episodes(outs) == [False, True, False, False]
    assert episode_arguments(outs, ["a", "b", "c", "d"]) == {"scores": [1.0, None, 0.5, None]}
    # Played's metrics over its two records ((1.0 + 0.5) / 2), Skipped's over its one
    assert episode_metrics(outs) == {"played/score_mean": 0.75, "skipped/count": 1.0}
    assert episode_metrics(outs[3:]) == {}


def test_a_saved_record_of_an_unknown_kind_is_refused_with_the_known_kinds():
    with pytest.raises(ValueError, match=r"of kind 'nope', which no imported module defines \(known: \[.*\]\)"):
        record_from_state({"kind": "nope"})
    with pytest.raises(ValueError, match="has no kind"):
        Trajectory([1], [-.1], "stop", episode=Played()).to_state()


def test_a_kind_is_registered_once():
    with pytest.raises(ValueError, match="kind 'twice' is registered twice"):
        for _ in range(2):
            type("Twice", (EpisodeRecord,), {}, kind="twice")
    EpisodeRecord.kinds.pop("twice")

"""Failed episodes reach the user (cohort/trainer/episode_failures.py, issue 60 defect 1): a batch's failed episodes
counted over its runs with their messages, each step's line, and the stop once every episode failed for
run.max_failed_steps steps in a row. Hand-built records, no engine; the run that stops is
tests/tools/test_trl_contract.py's slow test."""

from __future__ import annotations

import json

import pytest

from cohort.agents.runs import AgentRun
from cohort.rollout.base import Trajectory
from cohort.runs.loggers import JsonlWriter
from cohort.runs.report import _warning
from cohort.tools.episode import Episode
from cohort.trainer.episode_failures import EpisodeFailures, EpisodesFailed, FailureWatch
from cohort.trainer.run import _report_failures

REFUSED = ("the agent raised EpisodeFailed: ModelError: 400 (the endpoint refused a call of this run: tools: the "
           "model's chat template has no tools block, ...; set agent.render_tools: false)")


def trajectory(episode=None) -> Trajectory:
    return Trajectory([1, 2], [-0.1, -0.1], "stop", 0, prompt_ids=[7], episode=episode)


def failures(*episodes) -> EpisodeFailures:
    return EpisodeFailures.of([trajectory(e) for e in episodes])


def test_a_batch_s_failed_episodes_are_its_failed_records_with_their_messages():
    batch = failures(None, Episode(failure="reset raised ValueError: no board"), Episode(),
                     AgentRun(error=REFUSED, status="error", episode_only=True),
                     AgentRun(error="the agent raised KeyError: 'answer'", status="error"))  # (not episode_only: the
    # agent reward fails the run on it, cohort/agents/reward.py; not an episode failure)
    assert (batch.total, batch.count, batch.all_failed) == (5, 2, False)
    assert batch.messages == ("reset raised ValueError: no board", REFUSED)
    every = failures(Episode(failure="down"), Episode(failure="down"), Episode(failure="other"))
    assert every.all_failed and every.distinct() == {"down": 2, "other": 1}
    assert not failures().all_failed  # (an empty batch: nothing failed)


def test_each_failing_step_is_said_and_every_episode_failing_three_steps_in_a_row_stops_the_run():
    watch, all_down, some_down = FailureWatch(3), failures(Episode(failure="down"), Episode(failure="down")), \
        failures(Episode(failure="down"), Episode())
    first = watch.observe(1, all_down)
    assert first.text == ("warning at step 1 [failed_episodes]: 2 of 2 episodes failed (scored by nothing, trained on "
                          "nothing): down [the run stops when every episode fails for 3 steps in a row: "
                          "run.max_failed_steps; 1 so far]")
    assert first.record()["failures"] == {"down": 2} and first.record()["value"] == 2.0
    # a step where some episode played breaks the streak; a repeated message points at the step that showed it
    assert watch.observe(2, some_down).message == ("1 of 2 episodes failed (scored by nothing, trained on nothing): the "
                                                   "same as at step 1")
    assert watch.observe(3, failures(Episode(), Episode())) is None and watch.streak == 0
    for step in (4, 5):
        watch.observe(step, all_down)
    assert watch.stop is None and watch.streak == 2
    last = watch.observe(6, all_down)  # the third in a row (steps 4-6): the run stops, this step's line still said
    assert last is not None and "[the run stops" not in last.message
    assert str(watch.stop) == ("every episode failed at steps 4 to 6 (2 of 2 at step 6), so the run trained on "
                               "nothing: down. Fix that cause, or set run.max_failed_steps=0 to train on regardless")


def test_max_failed_steps_0_never_stops_and_1_stops_at_the_first():
    never = FailureWatch(0)
    for step in range(1, 11):
        assert never.observe(step, failures(Episode(failure="down"))).message.endswith("down" if step == 1 else "step 1")
    assert never.stop is None
    at_once = FailureWatch(1)
    at_once.observe(1, failures(Episode(failure="a"), Episode(failure="b")))
    assert str(at_once.stop).startswith("every episode failed at step 1 (2 of 2 at step 1), so the run trained on "
                                        "nothing: a (1 other message(s) in RUN_DIR/warnings.jsonl).")


class Console:
    def __init__(self):
        self.lines = []

    def print(self, text):
        self.lines.append(text)


def test_the_loop_prints_and_records_each_step_and_raises_at_the_limit(tmp_path):
    # at 74eaa87 a run whose 8 of 8 episodes failed at every step printed nothing and exited 0
    console, sink, watch = Console(), JsonlWriter(tmp_path / "warnings.jsonl"), FailureWatch(2)
    refused = failures(*[AgentRun(error=REFUSED, status="error", episode_only=True)] * 8)
    _report_failures(None, watch, 1, console, sink)  # (a step on a batch generated earlier: nothing to say)
    _report_failures(refused, watch, 1, console, sink)
    with pytest.raises(EpisodesFailed, match="every episode failed at steps 1 to 2 \\(8 of 8 at step 2\\)"):
        _report_failures(refused, watch, 2, console, sink)
    sink.close()
    assert console.lines[0].startswith(f"warning at step 1 [failed_episodes]: 8 of 8 episodes failed (scored by "
                                       f"nothing, trained on nothing): {REFUSED} [the run stops")
    records = [json.loads(line) for line in (tmp_path / "warnings.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"], r["failures"]) for r in records] == [(1, "failed_episodes", {REFUSED: 8}),
                                                                        (2, "failed_episodes", {REFUSED: 8})]
    assert "<li>8 × " in _warning(records[1]) and "set agent.render_tools: false" in _warning(records[1])

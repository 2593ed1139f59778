"""cohort/tools/episode.py: the tool loop's `Episode` as the generic layers read it (`EpisodeRecord`): its reward
arguments, completions.jsonl fields, failure and saved state (hand-built records, no engine)."""

from __future__ import annotations

from collections import Counter

from cohort.rollout.base import Trajectory, record_from_state
from cohort.rollout.collect import episode_arguments, failed_episodes, shown_prompts
from cohort.tools.episode import Episode


def test_a_state_saved_before_records_named_their_kind_restores_as_an_episode():
    # What 4f35103's rollout/partial.py saved for a buffered tool-loop member: the Episode's fields, no "kind".
    old = {"conversation": [{"role": "assistant", "content": "hi"}], "environment": None, "status": "truncated",
           "turns": 1, "calls": {"mul": 2}, "failed_calls": 0, "timeouts": 0, "parse_errors": 1, "argument_errors": 0,
           "segments": [[0, 3, "assistant"]], "observation": "board", "failure": None}
    episode = record_from_state(old)
    assert episode == Episode(conversation=[{"role": "assistant", "content": "hi"}], status="truncated", turns=1,
                              calls=Counter({"mul": 2}), parse_errors=1, segments=[(0, 3, "assistant")],
                              observation="board")
    saved = Trajectory([1, 2, 3], [-.1, -.2, -.3], "aborted", episode=episode).to_state()["episode"]
    # the same fields, now with the kind, and the call forms counted since (none in a record saved before them)
    assert saved == {"kind": "tool_loop", **old, "call_forms": {}, "ignored_calls": 0}


def test_the_rollout_reads_an_episode_through_the_record_interface():
    # Two trajectories of one tool-loop batch (environment instance on the first) and a one-turn one: the shown prompt
    # gets the observation appended (TRL: no separator), the failed episode is unscored, and each argument is one list
    # over the three trajectories (None where a trajectory's record gives none).
    env = object()
    played = Episode(conversation=[{"role": "assistant", "content": "move"}], environment=env, observation=" [board]")
    failed = Episode(failure="reset raised")
    outs = [Trajectory([1], [-.1], "stop", episode=played), Trajectory([2], [-.2], "stop", episode=failed),
            Trajectory([3], [-.3], "stop")]
    prompts = shown_prompts(outs, [[{"role": "user", "content": "play"}], "text prompt", "plain"])
    assert prompts == [[{"role": "user", "content": "play [board]"}], "text prompt", "plain"]
    assert failed_episodes(outs) == [False, True, False]
    assert episode_arguments(outs, prompts) == {
        "conversations": [[{"role": "user", "content": "play [board]"}, {"role": "assistant", "content": "move"}],
                          [{"role": "user", "content": "text prompt"}], None],
        "environments": [env, None, None]}
    assert episode_arguments(outs[2:], prompts[2:]) == {}  # no record: no multi-turn argument at all
    assert played.completion_fields() == {"conversation": [{"role": "assistant", "content": "move"}],
                                          "tool_status": "ok", "turns": 0, "observation": " [board]"}
    assert failed.completion_fields()["failure"] == "reset raised"

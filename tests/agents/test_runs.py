"""cohort/agents/runs.py: an agent run's calls -> the trajectory the trainer consumes (hand-built calls, no engine)."""

from __future__ import annotations

from dataclasses import dataclass

from cohort.agents.runs import is_chain, run_trajectory
from cohort.rollout.base import Trajectory

STOP = 9


@dataclass
class Call:  # the two fields of cohort.agents.chat.SampledCall that runs.py reads
    prompt_ids: list[int]
    trajectory: Trajectory


def sampled(ids, logprobs, version):
    return Trajectory(list(ids), list(logprobs), "stop" if ids and ids[-1] == STOP else "length", version)


def test_a_chain_is_one_trajectory_with_the_added_tokens_masked():
    # call 1: prompt [1, 2] -> sampled [5, 6, STOP] (log-probs -.1 -.2 -.3, version 3)
    # call 2: prompt [1, 2, 5, 6, STOP] + tool turn [7, 8] -> sampled [4, STOP] (-.4 -.5, version 4)
    calls = [Call([1, 2], sampled([5, 6, STOP], [-.1, -.2, -.3], 3)),
             Call([1, 2, 5, 6, STOP, 7, 8], sampled([4, STOP], [-.4, -.5], 4))]
    assert is_chain(calls)
    t, samples = run_trajectory(calls, "r0", [1, 2], 0)
    assert samples == []
    assert t.prompt_ids == [1, 2]  # the first call's prompt
    assert t.token_ids == [5, 6, STOP, 7, 8, 4, STOP]  # sampled, then the tool turn, then sampled
    assert t.loss_mask == [1, 1, 1, 0, 0, 1, 1]  # the tool turn is not the model's
    assert t.logprobs == [-.1, -.2, -.3, 0.0, 0.0, -.4, -.5]  # log-prob 0 on the tool turn
    assert t.versions == [3, 3, 3, 4, 4, 4, 4]  # the tool turn carries the version of the call that follows it
    assert (t.status, t.policy_version, t.request_id) == ("stop", 3, "r0")


def test_a_rewritten_history_is_one_sample_per_call():
    # call 2's prompt drops call 1's answer (the agent summarised its history): [1, 2, 3] does not start with
    # [1, 2, 5, 6, STOP], so each call is its own sample; the run's trajectory is the last call
    calls = [Call([1, 2], sampled([5, 6, STOP], [-.1, -.2, -.3], 3)),
             Call([1, 2, 3], sampled([4, STOP], [-.4, -.5], 3))]
    assert not is_chain(calls)
    t, samples = run_trajectory(calls, "r0", [1, 2], 0)
    assert (t.prompt_ids, t.token_ids, t.loss_mask, t.request_id) == ([1, 2, 3], [4, STOP], [1, 1], "r0")
    assert len(samples) == 1
    s = samples[0]
    assert (s.prompt_ids, s.token_ids, s.logprobs, s.loss_mask, s.request_id) == (
        [1, 2], [5, 6, STOP], [-.1, -.2, -.3], [1, 1, 1], "r0/call0")


def test_a_spent_budget_ends_the_run_length_without_the_last_prompt():
    # the second call found the budget spent: AgentEngine answered it with nothing sampled ("length"); the
    # trajectory is call 1 alone (the tool turn [7, 8] is not appended, as in the tool loop), status "length"
    calls = [Call([1, 2], sampled([5, 6, STOP], [-.1, -.2, -.3], 0)),
             Call([1, 2, 5, 6, STOP, 7, 8], Trajectory([], [], "length", 0))]
    t, samples = run_trajectory(calls, "r0", [1, 2], 0)
    assert (t.token_ids, t.loss_mask, t.status, samples) == ([5, 6, STOP], [1, 1, 1], "length", [])


def test_no_call_is_an_empty_completion_of_the_request_prompt():
    t, samples = run_trajectory([], "r0", [1, 2], 5)
    assert (t.prompt_ids, t.token_ids, t.status, t.policy_version, samples) == ([1, 2], [], "stop", 5, [])


def test_an_agent_run_with_samples_and_seats_round_trips_through_a_checkpoint(tmp_path):
    # An AgentRun is an EpisodeRecord of kind "agent_run": a trajectory carrying one is saved as plain data (its earlier
    # calls and its seats' trajectories, each with its own record, saved the same way) and read back equal.
    import torch

    from cohort.agents.runs import AgentRun

    first_call = Trajectory([3, STOP], [-.1, -.2], "stop", 1, prompt_ids=[1], request_id="r/call0")
    seat = Trajectory([4, STOP], [-.3, -.4], "stop", 1, prompt_ids=[2], request_id="r/p0",
                      episode=AgentRun(outcome={"reward": 1.0}, turns=1, seat="player0"))
    run = AgentRun(outcome={"reward": 0.5, "payoff": 2.0}, status="ok", turns=2,
                   conversation=[{"role": "assistant", "content": "6"}], samples=[first_call], seats=[seat])
    t = Trajectory([5, STOP], [-.5, -.6], "stop", 1, prompt_ids=[1, 3, STOP], request_id="r", episode=run)
    torch.save(t.to_state(), tmp_path / "t.pt")
    state = torch.load(tmp_path / "t.pt", weights_only=True)
    assert state["episode"]["kind"] == "agent_run"
    back = Trajectory.from_state(state)
    assert back == t and isinstance(back.episode, AgentRun) and isinstance(back.episode.seats[0].episode, AgentRun)


def test_calls_the_endpoint_did_not_read_are_counted_as_ignored():
    # Qwen2.5-Coder-0.5B through the endpoint under tools.parser hermes: its fenced call came back as plain content (no
    # tool_calls), so the agent took it for the answer: 1 ignored call. A call the endpoint read (tool_calls) and a
    # prose answer count nothing.
    from cohort.agents.runs import AgentRun

    fenced = '```json\n{"name": "lookup", "arguments": {"country": "France"}}\n```'
    ignored = AgentRun(conversation=[{"role": "user", "content": "capital of France?"},
                                     {"role": "assistant", "content": fenced}])
    read = AgentRun(conversation=[{"role": "assistant", "content": None, "tool_calls": [
        {"type": "function", "function": {"name": "lookup", "arguments": '{"country": "France"}'}}]},
        {"role": "tool", "content": "Paris"}, {"role": "assistant", "content": "Paris."}])
    assert (ignored.ignored_calls, read.ignored_calls) == (1, 0)
    assert AgentRun.batch_metrics([ignored, read])["agent/ignored_calls"] == 1.0

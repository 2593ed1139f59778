"""The tool loop over a scripted request-level engine (pure logic: the engine only replays fixed token lists), with
the real tiny chat tokenizer and its Qwen2.5-style template: ids, masks, engine log-probs and lengths agree token for
token across three turns; timeouts, malformed calls, budgets and statuses."""

from __future__ import annotations

import asyncio
import time

import pytest

from cohort.models.pretrained import load_tokenizer
from cohort.rollout.base import Request, SamplingConfig, Trajectory, generate_requests
from cohort.tools.episode import Episode
from cohort.tools.loop import ToolEngine
from cohort.rollout.collect import episode_metrics
from cohort.tools.parsers import parse_hermes
from cohort.tools.tool_schemas import resolve_tools


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


async def add(a: int, b: int) -> int:
    """Add two integers (an async tool).

    Args:
        a: the first term
        b: the second term
    """
    await asyncio.sleep(0)
    return a + b


def slow(x: int) -> int:
    """Sleep, then return x.

    Args:
        x: the value
    """
    time.sleep(2.0)
    return x


def broken(x: int) -> int:
    """Always raises.

    Args:
        x: ignored
    """
    raise RuntimeError("tool crashed")


class Scripted:
    """A request-level engine that replays, per request id, one token list per turn; log-prob of the k-th token it
    ever samples is -(k+1)/100 (distinct, so misalignment shows). It asserts that a resumed request conditions on
    exactly prompt + the resumed tokens, and honours `Request.remaining` (the shared budget)."""

    def __init__(self, turns: dict[str, list[list[int]]], stop: int):
        self.turns, self.stop_token_ids, self.policy_version = turns, [stop], 3
        self.queue: list[Request] = []
        self.sampled = 0
        self.seen_prompts: dict[str, list[list[int]]] = {}

    def submit(self, requests):
        self.queue += list(requests)

    def poll(self, timeout=None):
        out, requests, self.queue = [], list(self.queue), []
        for r in requests:
            self.seen_prompts.setdefault(r.request_id, []).append(r.engine_prompt)
            turn = self.turns[r.request_id].pop(0)[: r.remaining.max_tokens]
            logps = [-(self.sampled + k + 1) / 100 for k in range(len(turn))]
            self.sampled += len(turn)
            status = "stop" if turn and turn[-1] == self.stop_token_ids[0] else "length"
            out.append(r.complete(Trajectory(turn, logps, status, self.policy_version)))
        return out

    def abort(self, ids=None):
        dropped = [r for r in self.queue if ids is None or r.request_id in set(ids)]
        self.queue = [r for r in self.queue if r not in dropped]
        return [r.complete(Trajectory([], [], "aborted", self.policy_version)) for r in dropped]

    @property
    def in_flight(self):
        return len(self.queue)

    def close(self):
        pass


@pytest.fixture(scope="module")
def tok(tiny_chat_model_dir):
    return load_tokenizer(tiny_chat_model_dir)


def _call(tok, name, args_json):
    return tok(f'<tool_call>\n{{"name": "{name}", "arguments": {args_json}}}\n</tool_call>', add_special_tokens=False)["input_ids"]


def _engine(tok, turns, max_tokens=400, **kwargs):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    inner = Scripted(turns, stop)
    options = dict(parser=parse_hermes, tools=resolve_tools([multiply, add, slow, broken]), max_turns=4,
                   tool_timeout_s=0.5) | kwargs
    return ToolEngine(inner, tok, **options), inner, stop


def _run(engine, rid="r/0", max_tokens=400, prompt=(1, 2, 3)):
    return generate_requests(engine, [Request(rid, tuple(prompt), SamplingConfig(max_tokens))])[0]


def test_three_turns_ids_masks_logprobs_and_lengths_agree_token_for_token(tok):
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    turn1 = _call(tok, "multiply", '{"a": 3, "b": 4}') + [stop]
    turn2 = _call(tok, "add", '{"a": 12, "b": 5}') + [stop]
    turn3 = enc("17") + [stop]
    engine, inner, _ = _engine(tok, {"r/0": [list(turn1), list(turn2), list(turn3)]})
    t = _run(engine)
    # the template renders a tool turn as "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n",
    # the next assistant header "<|im_start|>assistant\n", and the "\n" it writes after the assistant's <|im_end|>,
    # which the model never sampled (verl #6501), comes first
    tool1 = enc("\n<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    tool2 = enc("\n<|im_start|>user\n<tool_response>\n17\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert t.token_ids == turn1 + tool1 + turn2 + tool2 + turn3
    assert t.loss_mask == [1] * len(turn1) + [0] * len(tool1) + [1] * len(turn2) + [0] * len(tool2) + [1] * len(turn3)
    # engine log-probs: the k-th sampled token got -(k+1)/100, tool tokens 0
    n1, n2, n3 = len(turn1), len(turn2), len(turn3)
    expected = ([-(k + 1) / 100 for k in range(n1)] + [0.0] * len(tool1) + [-(n1 + k + 1) / 100 for k in range(n2)]
                + [0.0] * len(tool2) + [-(n1 + n2 + k + 1) / 100 for k in range(n3)])
    assert t.logprobs == expected
    assert len(t.token_ids) == len(t.logprobs) == len(t.loss_mask) == len(t.versions)
    assert t.status == "stop" and t.versions == [3] * len(t.token_ids)
    # the engine continued from token ids: each resume conditioned on prompt + every token so far, as sampled
    assert inner.seen_prompts["r/0"] == [[1, 2, 3], [1, 2, 3] + turn1 + tool1, [1, 2, 3] + turn1 + tool1 + turn2 + tool2]
    episode = t.episode
    assert isinstance(episode, Episode) and episode.status == "ok" and episode.turns == 3
    assert dict(episode.calls) == {"multiply": 1, "add": 1}
    assert [m["role"] for m in episode.conversation] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert episode.conversation[-1]["content"] == "17"
    assert episode.segments[1] == (n1, n1 + len(tool1), "tool")


def test_malformed_call_and_missing_argument_are_fed_back_not_raised(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    bad_json = tok('<tool_call>\n{"name": "multiply", "arguments": {"a": 3,}}\n</tool_call>', add_special_tokens=False)["input_ids"]
    missing = _call(tok, "multiply", '{"a": 3}')
    engine, _, _ = _engine(tok, {"r/0": [bad_json + [stop], missing + [stop], [stop]]})
    t = _run(engine)
    e = t.episode
    assert e.parse_errors == 1 and e.argument_errors == 1 and e.status == "ok" and e.turns == 3
    assert e.conversation[1]["content"].startswith("error: the tool call is not valid JSON")
    assert "missing a required argument: 'b'" in e.conversation[3]["content"]
    assert sum(e.calls.values()) == 0  # neither ran a tool


def test_timeout_error_and_failure_policy_mask(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    turns = {"r/0": [_call(tok, "slow", '{"x": 1}') + [stop], [stop]],
             "r/1": [_call(tok, "broken", '{"x": 1}') + [stop], [stop]]}
    engine, _, _ = _engine(tok, turns, failure_policy="mask")
    start = time.monotonic()
    out = generate_requests(engine, [Request(r, (1,), SamplingConfig(400)) for r in ("r/0", "r/1")])
    assert time.monotonic() - start < 1.5  # the 2 s tool was abandoned at tool_timeout_s = 0.5
    slow_t, broken_t = out
    assert slow_t.episode.status == "tool_timeout" and "timed out after 0.5 s" in slow_t.episode.conversation[1]["content"]
    assert broken_t.episode.status == "error" and "RuntimeError: tool crashed" in broken_t.episode.conversation[1]["content"]
    assert set(slow_t.loss_mask) == {0} and set(broken_t.loss_mask) == {0}  # policy "mask": nothing trained
    metrics = episode_metrics(out)
    # 2 calls run (slow, broken), both failed; one timeout
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failure_frequency"] == 1.0
    assert metrics["tools/timeouts"] == 1.0 and metrics["tools/status/error"] == 0.5


def test_budgets_max_turns_tokens_and_response_truncation(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    call = _call(tok, "multiply", '{"a": 3, "b": 4}') + [stop]
    # max_turns=2: the second turn's call is not run
    engine, _, _ = _engine(tok, {"r/0": [list(call), list(call), [stop]]}, max_turns=2)
    t = _run(engine)
    assert t.episode.turns == 2 and t.episode.status == "truncated" and dict(t.episode.calls) == {"multiply": 1}
    # token budget: after turn 1 (len(call)) the tool turn does not leave room for another token -> ends "length"
    engine, _, _ = _engine(tok, {"r/0": [list(call), [stop]]})
    t = _run(engine, max_tokens=len(call) + 5)
    assert t.status == "length" and t.episode.status == "truncated" and t.token_ids == call
    # the call ran (3 * 4 = 12) though its turn did not fit: its result is recorded, not appended as tokens
    assert [m["content"] for m in t.episode.conversation if m["role"] == "tool"] == ["12"]
    # max_tool_response_length=1: 12 * 34 = "408" is 3 digit tokens (the split regex isolates digits); side "left" keeps the end, "8"
    engine, _, _ = _engine(tok, {"r/0": [_call(tok, "multiply", '{"a": 12, "b": 34}') + [stop], [stop]]},
                           max_tool_response_length=1, truncate_side="left")
    t = _run(engine)
    assert t.episode.conversation[1]["content"] == "8" and t.episode.status == "truncated"


def test_abort_between_turns_returns_the_trajectory_so_far(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    call = _call(tok, "slow", '{"x": 1}') + [stop]
    engine, _, _ = _engine(tok, {"r/0": [list(call), [stop]]}, tool_timeout_s=5.0)
    engine.submit([Request("r/0", (1,), SamplingConfig(400))])
    assert engine.poll(timeout=0.2) == []  # the tool is running
    (t,) = engine.abort()
    assert t.status == "aborted" and t.token_ids == call and engine.in_flight == 0


class Tally:
    """One instance per trajectory: reset(**row) starts the tally at the row's `start`."""

    instances: list = []

    def __init__(self):
        self.closed = False
        Tally.instances.append(self)

    def reset(self, start: int, **row):
        self.value = start
        return f"tally at {start}"

    def add_to(self, x: int) -> int:
        """Add to the tally.

        Args:
            x: how much
        """
        self.value += x
        return self.value

    def close(self):
        self.closed = True


def test_environment_instance_per_trajectory_reset_with_the_row_and_closed(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    call = _call(tok, "add_to", '{"x": 2}') + [stop]
    Tally.instances = []
    engine, _, _ = _engine(tok, {"r/0": [list(call), list(call), [stop]], "r/1": [[stop]]}, tools=[], environment=Tally,
                           rows=lambda request: {"start": 5 if request.request_id == "r/0" else 9, "answer": "x"})
    out = generate_requests(engine, [Request(r, (1,), SamplingConfig(400)) for r in ("r/0", "r/1")])
    first, second = out
    assert first.episode.environment is not second.episode.environment and len(Tally.instances) == 2
    assert first.episode.observation == "tally at 5" and first.episode.conversation[0]["role"] == "assistant"
    assert [m["content"] for m in first.episode.conversation if m["role"] == "tool"] == ["7", "9"]  # 5+2, then +2
    assert first.episode.environment.value == 9 and second.episode.environment.value == 9  # untouched: started at 9
    assert all(env.closed for env in Tally.instances)


@pytest.mark.slow
def test_abort_between_turns_then_resume_equals_the_uninterrupted_trajectory(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    script = lambda: {"r/0": [_call(tok, "slow", '{"x": 4}') + [stop], enc("4") + [stop]]}  # noqa: E731
    whole, _, _ = _engine(tok, script(), tool_timeout_s=5.0)
    expected = _run(whole)
    engine, inner, _ = _engine(tok, script(), tool_timeout_s=5.0)
    engine.submit([Request("r/0", (1, 2, 3), SamplingConfig(400))])
    assert engine.poll(timeout=0.2) == []  # turn 1 is back, its `slow` call is running
    (aborted,) = engine.abort()
    assert aborted.status == "aborted" and aborted.episode.turns == 1
    inner.sampled = 0  # (the scripted log-probs restart, as in the uninterrupted run)
    resumed = generate_requests(engine, [Request("r/0", (1, 2, 3), SamplingConfig(400), resume=aborted)])[0]
    assert resumed.token_ids == expected.token_ids and resumed.loss_mask == expected.loss_mask
    assert resumed.episode.turns == 2 and dict(resumed.episode.calls) == {"slow": 1}
    assert [m["role"] for m in resumed.episode.conversation] == ["assistant", "tool", "assistant"]


def test_max_parallel_calls_and_a_crashing_user_parser(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    three = _call(tok, "multiply", '{"a": 2, "b": 3}') * 3 + [stop]
    engine, _, _ = _engine(tok, {"r/0": [three, [stop]]}, max_parallel_calls=2)
    t = _run(engine)
    contents = [m["content"] for m in t.episode.conversation if m["role"] == "tool"]
    assert contents == ["6", "6", "error: at most 2 tool calls per turn; this one was not run"]
    assert dict(t.episode.calls) == {"multiply": 2} and t.episode.status == "ok"

    def crashing(text):
        raise KeyError("boom")

    # a parser that raises reads every turn as a failed call: fed back, counted, ended by max_turns
    engine, _, _ = _engine(tok, {"r/0": [_call(tok, "multiply", "{}") + [stop], [stop]]}, parser=crashing, max_turns=2)
    t = _run(engine)
    assert t.episode.parse_errors == 1 and "the tool-call parser failed: KeyError" in t.episode.conversation[1]["content"]
    assert t.episode.turns == 2 and t.episode.status == "truncated"


def _text_turn(tok, text, stop):
    return tok(text, add_special_tokens=False)["input_ids"] + [stop]


@pytest.mark.parametrize("parser, ran, ignored", [("hermes", 0, 1), ("json", 1, 0)])
def test_an_untagged_call_is_counted_by_its_form_run_by_json_and_ignored_by_hermes(tok, parser, ran, ignored):
    from cohort.tools.parsers import get_parser

    stop = tok.convert_tokens_to_ids("<|im_end|>")
    fenced = '```json\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n```'
    turns = {"r/0": [_text_turn(tok, fenced, stop), _text_turn(tok, "12", stop)]}
    engine, _, _ = _engine(tok, turns, parser=get_parser(parser))
    t = _run(engine)
    episode = t.episode
    assert episode.call_forms == {"fenced": 1} and episode.ignored_calls == ignored
    assert sum(episode.calls.values()) == ran and episode.turns == 1 + ran
    if ran:  # the tool's answer (3 * 4) came back as a tool turn, then the final answer
        assert [m["role"] for m in episode.conversation] == ["assistant", "tool", "assistant"]
        assert episode.conversation[1]["content"] == "12"


def test_the_rewards_read_the_final_answer_never_a_tools_output(tok):
    # Qwen2.5-Coder-0.5B's round trip: it calls, gets 12, then calls again with the result as the expression and never
    # answers (max_turns 2: the second call is not run). The decoded text holds "12" twice (the tool's and its own
    # call's), so a reward reading the whole text would count it right; the completion the rewards get is TRL's
    # messages, whose last assistant message is a call with no text outside it: numeric_match reads no answer (0.0).
    # The same call followed by a real answer ("The product is 12.") scores 1.0.
    from cohort.rewards.numeric import numeric_match
    from cohort.rollout.collect import as_completion
    from cohort.tools.parsers import get_parser

    stop = tok.convert_tokens_to_ids("<|im_end|>")
    call = '{"name": "multiply", "arguments": {"a": 3, "b": 4}}'
    again = '```json\n{"name": "multiply", "arguments": {"a": 12, "b": 1}}\n```'
    prompt = [{"role": "user", "content": "3*4="}]
    score = numeric_match()
    for last, expected in ((again, 0.0), ("The product is 12.", 1.0)):
        turns = {"r/0": [_text_turn(tok, call, stop), _text_turn(tok, last, stop)]}
        engine, _, _ = _engine(tok, turns, parser=get_parser("json"), max_turns=2)
        t = _run(engine)
        completion = as_completion(prompt, tok.decode(t.token_ids), t.episode)
        assert [m["role"] for m in completion] == ["assistant", "tool", "assistant"]
        assert completion[0] == {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}]}
        assert completion[1]["content"] == "12"
        assert score(completions=[completion], answer=["12"]) == [expected]

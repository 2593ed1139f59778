"""The OpenAI-compatible chat endpoint's logic (cohort/agents/chat.py) over a scripted sampler and the real tiny chat
tokenizer and template (byte-level BPE, Qwen2.5-style tool calls): the response's shape, tool-call parsing, token in
token out across turns (equal to the in-process tool loop's tokens, never re-tokenized), stop strings, bad requests."""

from __future__ import annotations

import json

import pytest

from cohort.agents.chat import ChatCompletions, ChatRequestError, Conversation, SamplingFailed
from cohort.agents.chat_request import canonical_messages
from cohort.models.pretrained import load_tokenizer
from cohort.rollout.base import Trajectory
from cohort.tools.render import ToolRenderer

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call>'
CALCULATOR_SCHEMA = {"type": "function", "function": {"name": "calculator", "description": "Evaluate an expression.",
                                                      "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                                     "required": ["expression"]}}}


@pytest.fixture(scope="module")
def tok(tiny_chat_model_dir):
    return load_tokenizer(tiny_chat_model_dir)


@pytest.fixture(scope="module")
def ids(tok):
    class Ids:
        im_end = tok.convert_tokens_to_ids("<|im_end|>")
        pad = tok.convert_tokens_to_ids("<|endoftext|>")

        @staticmethod
        def enc(text: str) -> list[int]:
            return list(tok(text, add_special_tokens=False)["input_ids"])

    return Ids


class Script:
    """A blocking sampler that hands out fixed token lists, one per request, in order; log-prob of the k-th token it
    ever returns is -(k+1)/100. Records every request it was given."""

    def __init__(self, *turns: list[int], status: str | None = None):
        self.turns, self.status, self.requests, self.returned = list(turns), status, [], 0

    def __call__(self, requests):
        out = []
        for r in requests:
            self.requests.append(r)
            token_ids = self.turns.pop(0)[: r.sampling.max_tokens]
            logprobs = [-(self.returned + k + 1) / 100 for k in range(len(token_ids))]
            self.returned += len(token_ids)
            status = self.status or ("stop" if len(token_ids) < r.sampling.max_tokens else "length")
            out.append(Trajectory(token_ids, logprobs, status, 2, prompt_ids=list(r.prompt_ids), request_id=r.request_id))
        return out


def _chat(tok, ids, script, max_model_len: int = 256) -> ChatCompletions:
    return ChatCompletions(tok, [ids.im_end, ids.pad], script, model_name="tiny:tool_calc", max_model_len=max_model_len)


USER = [{"role": "user", "content": "12*34="}]


def test_a_tool_call_comes_back_in_openais_shape_with_usage_and_logprobs(tok, ids):
    turn = ids.enc(CALL) + [ids.im_end]
    script = Script(turn)
    # (the template's tools block is ~400 tokens with this arithmetic-trained BPE: a longer context than the default)
    response, calls = _chat(tok, ids, script, max_model_len=1024).create({"model": "x", "messages": USER, "tools": [CALCULATOR_SCHEMA], "logprobs": True,
                                                      "temperature": 0.5, "max_tokens": 40, "seed": 9})
    prompt = ids.enc(tok.apply_chat_template(USER, tools=[CALCULATOR_SCHEMA], tokenize=False, add_generation_prompt=True))
    assert script.requests[0].prompt_ids == tuple(prompt) and calls[0].prompt_ids == prompt  # tools block rendered by the template
    r = script.requests[0]
    assert (r.sampling.max_tokens, r.sampling.temperature, r.seed) == (40, 0.5, 9)
    assert response["object"] == "chat.completion" and response["id"].startswith("chatcmpl-") and response["model"] == "tiny:tool_calc"
    (choice,) = response["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["index"] == 0
    message = choice["message"]
    assert message["role"] == "assistant" and message["content"] is None
    (call,) = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "calculator" and json.loads(call["function"]["arguments"]) == {"expression": "12*34"}
    # usage: the prompt's ids; the completion's sampled ids, stop token included
    assert response["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": len(turn), "total_tokens": len(prompt) + len(turn)}
    # one log-prob entry per content token (the stop token left out), the sampler's -(k+1)/100
    content = choice["logprobs"]["content"]
    assert [c["logprob"] for c in content] == [-(k + 1) / 100 for k in range(len(turn) - 1)]
    assert "".join(c["token"] for c in content) == CALL and content[0]["top_logprobs"] == []
    assert bytes(sum((c["bytes"] for c in content), [])).decode() == CALL
    assert calls[0].trajectory.token_ids == turn and calls[0].extends is None


def test_text_around_a_call_is_the_content_and_a_plain_answer_stops(tok, ids):
    script = Script(ids.enc("Let me check.\n" + CALL) + [ids.im_end], ids.enc("408") + [ids.pad])
    chat = _chat(tok, ids, script)
    first, _ = chat.create({"messages": USER})
    assert first["choices"][0]["message"]["content"] == "Let me check." and first["choices"][0]["finish_reason"] == "tool_calls"
    second, _ = chat.create({"messages": USER})  # ended by the second stop id (<|endoftext|>)
    assert second["choices"][0]["message"] == {"role": "assistant", "content": "408"}
    assert second["choices"][0]["finish_reason"] == "stop" and second["choices"][0]["logprobs"] is None


def test_turn_two_prompt_is_the_tool_loops_prompt_token_for_token(tok, ids):
    turn = ids.enc(CALL) + [ids.im_end]
    script = Script(turn, ids.enc("408") + [ids.im_end])
    chat, conversation = _chat(tok, ids, script), Conversation()
    first, _ = chat.create({"messages": USER}, conversation=conversation)
    reply = first["choices"][0]["message"]
    messages = USER + [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "408"}]
    _, calls = chat.create({"messages": messages}, conversation=conversation)
    prompt = ids.enc(tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True))
    # what ToolEngine builds for the same tool output: prompt + the turn's sampled ids + the tool turn's tokens
    tool_loop = prompt + turn + ToolRenderer(tok, [ids.im_end, ids.pad]).tool_ids([("calculator", {"expression": "12*34"})],
                                                                                 [("calculator", "408")])
    assert calls[0].prompt_ids == tool_loop and list(script.requests[1].prompt_ids) == tool_loop
    assert calls[0].extends == 0 and [c.choice for c in conversation.calls] == [0, 0] and len(conversation.calls) == 2
    assert tok.decode(tool_loop[len(prompt) + len(turn):]) == \
        "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_sampled_ids_are_never_re_tokenized(tok, ids):
    """The model spelt "calculator" one character per token; decoding and encoding the turn would merge it into one
    token (ids differ), so a turn-two prompt built from text could not hold the sampled ids."""
    head, tail = CALL.split("calculator")
    spelt = [ids.enc(ch)[0] for ch in "calculator"]
    assert all(len(ids.enc(ch)) == 1 for ch in "calculator") and len(spelt) == 10 and ids.enc("calculator") != spelt
    turn = ids.enc(head) + spelt + ids.enc(tail) + [ids.im_end]
    assert ids.enc(tok.decode(turn[:-1])) != turn[:-1]  # decode -> encode changes the ids
    chat, conversation = _chat(tok, ids, Script(turn, ids.enc("408") + [ids.im_end])), Conversation()
    first, _ = chat.create({"messages": USER}, conversation=conversation)
    reply = first["choices"][0]["message"]
    assert json.loads(reply["tool_calls"][0]["function"]["arguments"]) == {"expression": "12*34"}
    messages = USER + [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "408"}]
    _, calls = chat.create({"messages": messages}, conversation=conversation)
    prompt = ids.enc(tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True))
    assert calls[0].prompt_ids[: len(prompt) + len(turn)] == prompt + turn
    rendered = ToolRenderer(tok, [ids.im_end]).prompt_ids(canonical_messages(messages))
    assert rendered != calls[0].prompt_ids and len(rendered) == len(calls[0].prompt_ids) - 9  # 10 tokens re-encoded as 1


def test_a_reply_sent_back_as_the_openai_client_dumps_it_still_extends(tok, ids):
    """The `openai` client's message carries refusal/annotations/audio keys and the agent may re-serialise the
    arguments; content null and a different call id: still the same reply."""
    chat, conversation = _chat(tok, ids, Script(ids.enc(CALL) + [ids.im_end], [ids.im_end])), Conversation()
    first, _ = chat.create({"messages": USER}, conversation=conversation)
    returned = first["choices"][0]["message"]
    echoed = {"role": "assistant", "content": None, "refusal": None, "annotations": [], "audio": None, "function_call": None,
              "tool_calls": [{"id": "call_other", "type": "function",
                              "function": {"name": "calculator", "arguments": '{"expression":"12*34"}'}}]}
    assert json.loads(returned["tool_calls"][0]["function"]["arguments"]) == json.loads(echoed["tool_calls"][0]["function"]["arguments"])
    _, calls = chat.create({"messages": USER + [echoed, {"role": "tool", "tool_call_id": "call_other", "content": "408"}]},
                           conversation=conversation)
    assert calls[0].extends == 0


def test_a_rewritten_history_is_rendered_from_scratch(tok, ids):
    turn = ids.enc(CALL) + [ids.im_end]
    chat, conversation = _chat(tok, ids, Script(turn, [ids.im_end], [ids.im_end])), Conversation()
    first, _ = chat.create({"messages": USER}, conversation=conversation)
    reply = first["choices"][0]["message"]
    edited = dict(reply, tool_calls=[{"id": "c", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12*35"}'}}])
    tool = {"role": "tool", "tool_call_id": "c", "content": "420"}
    _, calls = chat.create({"messages": USER + [edited, tool]}, conversation=conversation)
    scratch = ToolRenderer(tok, [ids.im_end]).prompt_ids(canonical_messages(USER + [edited, tool]))
    assert calls[0].extends is None and calls[0].prompt_ids == scratch
    _, calls = chat.create({"messages": [{"role": "system", "content": "Be brief."}] + USER + [reply, tool]}, conversation=conversation)
    assert calls[0].extends is None  # a system turn put in front: not an extension either
    assert len(conversation.calls) == 3


def test_n_choices_are_recorded_and_the_agent_continues_one_of_them(tok, ids):
    script = Script(ids.enc("12") + [ids.im_end], ids.enc(CALL) + [ids.im_end], [ids.im_end])
    chat, conversation = _chat(tok, ids, script), Conversation()
    first, calls = chat.create({"messages": USER, "n": 2, "seed": 5}, conversation=conversation)
    assert [r.seed for r in script.requests] == [5, 6] and [c.choice for c in calls] == [0, 1]
    assert [c["finish_reason"] for c in first["choices"]] == ["stop", "tool_calls"]
    assert first["usage"]["completion_tokens"] == len(ids.enc("12")) + 1 + len(ids.enc(CALL)) + 1
    second = first["choices"][1]["message"]
    _, calls = chat.create({"messages": USER + [second, {"role": "tool", "tool_call_id": "x", "content": "408"}]},
                           conversation=conversation)
    assert calls[0].extends == 1 and calls[0].prompt_ids[-len(ids.enc("<|im_start|>assistant\n")):] == ids.enc("<|im_start|>assistant\n")


def test_a_stop_string_cuts_the_choice_and_the_next_turn_closes_it(tok, ids):
    """"408 is it" with stop ["is"]: content "408 " (the string left out); the ids kept end with the token that
    completes "is"; the turn was not ended by a stop token, so the next turn's suffix starts with <|im_end|>."""
    sampled = ids.enc("408 is it") + [ids.im_end]
    script = Script(sampled, [ids.im_end])
    chat, conversation = _chat(tok, ids, script), Conversation()
    first, calls = chat.create({"messages": USER, "stop": ["is", "zzz"]}, conversation=conversation)
    assert first["choices"][0]["message"]["content"] == "408 " and first["choices"][0]["finish_reason"] == "stop"
    kept = calls[0].trajectory.token_ids
    assert kept == sampled[: len(kept)] and tok.decode(kept).endswith("is") and not tok.decode(kept[:-1]).endswith("is")
    assert calls[0].trajectory.logprobs == [-(k + 1) / 100 for k in range(len(kept))]
    messages = USER + [first["choices"][0]["message"], {"role": "user", "content": "sure?"}]
    _, calls2 = chat.create({"messages": messages}, conversation=conversation)
    head = calls[0].prompt_ids + kept
    assert calls2[0].extends == 0 and calls2[0].prompt_ids[: len(head)] == head
    assert tok.decode(calls2[0].prompt_ids[len(head):]) == "<|im_end|>\n<|im_start|>user\nsure?<|im_end|>\n<|im_start|>assistant\n"


def test_length_and_tool_choice_none(tok, ids):
    chat = _chat(tok, ids, Script(ids.enc("40812"), ids.enc(CALL) + [ids.im_end]))
    cut, calls = chat.create({"messages": USER, "max_completion_tokens": 3})
    assert cut["choices"][0]["finish_reason"] == "length" and len(calls[0].trajectory.token_ids) == 3
    unparsed, _ = chat.create({"messages": USER, "tool_choice": "none"})
    assert unparsed["choices"][0]["message"] == {"role": "assistant", "content": CALL}
    assert unparsed["choices"][0]["finish_reason"] == "stop"


def test_max_tokens_defaults_to_the_room_the_context_leaves(tok, ids):
    script = Script([ids.im_end])
    _chat(tok, ids, script).create({"messages": USER})
    prompt = ids.enc(tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True))
    assert script.requests[0].sampling.max_tokens == 256 - len(prompt)


@pytest.mark.parametrize("body, param, says", [
    ({}, "messages", "non-empty list"),
    ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "must be one of"),
    ({"messages": USER + [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
     "messages[1].tool_calls[0].function.arguments", "is not JSON"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]", "only text parts"),
    ({"messages": USER, "temperature": 3}, "temperature", "in [0, 2]"),
    ({"messages": USER, "top_p": 0}, "top_p", "in (0, 1]"),
    ({"messages": USER, "n": 0}, "n", "integer in 1..128"),
    ({"messages": USER, "stream": "yes"}, "stream", "true or false"),
    ({"messages": USER, "stream": True, "stream_options": ["include_usage"]}, "stream_options", "must be an object"),
    ({"messages": USER, "top_logprobs": 3}, "top_logprobs", "sampled token's log-prob only"),
    ({"messages": USER, "tools": [{"type": "function"}]}, "tools[0]", '{"type": "function"'),
    ({"messages": USER, "tool_choice": "always"}, "tool_choice", "must be"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"messages": USER, "logprobs": "yes"}, "logprobs", "true or false"),
    ({"messages": USER, "max_tokens": 10_000}, "max_tokens", "ask for at most"),
])
def test_bad_requests_name_the_field(tok, ids, body, param, says):
    script = Script()
    with pytest.raises(ChatRequestError) as info:
        _chat(tok, ids, script).create(body)
    assert info.value.param == param and says in str(info.value) and str(info.value).startswith(f"{param}: ")
    assert isinstance(info.value, ValueError) and script.requests == []


def test_an_aborted_choice_raises_and_records_nothing(tok, ids):
    conversation = Conversation()
    with pytest.raises(SamplingFailed, match="did not finish 1 of 1 choice"):
        _chat(tok, ids, Script([ids.im_end], status="aborted")).create({"messages": USER}, conversation=conversation)
    assert conversation.calls == []

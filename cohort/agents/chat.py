"""The OpenAI-compatible chat endpoint's logic: a `/v1/chat/completions` body in, OpenAI's `chat.completion` out,
and what was sampled, token for token.

`ChatCompletions.create(body)` renders the messages (and `tools`, through the chat template's `tools=`, the tools
block the checkpoint was trained with; a request with tools under a template that has no tools block is refused with
the fix rather than rendered without them) into prompt token ids, samples `n` choices through `sample` (blocking: the
rollout server's request stream, or the training process's scheduler), parses each choice's text with the run's
tool parser (cohort/tools/parsers.py) into `content` and `tool_calls`, and returns the response with one
`SampledCall` per choice: the exact prompt ids and the engine's `Trajectory` (token ids with the stop token kept,
engine log-probs, policy versions).

Token in, token out (`Conversation`, one agent run's ledger): when a call's messages are an earlier call's messages,
then that call's reply as the endpoint returned it (content and tool calls; call ids do not count), then new
messages (tool results, user turns), its prompt is that call's prompt ids + its sampled token ids + the chat
template's suffix for the new messages and the next assistant header (`ToolRenderer.turn_ids`, the rendering the
in-process tool loop appends). Nothing sampled is decoded and re-encoded, so a later call's prompt holds the very
ids the model sampled, however they would re-tokenize. Messages that extend no earlier call (the agent rewrote or
trimmed its history), or a template that cannot render turns as a suffix, are rendered from scratch;
`SampledCall.extends` says which happened. Without a Conversation (a plain `cohort serve` client) every call is
rendered from scratch and nothing is recorded.

`stop` strings: the engine samples to a stop token or max_tokens and the endpoint cuts the choice after the token
that completes the first stop string (OpenAI leaves the string out of `content`; the recorded token ids keep that
token, and the next turn's suffix then starts with the template's end-of-turn token, as after a `length` turn).
`tool_choice`: "none" returns the text unparsed; "required" and a named function are parsed like "auto" (sampling is
not constrained: the policy decides whether to call). A choice the engine aborted or failed on raises
`SamplingFailed` (the server answers 500; the agent sees an API error).

Streaming (`stream: true`): `stream_chunks(body, response)` turns the finished response into OpenAI's
`chat.completion.chunk` events, which the HTTP layers send as server-sent events (`data: {...}` each, then
`data: [DONE]`): per choice a first chunk with the role and the content, one chunk per tool call (index, id, name and
the whole arguments string: a client that joins argument deltas gets the same string), a last chunk with the
finish_reason (and logprobs when asked); with `stream_options.include_usage` every chunk has `usage: null` and one
more chunk holds the usage and `choices: []`. The events are written once the engine has sampled the whole choice
(the engine hands back finished trajectories), so a client sees the reply arrive at once, in the shape it expects.

Left out: `top_logprobs`, penalties, structured output (chat_request.py refuses them with the reason).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from cohort.agents.chat_request import ChatRequest, ChatRequestError, chat_request, same_reply
from cohort.models.chat_template import TOOLS_FIX, renders_tools
from cohort.rollout.base import FINISHED, Request, SamplingConfig, Trajectory
from cohort.tools.parsers import Parser, get_parser
from cohort.tools.render import ToolRenderer, ToolTemplateError

Sample = Callable[[list[Request]], list[Trajectory]]  # blocking: these requests through the engine, trajectories in order

__all__ = ["ChatCompletions", "ChatRequestError", "Conversation", "Sample", "SampledCall", "SamplingFailed", "stream_chunks"]


def stream_chunks(body: dict[str, Any], response: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The `chat.completion.chunk` events of `response` when `body` (a request `create` accepted) asked for a stream,
    else None (module docstring: "Streaming")."""
    if body.get("stream") is not True:
        return None
    usage = bool((body.get("stream_options") or {}).get("include_usage"))
    head = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"], "model": response["model"]}
    extra = {"usage": None} if usage else {}
    chunks = []
    for choice in response["choices"]:
        message, index = choice["message"], choice["index"]
        delta = {"role": "assistant", "content": message.get("content") or ""}
        chunks.append({**head, "choices": [{"index": index, "delta": delta, "finish_reason": None, "logprobs": None}], **extra})
        for k, call in enumerate(message.get("tool_calls") or []):
            tool_delta = {"index": k, "id": call["id"], "type": "function",
                          "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}
            chunks.append({**head, "choices": [{"index": index, "delta": {"tool_calls": [tool_delta]}, "finish_reason": None,
                                                "logprobs": None}], **extra})
        chunks.append({**head, "choices": [{"index": index, "delta": {}, "finish_reason": choice["finish_reason"],
                                            "logprobs": choice.get("logprobs")}], **extra})
    if usage:
        chunks.append({**head, "choices": [], "usage": response["usage"]})
    return chunks


@dataclass
class SampledCall:
    """What one /v1/chat/completions call sampled for one choice (one per choice when n > 1)."""

    prompt_ids: list[int]  # exactly the ids the engine was given
    trajectory: Trajectory  # the engine's result (cut after a stop string: module docstring)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the request's messages, canonical (chat_request.py)
    tools: list[dict[str, Any]] | None = None  # the request's tools, as rendered
    reply: dict[str, Any] = field(default_factory=dict)  # the assistant message returned, canonical
    extends: int | None = None  # index in Conversation.calls whose prompt + completion this prompt extends; None: from scratch
    choice: int = 0


class SamplingFailed(RuntimeError):
    """The engine aborted or failed a choice; `trajectories` holds what came back."""

    def __init__(self, message: str, trajectories: list[Trajectory]):
        super().__init__(message)
        self.trajectories = trajectories


class Conversation:
    """One agent run's calls in order, token-exact; safe to share between an agent's concurrent calls."""

    def __init__(self):
        self.calls: list[SampledCall] = []
        self._lock = threading.Lock()

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   renderer: ToolRenderer) -> tuple[list[int], int | None]:
        """The prompt for canonical `messages` and the index of the call it extends (None: rendered from scratch)."""
        with self._lock:
            calls = list(self.calls)
        for index in range(len(calls) - 1, -1, -1):
            call, k = calls[index], len(calls[index].messages)
            if len(messages) > k + 1 and call.tools == tools and messages[:k] == call.messages \
                    and same_reply(messages[k], call.reply):
                sampled = call.trajectory.token_ids
                closed = bool(sampled) and sampled[-1] in renderer.stop_token_ids
                try:
                    suffix = renderer.turn_ids(call.reply, messages[k + 1:], tools, closed=closed)
                except ToolTemplateError:  # the template cannot append turns as a suffix: from scratch
                    break
                return list(call.prompt_ids) + list(sampled) + suffix, index
        return renderer.prompt_ids(messages, tools), None

    def record(self, calls: list[SampledCall]) -> None:
        with self._lock:
            self.calls.extend(calls)


class ChatCompletions:
    """`create(body)` -> (OpenAI chat.completion response, the SampledCalls); see the module docstring."""

    def __init__(self, tokenizer, stop_token_ids, sample: Sample, *, parser: str | Parser = "hermes",
                 model_name: str = "", max_model_len: int | None = None, render_tools: bool = True):
        """`render_tools` False: a request's `tools` are not rendered into the prompt (a checkpoint trained without the
        template's tools block, as tiny:tool_calc and the in-process tool loop's prompts are); replies are parsed alike."""
        self.render_tools = render_tools
        self._renders_tools = renders_tools(tokenizer)  # (a probe rendering, once)
        self.tokenizer = tokenizer
        self.renderer = ToolRenderer(tokenizer, stop_token_ids)
        self.sample = sample
        self.parser = get_parser(parser) if isinstance(parser, str) else parser
        self.model_name = model_name
        self.max_model_len = max_model_len

    stream_chunks = staticmethod(stream_chunks)  # (for servers that get this object, not this module)

    def create(self, body: dict, *, conversation: Conversation | None = None) -> tuple[dict, list[SampledCall]]:
        """An OpenAI-shaped chat.completion response for `body` and what was sampled. With `conversation` (one agent
        run's ledger), prompts reuse earlier sampled token ids and each call is appended to it; without it, nothing is
        recorded."""
        request = chat_request(body)
        if not self.render_tools:
            request = replace(request, tools=None)
        elif request.tools and not self._renders_tools:
            raise ChatRequestError("tools", "the model's chat template has no tools block, so these tools would not be "
                                            f"shown to the model; {TOOLS_FIX}, or leave them out of the prompt "
                                            "for a checkpoint trained without that block (agent.render_tools: false, "
                                            "`cohort serve --no-tools-in-prompt`)")
        prompt, extends = self._prompt(request, conversation)
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        sampling = SamplingConfig(self._max_tokens(request, len(prompt)), request.temperature, request.top_p)
        requests = [Request(f"{completion_id}/{i}", tuple(prompt), sampling, None if request.seed is None else request.seed + i)
                    for i in range(request.n)]
        trajectories = self.sample(requests)
        unfinished = [t for t in trajectories if t.status not in FINISHED]
        if unfinished:
            raise SamplingFailed(f"the engine did not finish {len(unfinished)} of {len(trajectories)} choice(s): "
                                 f"{unfinished[0].status}" + (f" ({unfinished[0].error})" if unfinished[0].error else ""), trajectories)
        choices, calls = [], []
        for i, sampled in enumerate(trajectories):
            sampled, text = self._cut_at_stop(sampled, request.stop)
            message, reply, finish_reason = self._message(sampled, text, request.parse_tools)
            choice = {"index": i, "message": message, "finish_reason": finish_reason,
                      "logprobs": self._logprobs(sampled) if request.logprobs else None}
            choices.append(choice)
            calls.append(SampledCall(list(prompt), sampled, request.messages, request.tools, reply, extends, i))
        if conversation is not None:
            conversation.record(calls)
        completion_tokens = sum(len(c.trajectory.token_ids) for c in calls)
        response = {"id": completion_id, "object": "chat.completion", "created": int(time.time()),
                    "model": self.model_name or str(body.get("model") or ""), "choices": choices,
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens,
                              "total_tokens": len(prompt) + completion_tokens}}
        return response, calls

    # ------------------------------------------------------------------ the prompt

    def _prompt(self, request: ChatRequest, conversation: Conversation | None) -> tuple[list[int], int | None]:
        try:
            if conversation is None:
                return self.renderer.prompt_ids(request.messages, request.tools), None
            return conversation.prompt_ids(request.messages, request.tools, self.renderer)
        except ToolTemplateError as exc:
            raise ChatRequestError("messages", f"the model's chat template cannot render these messages ({exc.__cause__ or exc})") from None

    def _max_tokens(self, request: ChatRequest, prompt_length: int) -> int:
        """max_tokens as asked, or the room the context leaves; a request that does not fit says what would."""
        if self.max_model_len is None:
            if request.max_tokens is None:
                raise ChatRequestError("max_tokens", "this server does not know the model's context length; send max_tokens")
            return request.max_tokens
        room = self.max_model_len - prompt_length
        if room < 1:
            fix = ("; or leave the tools block out of the prompt (ChatCompletions(render_tools=False), `cohort serve "
                   "--no-tools-in-prompt`) when the checkpoint was trained without it") if request.tools else ""
            raise ChatRequestError("messages", f"the prompt is {prompt_length} tokens and the model holds "
                                               f"{self.max_model_len} (prompt and completion); shorten the conversation{fix}")
        if request.max_tokens is not None and request.max_tokens > room:
            raise ChatRequestError("max_tokens", f"{request.max_tokens} tokens after a {prompt_length}-token prompt exceed "
                                                 f"the model's {self.max_model_len}; ask for at most {room}")
        return request.max_tokens if request.max_tokens is not None else room

    # ------------------------------------------------------------------ one choice

    def _text(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def _content_ids(self, sampled: Trajectory) -> list[int]:
        """The sampled ids without the final stop token (what the text is decoded from)."""
        ids = sampled.token_ids
        return ids[:-1] if ids and ids[-1] in self.renderer.stop_token_ids else ids

    def _cut_at_stop(self, sampled: Trajectory, stops: tuple[str, ...]) -> tuple[Trajectory, str]:
        """The choice cut after the token that completes its first stop string, and its text before that string."""
        ids = self._content_ids(sampled)
        text = self._text(ids)
        found = [text.find(s) for s in stops if s in text]
        if not found:
            return sampled, text
        low, high = 1, len(ids)  # the shortest prefix whose text holds a stop string (holding one is monotone in k)
        while low < high:
            mid = (low + high) // 2
            low, high = (low, mid) if any(s in self._text(ids[:mid]) for s in stops) else (mid + 1, high)
        cut = Trajectory(ids[:low], sampled.logprobs[:low], "stop", sampled.policy_version, sampled.versions[:low],
                         sampled.loss_mask[:low], sampled.prompt_ids, sampled.request_id)
        return cut, text[:min(found)]

    def _message(self, sampled: Trajectory, text: str, parse_tools: bool) -> tuple[dict, dict, str]:
        """(the response's message, the same message canonical, the finish reason)."""
        parsed = self.parser(text) if parse_tools else None
        calls = parsed.calls if parsed is not None else []
        length = sampled.status == "length"
        if not calls:
            return ({"role": "assistant", "content": text}, {"role": "assistant", "content": text},
                    "length" if length else "stop")
        content = parsed.content if parsed.content is not None else text
        tool_calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                       "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in calls]
        canonical_calls = [dict(c, function={"name": call.name, "arguments": dict(call.arguments)}) for c, call in zip(tool_calls, calls)]
        message = {"role": "assistant", "content": content or None, "tool_calls": tool_calls}
        reply = {"role": "assistant", "content": content, "tool_calls": canonical_calls}
        return message, reply, "length" if length else "tool_calls"

    def _logprobs(self, sampled: Trajectory) -> dict[str, Any] | None:
        if not sampled.logprobs:
            return None
        content = []
        for token_id, logprob in zip(self._content_ids(sampled), sampled.logprobs):
            token = self.tokenizer.decode([token_id])
            content.append({"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
        return {"content": content}

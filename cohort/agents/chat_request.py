"""Reading an OpenAI chat-completions request body: every field the endpoint uses checked, messages made canonical.

`chat_request(body)` returns a `ChatRequest`, or raises `ChatRequestError` naming the field (`param`, as OpenAI's
error object does) and what was expected; the server answers it with HTTP 400 in OpenAI's error shape.

Canonical messages (`canonical_messages`) are what the chat template renders and what the endpoint compares
between calls: roles `system | user | assistant | tool` (`developer` becomes `system`); `content` a string (a list
of text parts joined; null becomes ""); an assistant's `tool_calls` as `{id, type: "function", function: {name,
arguments}}` with `arguments` a dict (OpenAI sends a JSON string; chat templates render a dict); a tool message's
`name` filled from the assistant call its `tool_call_id` answers when the client left it out; any other key dropped
(the `openai` client's message objects carry `refusal`, `audio`, `annotations`, ...).

Taken: messages, tools, tool_choice, n, temperature, top_p, max_tokens / max_completion_tokens, stop, logprobs,
seed, stream and stream_options.include_usage (the reply as server-sent events: cohort/agents/chat.py's
`stream_chunks`). Refused with a reason when set to anything but their default: top_logprobs, presence_penalty,
frequency_penalty, logit_bias, response_format other than text, and the legacy functions / function_call (the
engine samples with temperature and top-p only, and returns one log-prob per token). Ignored: model, user,
metadata, store, parallel_tool_calls, service_tier and any other key.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from cohort.rewards.text import content_text
from cohort.rollout.server.bodies import BadRequest

ROLES = ("system", "user", "assistant", "tool")
MAX_CHOICES = 128
MAX_STOP_STRINGS = 4
REFUSED_UNLESS_DEFAULT = {  # key -> (its default values, why it is refused)
    "top_logprobs": ((None, 0), "the engine returns the sampled token's log-prob only; leave top_logprobs out"),
    "presence_penalty": ((None, 0, 0.0), "the engine samples with temperature and top_p only"),
    "frequency_penalty": ((None, 0, 0.0), "the engine samples with temperature and top_p only"),
    "logit_bias": ((None, {}), "the engine samples with temperature and top_p only"),
    "response_format": ((None, {"type": "text"}), "structured output is not supported; ask for JSON in the prompt"),
    "functions": ((None, []), "the legacy `functions` field is not supported; send `tools`"),
    "function_call": ((None,), "the legacy `function_call` field is not supported; send `tool_choice`"),
}


class ChatRequestError(BadRequest):
    """A malformed chat-completions request; `param` names the field (OpenAI's error object has it too)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, Any]]  # canonical (module docstring)
    tools: list[dict[str, Any]] | None
    parse_tools: bool  # False for tool_choice "none": the text is returned as it is
    n: int
    temperature: float
    top_p: float
    max_tokens: int | None  # None: as many as the model's context leaves
    stop: tuple[str, ...]
    logprobs: bool
    seed: int | None
    stream: bool = False  # the reply as server-sent events (chat.py's stream_chunks)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage and no choices


def chat_request(body: Any) -> ChatRequest:
    """The request in `body` (a parsed JSON object), or ChatRequestError naming the field."""
    if not isinstance(body, dict):
        raise ChatRequestError("body", f"must be a JSON object, got {type(body).__name__}")
    for key, (defaults, why) in REFUSED_UNLESS_DEFAULT.items():
        if key in body and body[key] not in defaults:
            raise ChatRequestError(key, f"{json.dumps(body[key])[:60]} is not supported: {why}")
    tools = _tools(body.get("tools"))
    tool_choice = body.get("tool_choice")
    if not (tool_choice in (None, "auto", "none", "required") or _is_named_choice(tool_choice)):
        raise ChatRequestError("tool_choice", f'must be "auto", "none", "required" or {{"type": "function", "function": '
                                              f'{{"name": ...}}}}, got {json.dumps(tool_choice)[:60]}')
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        messages=canonical_messages(body.get("messages")), tools=tools, parse_tools=tool_choice != "none",
        n=_integer(body, "n", 1, 1, MAX_CHOICES), temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
        max_tokens=None if max_tokens is None else _integer({"max_tokens": max_tokens}, "max_tokens", None, 1, None),
        stop=_stop(body.get("stop")), logprobs=_flag(body, "logprobs"),
        seed=None if body.get("seed") is None else _integer(body, "seed", None, None, None),
        stream=_flag(body, "stream"), include_usage=_include_usage(body.get("stream_options")))


def _include_usage(options: Any) -> bool:
    if options is None:
        return False
    if not isinstance(options, dict):
        raise ChatRequestError("stream_options", f"must be an object like {{\"include_usage\": true}}, got {json.dumps(options)[:60]}")
    return _flag(options, "include_usage")


def canonical_messages(messages: Any) -> list[dict[str, Any]]:
    """The messages in canonical form (module docstring); ChatRequestError naming the message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ChatRequestError("messages", "must be a non-empty list of {role, content} objects")
    out: list[dict[str, Any]] = []
    call_names: dict[str, str] = {}  # tool_call_id -> the function it called, for tool messages without a name
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise ChatRequestError(where, f"must be an object with a role, got {type(message).__name__}")
        role = "system" if message.get("role") == "developer" else message.get("role")
        if role not in ROLES:
            raise ChatRequestError(f"{where}.role", f"must be one of {ROLES + ('developer',)}, got {json.dumps(role)}")
        canonical: dict[str, Any] = {"role": role, "content": _content(message.get("content"), f"{where}.content")}
        if role == "assistant" and message.get("tool_calls"):
            canonical["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(message["tool_calls"])]
            call_names.update((c["id"], c["function"]["name"]) for c in canonical["tool_calls"] if c["id"])
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id is not None:
                canonical["tool_call_id"] = str(call_id)
            name = message.get("name") or call_names.get(str(call_id))
            if name:
                canonical["name"] = str(name)
        elif role in ("user", "system") and isinstance(message.get("name"), str):
            canonical["name"] = message["name"]
        out.append(canonical)
    return out


def same_reply(sent: dict[str, Any], returned: dict[str, Any]) -> bool:
    """Whether the assistant message an agent sent back (canonical) is the reply the endpoint returned (canonical):
    the same content and the same calls (name and arguments; call ids and key order do not count)."""
    def calls(message: dict[str, Any]) -> list[tuple[str, str]]:
        return [(c["function"]["name"], json.dumps(c["function"]["arguments"], sort_keys=True)) for c in message.get("tool_calls") or []]

    return sent["role"] == "assistant" and sent["content"] == returned["content"] and calls(sent) == calls(returned)


def _content(content: Any, where: str) -> str:
    """A message's content as one string, once checked: a string, null, or a list of text parts only (joined)."""
    if isinstance(content, list):
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatRequestError(f"{where}[{k}]", 'only text parts ({"type": "text", "text": ...}) are supported')
    elif content is not None and not isinstance(content, str):
        raise ChatRequestError(where, f"must be a string, a list of text parts or null, got {type(content).__name__}")
    return content_text(content)


def _tool_call(call: Any, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatRequestError(where, 'must be {"id": ..., "type": "function", "function": {"name": ..., "arguments": ...}}')
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatRequestError(f"{where}.function.arguments", f"is not JSON ({exc.msg})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ChatRequestError(f"{where}.function.arguments", f"must be a JSON object, got {type(arguments).__name__}")
    return {"id": str(call.get("id") or ""), "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ChatRequestError("tools", f"must be a list of function tools, got {type(tools).__name__}")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise ChatRequestError(f"tools[{i}]", 'must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
    return tools


def _is_named_choice(choice: Any) -> bool:
    return isinstance(choice, dict) and choice.get("type") == "function" and isinstance((choice.get("function") or {}).get("name"), str)


def _stop(stop: Any) -> tuple[str, ...]:
    strings = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(strings, list) or len(strings) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in strings):
        raise ChatRequestError("stop", f"must be a non-empty string or a list of at most {MAX_STOP_STRINGS}, got {json.dumps(stop)[:60]}")
    return tuple(strings)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ChatRequestError(key, f"must be true or false, got {json.dumps(value)[:60]}")
    return bool(value)


def _integer(body: dict[str, Any], key: str, default: int | None, low: int | None, high: int | None) -> int:
    value = body.get(key, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or (low is not None and value < low) or (high is not None and value > high):
        bounds = f" in {low}..{high}" if high is not None else f" >= {low}" if low is not None else ""
        raise ChatRequestError(key, f"must be an integer{bounds}, got {json.dumps(value)[:60]}")
    return value


def _number(body: dict[str, Any], key: str, default: float, low: float, high: float, open_low: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (open_low and value == low):
        raise ChatRequestError(key, f"must be a number in {'(' if open_low else '['}{low:g}, {high:g}], got {json.dumps(value)[:60]}")
    return float(value)

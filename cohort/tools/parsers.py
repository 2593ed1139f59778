"""Tool-call parsers behind one registry (`tools.parser`): an assistant turn's text in, its tool calls out.

- `hermes` (Qwen2.5/Qwen3, Hermes, and every template that renders calls the same way):
  `<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>`, several blocks for several calls.
- `compact`, for small character-level models where every character is a token: `<<multiply(3, 4)>>`; arguments
  positional (in the schema's order) or `name=value`, each value a JSON literal when it parses as one, else a string.
- a user parser by import path (`my_module.parse`): a function `text -> ParsedTurn` (or a list of `ToolCall`).

A malformed call (bad JSON, no name, arguments not an object) is never an exception: `ParsedTurn.errors` says what
is wrong, the tool loop feeds that back to the model as the tool message and counts it (`tools/parse_errors`).
A turn with neither calls nor errors is the final answer.

Left out: calls in the middle of a turn's text (the loop runs the turn's calls when the turn ends, as TRL does);
parsers for templates whose calls are not text (the sampled text is all a parser sees).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from cohort.tools.tool_schemas import import_object


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedTurn:
    """An assistant turn's tool calls, one message per call that could not be parsed, and the turn's text outside its
    calls (`content`: what the OpenAI-compatible endpoint returns as the message content; None when the parser does
    not say, then the whole text is)."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str | None = None

    @property
    def wants_tools(self) -> bool:
        return bool(self.calls or self.errors)


Parser = Callable[[str], ParsedTurn]

_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> ParsedTurn:
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks; an unclosed last block is an error."""
    out = ParsedTurn()
    for match in _HERMES.finditer(text):
        body, closed = match.group(1).strip(), match.group(2)
        if not closed:
            out.errors.append("the <tool_call> block is not closed with </tool_call>")
            continue
        try:
            payload = json.loads(body)
        except json.JSONDecodeError as exc:
            out.errors.append(f"the tool call is not valid JSON ({exc.msg} at character {exc.pos}): {body[:80]!r}")
            continue
        call = _call_from_payload(payload)
        (out.calls.append(call) if isinstance(call, ToolCall) else out.errors.append(call))
    out.content = _HERMES.sub("", text).strip() if out.wants_tools else text
    return out


def _call_from_payload(payload: Any) -> ToolCall | str:
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return 'a tool call must be a JSON object with a string "name" and an object "arguments"'
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string (OpenAI's wire format)
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f'the "arguments" of {payload["name"]!r} are a string that is not JSON'
    if not isinstance(arguments, dict):
        return f'the "arguments" of {payload["name"]!r} must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(payload["name"], arguments)


_COMPACT = re.compile(r"<<\s*([A-Za-z_]\w*)\s*\((.*?)(\)\s*>>|$)", re.DOTALL)


def parse_compact(text: str) -> ParsedTurn:
    """`<<name(arg, key=value)>>` calls; positional arguments are keyed `0`, `1`, ... until the loop names them."""
    out = ParsedTurn()
    for match in _COMPACT.finditer(text):
        name, body, closed = match.group(1), match.group(2), match.group(3)
        if not closed:
            out.errors.append(f"the call <<{name}(...) is not closed with >>")
            continue
        arguments: dict[str, Any] = {}
        for position, piece in enumerate(p.strip() for p in body.split(",") if p.strip()):
            key, eq, value = piece.partition("=")
            key, value = (key.strip(), value.strip()) if eq and key.strip().isidentifier() else (str(position), piece)
            arguments[key] = _literal(value)
        out.calls.append(ToolCall(name, arguments))
    if not out.calls and not out.errors and "<<" in text:
        out.errors.append("a call starts with << but is not name(arguments)>>")
    out.content = _COMPACT.sub("", text).strip() if out.wants_tools else text
    return out


def _literal(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value.strip("'\"")


PARSERS: dict[str, Parser] = {"hermes": parse_hermes, "compact": parse_compact}


def get_parser(name: str) -> Parser:
    """A registered parser, or a user function by import path; a clear error otherwise."""
    if name in PARSERS:
        return PARSERS[name]
    if "." not in name and ":" not in name:
        raise ValueError(f"tools.parser = {name!r} is not a parser; choose one of {sorted(PARSERS)} or give an "
                         "import path to your own function (text -> cohort.tools.parsers.ParsedTurn)")
    function = import_object(name, "tools.parser")
    if not callable(function):
        raise ValueError(f"tools.parser {name!r} is a {type(function).__name__}, not a function")

    def user_parser(text: str) -> ParsedTurn:
        result = function(text)
        return result if isinstance(result, ParsedTurn) else ParsedTurn(calls=list(result or []))

    return user_parser


def register_parser(name: str, parser: Parser) -> None:
    if name in PARSERS:
        raise ValueError(f"a tool parser named {name!r} is already registered")
    PARSERS[name] = parser

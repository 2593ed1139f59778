"""Tool-call parsers behind one registry (`tools.parser`): an assistant turn's text in, its tool calls out.

- `hermes` (Qwen2.5/Qwen3, Hermes, and every template that renders calls the same way):
  `<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>`, several blocks for several calls.
- `compact`, for small character-level models where every character is a token: `<<multiply(3, 4)>>`; arguments
  positional (in the schema's order) or `name=value`, each value a JSON literal when it parses as one, else a string.
- `json`, for models that write the template's call object without its tags (Qwen2.5-Coder-0.5B-Instruct writes
  `{"name": "calculator", "arguments": {...}}` in a ```json fenced block or bare, never in `<tool_call>` tags): every
  such object is a call, in the tags, in a fenced block or bare. `"parameters"` is read as `"arguments"` (Llama 3's
  spelling).
- a user parser by import path (`my_module.parse`): a function `text -> ParsedTurn` (or a list of `ToolCall`).

Call forms (`call_forms`): whatever the parser, the tool loop counts every call a turn writes by its form: `tagged`
(a `<tool_call>` block, the template's format), `fenced` (a call object in a ``` block) or `bare` (a call object in
the prose); a call the run's parser did not read is counted as ignored (`tools/ignored_calls`), never dropped in
silence. A call object is a JSON object with a string "name" and an object "arguments" (or "parameters").

A malformed call (bad JSON, no name, arguments not an object) is never an exception: `ParsedTurn.errors` says what
is wrong, the tool loop feeds that back to the model as the tool message and counts it (`tools/parse_errors`).
A turn with neither calls nor errors is the final answer.

Left out: calls in the middle of a turn's text (the loop runs the turn's calls when the turn ends, as TRL does);
parsers for templates whose calls are not text (the sampled text is all a parser sees).
"""

from __future__ import annotations

import json
import re
from collections import Counter
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
_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)(```|$)", re.DOTALL)
CALL_FORMS = ("tagged", "fenced", "bare")  # the template's tags, a ``` block, neither


@dataclass(frozen=True)
class WrittenCall:
    """A call as a turn wrote it: its form, the decoded object (None for a tagged block that is not JSON), its span."""

    form: str
    payload: Any
    start: int
    end: int


def written_calls(text: str) -> list[WrittenCall]:
    """Every call the text writes, in order: each `<tool_call>` block (tagged, whatever is inside), and each call
    object outside them (fenced when inside a ``` block, else bare). Objects nested in another are not counted."""
    out = [WrittenCall("tagged", _json_or_none(m.group(1)), m.start(), m.end()) for m in _HERMES.finditer(text)]
    tagged = [(c.start, c.end) for c in out]
    fences = [(m.start(1), m.end(1)) for m in _FENCE.finditer(text)]
    decoder, at = json.JSONDecoder(), 0
    while (at := text.find("{", at)) != -1:
        if any(a <= at < b for a, b in tagged):
            at += 1
            continue
        try:
            payload, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at += 1
            continue
        if _is_call_object(payload):
            form = "fenced" if any(a <= at < b for a, b in fences) else "bare"
            out.append(WrittenCall(form, payload, at, end))
        at = end
    return sorted(out, key=lambda c: c.start)


def call_forms(text: str) -> Counter:
    """How many calls the text writes in each form (CALL_FORMS); see `written_calls`."""
    return Counter(c.form for c in written_calls(text))


def _json_or_none(body: str) -> Any:
    try:
        return json.loads(body.strip())
    except json.JSONDecodeError:
        return None


def _is_call_object(payload: Any) -> bool:
    return (isinstance(payload, dict) and isinstance(payload.get("name"), str)
            and isinstance(payload.get("arguments", payload.get("parameters")), (dict, str)))


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
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):  # some models emit the arguments as a JSON string (OpenAI's wire format)
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return f'the "arguments" of {payload["name"]!r} are a string that is not JSON'
    if not isinstance(arguments, dict):
        return f'the "arguments" of {payload["name"]!r} must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(payload["name"], arguments)


def parse_json(text: str) -> ParsedTurn:
    """Every call object the turn writes (`written_calls`): `<tool_call>` blocks as `hermes` reads them, and call
    objects in a ``` block or bare. The content is the text without them (a fenced call's block removed whole)."""
    out = parse_hermes(text)
    cut = [(m.start(), m.end()) for m in _HERMES.finditer(text)]
    fences = list(_FENCE.finditer(text))
    for call in written_calls(text):
        if call.form == "tagged":
            continue
        found = _call_from_payload(call.payload)
        (out.calls.append(found) if isinstance(found, ToolCall) else out.errors.append(found))
        fence = next((f for f in fences if f.start(1) <= call.start < f.end(1)), None)
        cut.append((fence.start(), fence.end()) if fence is not None else (call.start, call.end))
    unfinished = _unfinished_call(text, cut)
    if unfinished is not None:  # a call object the text breaks off (the budget ran out inside it) or never closes
        out.errors.append(f"the tool call is not valid JSON (it breaks off): {text[unfinished:][:80]!r}")
        fence = next((f for f in fences if f.start(1) <= unfinished <= f.end(1)), None)  # (an unclosed ``` block too)
        cut.append((fence.start() if fence is not None else unfinished, len(text)))
    if out.wants_tools:
        kept, at = [], 0
        for start, end in sorted(cut):
            kept.append(text[at:max(at, start)])
            at = max(at, end)
        out.content = ("".join(kept) + text[at:]).strip()
    return out


_CALL_START = re.compile(r'\{\s*"name"\s*:')


def _unfinished_call(text: str, taken: list[tuple[int, int]]) -> int | None:
    """Where a call object starts that does not decode, after every call read (`taken`: their spans): the `{"name":`
    of a call the completion budget cut off, or a malformed one. Its numbers are not an answer: a model that
    learned to repeat the tool's result as the next call's expression, cut by the budget, would otherwise be read as
    answering with it (the reward reads the last assistant message)."""
    after = max((end for _, end in taken), default=0)
    for match in _CALL_START.finditer(text, after):
        try:
            json.JSONDecoder().raw_decode(text, match.start())
        except json.JSONDecodeError:
            return match.start()
    return None


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


PARSERS: dict[str, Parser] = {"hermes": parse_hermes, "json": parse_json, "compact": parse_compact}


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

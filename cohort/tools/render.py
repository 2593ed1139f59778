"""The tokens of a tool turn: what the chat template writes after the assistant's end-of-turn token, checked at start-up.

Token-in, token-out: the model's sampled tokens are never decoded and re-encoded; what the loop appends after an
assistant turn that called tools is what the chat template renders after that turn (the tool messages and the next
assistant header), read from the rendering of the whole conversation:

    prompt = encode(render(base, add_generation_prompt=True))        # what the model sampled after
    before = encode(render(base + [assistant with the calls]))       # that turn as the last one
    after  = encode(render(base + [assistant] + tool messages, add_generation_prompt=True))
    tool tokens = after[after the assistant's end-of-turn token:]

The assistant's end-of-turn token is the last of the model's stop tokens in `before` (where that turn is the last
one), and in `after` the stop token of the same rank counted from the end of the turns before it (`render(base)`,
which both renderings must start with, token for token). The model stopped at that token (it is the
last one it sampled), so the tool tokens start with the separator the template writes after it (Qwen's `\\n` after
`<|im_end|>`): without it every tool turn would lose a newline the model saw in every rendered conversation (verl
#6501). `prompt` must be a prefix of `before` and `before`'s assistant turn must contain a stop token (the model can
end a turn that calls a tool); the separator after it in `before` must be the one in `after`.

Templates that rewrite earlier turns: a prefix-preserving template renders the assistant turn the same in `before`
and `after`, and the tool tokens are then `after[len(before):]` preceded by the separator. Qwen3's original template
(TRL's chat_templates/qwen3.jinja) does not: with thinking off the generation prompt ends with an empty
`<think>\\n\\n</think>\\n\\n` block and the last assistant turn is rendered with it, but once a tool message
follows, the same turn is rendered without it (a turn's reasoning block is kept only while it is the last one). The rule
above does not compare the assistant turn across the two renderings, so such a template trains as it is: the
trajectory keeps the tokens the model saw and sampled (prompt with the empty think block, its turn, the tool tokens,
the next header with its empty think block), the conversation as the model was shown it turn by turn, not the
re-rendering of the whole conversation in which the earlier think blocks are gone. Assumed, and checked on a sample
conversation before any model loads (and on every real turn): a rewrite of the assistant turn adds or drops no stop
token, and the tokens after the assistant's end-of-turn do not depend on how the template rendered that turn (true of every template that closes a turn with a special token and
writes the next message after it; `ToolTemplateError` otherwise).

`base` is one fixed user turn: the suffix of a tool turn must not depend on the history (true of the ChatML,
Qwen, Qwen3, Llama-3 and Hermes templates); the history itself is the sampled tokens. `tools` (the run's JSON schemas)
are rendered in every one of these renderings, as in the prompts, so a tools block the template writes in its system
turn is the same in all of them.

`turn_ids(assistant, messages)` is the same suffix for any messages after an assistant turn (tool results, user
turns: what an agent sends back to the OpenAI-compatible endpoint, cohort/agents/chat.py); `tool_ids` is its case
for the tool loop. After a turn the model did not end with a stop token (it hit its token budget, or the endpoint
cut it at a stop string), `closed=False` keeps the template's end-of-turn token at the head of the suffix.
`prompt_ids(messages, tools)` renders a whole conversation from scratch (a first turn, or an agent that rewrote
its history); `tools` are JSON schemas passed to the template's `tools=` (its tools block).

Tool responses longer than `max_response_tokens` (tokens of the response text alone) are cut on
`truncate_side` ("right" keeps the beginning, "left" the end) before rendering.

Left out: templates whose turn separator or tool rendering depends on the turns before it (none known).
"""

from __future__ import annotations

import json
from typing import Any, Sequence

BASE = [{"role": "user", "content": "Hi"}]


class ToolTemplateError(ValueError):
    """The chat template cannot render tool turns as a token suffix of the conversation so far."""


class ToolRenderer:
    def __init__(self, tokenizer, stop_token_ids: Sequence[int], *, max_response_tokens: int | None = None,
                 truncate_side: str = "right"):
        self.tokenizer = tokenizer
        self.stop_token_ids = set(int(t) for t in stop_token_ids)
        self.max_response_tokens = max_response_tokens
        self.truncate_side = truncate_side

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool, tools: list[dict] | None = None) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except Exception as exc:  # noqa: BLE001 - jinja raises many kinds
            raise ToolTemplateError(f"the chat template cannot render a tool turn ({type(exc).__name__}: {exc}); use a "
                                    "checkpoint whose tokenizer_config.json chat_template has a `tool` role") from exc

    def truncate(self, content: str) -> tuple[str, bool]:
        """The response cut to max_response_tokens tokens on truncate_side; whether it was cut."""
        if self.max_response_tokens is None:
            return content, False
        ids = self.encode(content)
        if len(ids) <= self.max_response_tokens:
            return content, False
        kept = ids[: self.max_response_tokens] if self.truncate_side == "right" else ids[len(ids) - self.max_response_tokens:]
        return self.tokenizer.decode(kept), True

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None = None) -> list[int]:
        """A whole conversation rendered from scratch, ending with the generation prompt (the next assistant header)."""
        return self.encode(self._render(messages, True, tools))

    def tool_ids(self, calls: list[tuple[str, dict[str, Any]]], responses: list[tuple[str, str]],
                 tools: list[dict] | None = None) -> list[int]:
        """The tokens appended after an assistant turn (ended by its stop token) that made `calls` ((name, arguments))
        and got `responses` ((tool name, content)): separator, tool messages, next assistant header."""
        assistant = {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
        return self.turn_ids(assistant, [{"role": "tool", "name": name, "content": content} for name, content in responses],
                             tools)

    def turn_ids(self, assistant: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict] | None = None, *,
                 closed: bool = True) -> list[int]:
        """The tokens appended after the assistant turn `assistant` for the `messages` that follow it (tool results,
        user turns), then the next assistant header. `closed`: the model ended its turn with a stop token; False keeps
        the template's end-of-turn token at the head (the model never sampled it). Module docstring: the rule."""
        head = self.encode(self._render(BASE, False, tools))  # the turns before the assistant's
        prompt = self._render(BASE, True, tools)  # what the model samples after: ends with the header
        before_text = self._render(BASE + [assistant], False, tools)
        before = self.encode(before_text)
        after = self.encode(self._render(BASE + [assistant] + list(messages), True, tools))
        if not before_text.startswith(prompt):  # (as text: the header's last token may merge with the turn's first)
            self._require_prefix(self.encode(prompt), before, "the assistant turn after the generation prompt")
        self._require_prefix(head, before, "the assistant turn")
        self._require_prefix(head, after, "the messages after the assistant's")
        turn = self.encode(before_text[len(prompt):])
        ends = self._stops(before, len(head))  # the assistant turn is the last one in `before`: its last stop ends it
        if not ends:
            raise ToolTemplateError(
                "the chat template's assistant turn contains none of the model's stop tokens "
                f"{sorted(self.stop_token_ids)}, so the model cannot end a turn that calls a tool: "
                f"{self.tokenizer.decode(turn)!r}")
        end_before, later = ends[-1], self._stops(after, len(head))
        if len(later) < len(ends):
            raise ToolTemplateError("the chat template writes fewer of the model's stop tokens for the assistant turn once "
                                    f"a message follows it ({self.tokenizer.decode(after[len(head):])!r})")
        end_after = later[len(ends) - 1]  # the same stop token, counted from the turns before the assistant's
        separator = before[end_before + 1:]
        if after[end_after + 1:end_after + 1 + len(separator)] != separator:
            raise ToolTemplateError(
                "the chat template writes something else after the assistant's end-of-turn token once a message follows "
                f"({self.tokenizer.decode(separator)!r} as the last turn, "
                f"{self.tokenizer.decode(after[end_after + 1:end_after + 1 + len(separator)])!r} before the next), so the "
                "tokens after a sampled turn cannot be told; use a template that writes each message after the end of "
                "the previous one")
        return after[end_after + (1 if closed else 0):]

    def _stops(self, ids: list[int], start: int) -> list[int]:
        """Positions of the model's stop tokens at or after `start`."""
        return [i for i in range(start, len(ids)) if ids[i] in self.stop_token_ids]

    def _require_prefix(self, shorter: list[int], longer: list[int], what: str) -> None:
        if longer[: len(shorter)] == shorter:
            return
        at = next((i for i, (x, y) in enumerate(zip(shorter, longer)) if x != y), min(len(shorter), len(longer)))
        raise ToolTemplateError(
            f"the chat template is not prefix-preserving: rendering {what} changes the tokens of the turns before it "
            f"(first difference at token {at}: {self.tokenizer.decode(shorter[at:at + 8])!r} becomes "
            f"{self.tokenizer.decode(longer[at:at + 8])!r}), so tool tokens cannot be appended to the sampled ones. "
            "Use a template that renders each turn independently of the ones after it (model.chat_template)")

    def check(self, tools: list[dict] | None = None) -> None:
        """Raise ToolTemplateError now when the template cannot render tool turns as a suffix (module docstring)."""
        self.tool_ids([("check", {"x": 1})], [("check", json.dumps({"result": 1}))], tools)

"""The tokens of a tool turn: the chat template's rendering suffix, checked at start-up to be prefix-preserving.

Token-in, token-out: the model's sampled tokens are never decoded and re-encoded; what the loop appends after an
assistant turn that called tools is the token suffix the chat template adds for the tool messages (and the next
assistant header):

    before = encode(render(base + [assistant with the calls]))
    after  = encode(render(base + [assistant with the calls] + tool messages, add_generation_prompt=True))
    tool tokens = before[after the end-of-turn token:]  +  after[len(before):]

`before[after the end-of-turn token:]` is the separator the template writes after the assistant's end-of-turn
token (Qwen's `\\n` after `<|im_end|>`): the model stopped at the end-of-turn token and never sampled it, so
without it every tool turn would lose a newline the model saw in every rendered conversation (verl #6501).
`after` must start with `before`, and `before` with the rendering of `base` plus the generation prompt, token for
token (the template is prefix-preserving at every turn, so the rendered history is what the model was given and
sampled); `check()` verifies that,
and that the assistant turn ends with one of the model's stop tokens, on a sample conversation before any model
loads, so a template that cannot render tool turns this way fails with a clear error instead of drifting masks.
Every real tool turn is checked again (`ToolTemplateError` names the template's fault).

`base` is one fixed user turn: the suffix of a tool turn must not depend on the history (true of the ChatML,
Qwen, Llama-3 and Hermes templates); the history itself is the sampled tokens.

`turn_ids(assistant, messages)` is the same suffix for any messages after an assistant turn (tool results, user
turns: what an agent sends back to the OpenAI-compatible endpoint, cohort/agents/chat.py); `tool_ids` is its case
for the tool loop. After a turn the model did not end with a stop token (it hit its token budget, or the endpoint
cut it at a stop string), `closed=False` keeps the template's end-of-turn token at the head of the suffix.
`prompt_ids(messages, tools)` renders a whole conversation from scratch (a first turn, or an agent that rewrote
its history); `tools` are JSON schemas passed to the template's `tools=` (its tools block).

Tool responses longer than `max_response_tokens` (tokens of the response text alone) are cut on
`truncate_side` ("right" keeps the beginning, "left" the end) before rendering.

Left out: templates that rewrite earlier turns when a new one is added (Qwen3's reasoning stripping of old
turns is prefix-changing; such a template fails `check()` and needs a template without that rewrite).
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

    def tool_ids(self, calls: list[tuple[str, dict[str, Any]]], responses: list[tuple[str, str]]) -> list[int]:
        """The tokens appended after an assistant turn (ended by its stop token) that made `calls` ((name, arguments))
        and got `responses` ((tool name, content)): separator, tool messages, next assistant header."""
        assistant = {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}
        return self.turn_ids(assistant, [{"role": "tool", "name": name, "content": content} for name, content in responses])

    def turn_ids(self, assistant: dict[str, Any], messages: list[dict[str, Any]], tools: list[dict] | None = None, *,
                 closed: bool = True) -> list[int]:
        """The tokens appended after the assistant turn `assistant` for the `messages` that follow it (tool results,
        user turns), then the next assistant header. `closed`: the model ended its turn with a stop token; False keeps
        the template's end-of-turn token at the head (the model never sampled it)."""
        history = self.encode(self._render(BASE, True, tools))  # what the model samples after: ends with the header
        before = self.encode(self._render(BASE + [assistant], False, tools))
        after = self.encode(self._render(BASE + [assistant] + list(messages), True, tools))
        self._require_prefix(history, before, "the assistant turn after the generation prompt")
        self._require_prefix(before, after, "the turn after the assistant's")
        ends = [i for i, t in enumerate(before) if t in self.stop_token_ids and i >= len(history)]
        if not ends:
            raise ToolTemplateError(
                "the chat template's assistant turn contains none of the model's stop tokens "
                f"{sorted(self.stop_token_ids)}, so the model cannot end a turn that calls a tool: "
                f"{self.tokenizer.decode(before[len(history):])!r}")
        return before[ends[-1] + (1 if closed else 0):] + after[len(before):]

    def _require_prefix(self, shorter: list[int], longer: list[int], what: str) -> None:
        if longer[: len(shorter)] == shorter:
            return
        at = next((i for i, (x, y) in enumerate(zip(shorter, longer)) if x != y), min(len(shorter), len(longer)))
        raise ToolTemplateError(
            f"the chat template is not prefix-preserving: rendering {what} changes the tokens of the turns before it "
            f"(first difference at token {at}: {self.tokenizer.decode(shorter[at:at + 8])!r} becomes "
            f"{self.tokenizer.decode(longer[at:at + 8])!r}), so tool tokens cannot be appended to the sampled ones. "
            "Use a template that renders each turn independently of the ones after it (the checkpoint's "
            "tokenizer_config.json chat_template)")

    def check(self) -> None:
        """Raise ToolTemplateError now when the template cannot render tool turns as a suffix (module docstring)."""
        self.tool_ids([("check", {"x": 1})], [("check", json.dumps({"result": 1}))])

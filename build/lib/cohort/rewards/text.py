"""Small text helpers shared by the built-in rewards.

Choices:
- A completion is either a plain string or a chat-format list of messages
  (``[{"role": "assistant", "content": ...}]``). The text we score is the content of
  the *last assistant message* (the final answer in a multi-turn tool loop); when no
  message carries a role, the last message. Content given as a list of parts
  (``[{"type": "text", "text": ...}]``) is joined.
- Gold columns are looked up by an explicit name, or by the first present name in
  a fallback list; a missing column is a ``KeyError`` that lists what *is* there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def content_text(content: Any) -> str:
    """The text of one message's ``content`` (a string or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def completion_text(completion: Any) -> str:
    """The text to score for one completion, plain or chat format."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, Mapping):
        return content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, Mapping)]
        if not messages:
            return ""
        assistant = [m for m in messages if m.get("role") == "assistant"]
        chosen = assistant[-1] if assistant else messages[-1]
        return content_text(chosen.get("content"))
    raise TypeError(
        f"a completion must be a string or a list of chat messages, got {type(completion).__name__}"
    )


def completion_texts(completions: Sequence[Any]) -> list[str]:
    return [completion_text(c) for c in completions]


def pick_column(
    columns: Mapping[str, Any], name: str | None, fallbacks: Sequence[str], *, reward: str
) -> Sequence[Any]:
    """The gold column: ``name`` when given, else the first of ``fallbacks`` present."""
    return pick_named_column(columns, name, fallbacks, reward=reward)[1]


def pick_named_column(
    columns: Mapping[str, Any], name: str | None, fallbacks: Sequence[str], *, reward: str
) -> tuple[str, Sequence[Any]]:
    """``(column name, values)`` of the gold column, as ``pick_column`` chooses it."""
    candidates = [name] if name is not None else list(fallbacks)
    for candidate in candidates:
        if candidate in columns and columns[candidate] is not None:
            return candidate, columns[candidate]
    available = sorted(k for k in columns if k not in ("prompts", "completions", "completion_ids"))
    wanted = " or ".join(repr(c) for c in candidates)
    raise KeyError(
        f"{reward} needs the gold column {wanted}, but the batch has only {available}; "
        f"set the option gold_column to the dataset column that holds the answer"
    )


def truncate(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters, marking how much was dropped."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit} more characters]"

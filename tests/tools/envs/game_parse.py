"""Tool-call parsers for the Gymnasium training runs: a random tiny model (or a small instruct model that was never
taught the `step` tool) writes no real calls, so every assistant turn is read as one move picked by the turn's length
(varied, so a group's rewards differ): a letter for Hangman (a Text action space), a number for FrozenLake's Discrete(4)."""

from __future__ import annotations

from cohort.tools.parsers import ParsedTurn, ToolCall

LETTERS = "etaoinsrhl"


def letter_parse(text: str) -> ParsedTurn:
    return ParsedTurn(calls=[ToolCall("step", {"action": LETTERS[len(text) % len(LETTERS)]})])


def move_parse(text: str) -> ParsedTurn:
    return ParsedTurn(calls=[ToolCall("step", {"action": len(text) % 4})])

"""A tool-call parser for the Hangman training test: a random tiny model writes no real calls, so every assistant turn
is read as one Hangman move, a letter picked by the turn's length (varied, so a group's rewards differ)."""

from __future__ import annotations

from cohort.tools.parsers import ParsedTurn, ToolCall

LETTERS = "etaoinsrhl"


def letter_parse(text: str) -> ParsedTurn:
    return ParsedTurn(calls=[ToolCall("step", {"action": LETTERS[len(text) % len(LETTERS)]})])

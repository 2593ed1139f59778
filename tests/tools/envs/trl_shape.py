"""TRL's OpenEnv quick-start shape, written for these tests: a class for `GRPOTrainer(environment_factory=...)` with
`reset(**kwargs)` returning the first observation, one tool method with a Google docstring, a `reward` attribute,
and `reward_func(environments, **kwargs)` reading it. Nothing here knows cohort."""

from __future__ import annotations


class EchoEnv:
    def __init__(self):
        self.reward = 0.0
        self.last = ""

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        self.word = str(kwargs.get("word", "hello"))
        return f" Echo the word {self.word}."

    def echo(self, message: str) -> str:
        """Echo the message back.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        if message == "crash":
            raise ValueError("echo refuses to crash")
        self.last = message
        self.reward = float(len(message) % 3) / 2
        return message


def reward_func(environments, **kwargs) -> list[float]:
    return [environment.reward for environment in environments]


def parse(text):
    """Every assistant turn read as a call to echo its own text (a random model never writes a real call)."""
    from cohort.tools.parsers import ParsedTurn, ToolCall

    return ParsedTurn(calls=[ToolCall("echo", {"message": text.strip()[:8] or "x"})])


TURNS = [0]


def guess_parse(text):
    """Every assistant turn read as a guess: its length modulo 4 (varied, so groups' rewards differ). With
    $GUESS_KILL_AT_TURN and $GUESS_SERVER_PID set, the server is killed at that turn (the kill-mid-step test)."""
    import os
    import signal

    from cohort.tools.parsers import ParsedTurn, ToolCall

    TURNS[0] += 1
    if os.environ.get("GUESS_KILL_AT_TURN") and TURNS[0] == int(os.environ["GUESS_KILL_AT_TURN"]):
        os.kill(int(os.environ["GUESS_SERVER_PID"]), signal.SIGKILL)
    return ParsedTurn(calls=[ToolCall("step", {"guess": len(text) % 4})])

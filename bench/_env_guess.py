"""The guessing game of bench/env_rollouts_engine.py, once as an OpenEnv environment and once in TRL's
`environment_factory` shape, and the parser their runs use.

The game is tests/tools/envs/guess_env.py's (guess a number from 0 to 3; `done` when right or after the third guess;
reward 1 for the right guess), without its failure hooks and with an empty first observation: the dataset's prompt
says everything. (When these numbers were taken, a first observation of even one token did not fit: vLLM's
`max_model_len` was sized from the dataset's longest prompt + `rollout.max_completion_length` + 1, so an appended
observation shortened the completions and failed the first step's sync canary. Since 2026-12-06 a run with
`tools.environment` gets the model's positions, as agents do; the game keeps its empty observation so the numbers
stay comparable.)

- `GuessEnv`: an OpenEnv `Environment` (typed Action and Observation), run in-process; `app` serves it with openenv's
  own `create_app` (`uvicorn _env_guess:app`; sessions: $GUESS_SESSIONS, default 16).
- `GuessGame`: the same game as a plain class written for `GRPOTrainer(environment_factory=...)`: `reset(**row)`,
  one public method `step` (the tool), a `done` attribute and `get_reward()`.
- `guess_call`: every assistant turn read as a call `step(guess=...)` (its last digit 0-3, else its length modulo 4).
  A 135M model writes no tool call of its own (SmolLM2's chat template has no tools block), so the episodes are
  multi-turn because this parser says so, as with tests/tools/envs/trl_shape.py's `guess_parse`.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

from cohort.tools.parsers import ParsedTurn, ToolCall

MAX_GUESSES = 3


def answer(guess: int, target: int) -> str:
    return "right" if guess == target else ("lower" if guess > target else "higher")


class GuessAction(Action):
    """A guess."""

    guess: int = Field(description="the number you guess, 0 to 3")


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True  # instances share nothing

    def __init__(self):
        super().__init__()
        self.target, self._state = 0, State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, target: int = 0,
              **kwargs: Any) -> GuessObservation:
        self.target, self._state = int(target), State(episode_id=episode_id, step_count=0)
        return GuessObservation()

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        right = action.guess == self.target
        return GuessObservation(feedback=answer(action.guess, self.target), reward=1.0 if right else 0.0,
                                done=right or self._state.step_count >= MAX_GUESSES)

    @property
    def state(self) -> State:
        return self._state


class GuessGame:
    def __init__(self):
        self.target, self.guesses, self.reward, self.done = 0, 0, 0.0, False

    def reset(self, target: int = 0, **row) -> None:
        self.target, self.guesses, self.reward, self.done = int(target), 0, 0.0, False

    def step(self, guess: int) -> str:
        """Guess the number.

        Args:
            guess: the number you guess, 0 to 3
        """
        self.guesses += 1
        self.reward += 1.0 if int(guess) == self.target else 0.0
        self.done = int(guess) == self.target or self.guesses >= MAX_GUESSES
        return answer(int(guess), self.target)

    def get_reward(self) -> float:
        return self.reward


def guess_call(text: str) -> ParsedTurn:
    """The turn as one call `step(guess=...)`: its last digit from 0 to 3, else its length modulo 4."""
    digits = [int(ch) for ch in text if ch in "0123"]
    return ParsedTurn(calls=[ToolCall("step", {"guess": digits[-1] if digits else len(text) % 4})])


app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess",
                 max_concurrent_envs=int(os.environ.get("GUESS_SESSIONS", "16")))

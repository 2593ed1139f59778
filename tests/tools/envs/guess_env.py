"""A small OpenEnv environment for the tests: guess a number from 0 to 3 in at most three steps (typed Action and
Observation; `done` when guessed or after the third step; reward 1 for the right guess). A row's `target` picks the
number; `target = -1` makes `reset` raise, a guess of 99 makes `step` raise and one of 42 freezes it for 5 s (the failure tests). `app` serves it
with openenv's own `create_app` (sessions: $GUESS_SESSIONS, default 8)."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """A guess."""

    guess: int = Field(description="the number you guess, 0 to 3")


class GuessObservation(Observation):
    feedback: str = ""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    SUPPORTS_CONCURRENT_SESSIONS = True
    MAX_STEPS = 3

    def __init__(self):
        super().__init__()
        self.target = 0
        self._state = State(step_count=0)

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, target: int = 0, **kwargs: Any) -> GuessObservation:
        if int(target) < 0:
            raise ValueError(f"no number below 0 to guess (target {target})")
        self.target, self._state = int(target), State(episode_id=episode_id, step_count=0)
        return GuessObservation(feedback=" Guess a number from 0 to 3.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        if action.guess == 99:
            raise RuntimeError("the oracle is asleep")
        if action.guess == 42:
            time.sleep(5)  # a frozen environment
        self._state.step_count += 1
        right = action.guess == self.target
        feedback = "right" if right else ("lower" if action.guess > self.target else "higher")
        return GuessObservation(feedback=feedback, done=right or self._state.step_count >= self.MAX_STEPS,
                                reward=1.0 if right else 0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_app(GuessEnv, GuessAction, GuessObservation, env_name="guess",
                 max_concurrent_envs=int(os.environ.get("GUESS_SESSIONS", "8")))

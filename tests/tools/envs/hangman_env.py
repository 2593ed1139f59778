"""A small word game written the way Gymnasium's "Create a Custom Environment" page writes an environment (a
`gymnasium.Env` subclass with `metadata`, its spaces declared in `__init__`, `_get_obs`/`_get_info`, `reset` seeding
`self.np_random` through `super().reset(seed=seed)`, `step` returning the five values, an ansi `render`), registered
with `gymnasium.register`. Nothing here knows cohort.

Hangman: a secret word (`options["word"]`, else drawn with `self.np_random`); each move is one letter or the whole
word. Rewards: the share of the word's letters a move reveals (a letter in "moon" that shows both o's: 2/4), the
whole word its letters not yet shown, -0.1 for a wrong move; so a won game sums to 1 - 0.1 x wrong moves.
Terminated when every letter shows; truncated by the registered TimeLimit after 6 moves.
"""

from __future__ import annotations

import string
from typing import Optional

import gymnasium as gym
from gymnasium import spaces

WORDS = ("cat", "sun", "moon", "star", "tree")


class HangmanEnv(gym.Env):
    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(self, render_mode: Optional[str] = None, words: tuple[str, ...] = WORDS):
        self.words = words
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=200, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=8, min_length=1, charset=string.ascii_lowercase)
        self._word = ""
        self._shown: set[str] = set()
        self._wrong = 0

    def _get_obs(self) -> str:
        pattern = " ".join(c if c in self._shown else "_" for c in self._word)
        return f"Word: {pattern} ({len(self._word)} letters, {self._wrong} wrong). Guess a letter or the word."

    def _get_info(self) -> dict:
        return {"word_length": len(self._word), "wrong": self._wrong}

    def reset(self, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        word = (options or {}).get("word")
        if word is None:
            word = self.words[int(self.np_random.integers(len(self.words)))]
        if not word or not set(word) <= set(string.ascii_lowercase):
            raise ValueError(f"the word must be lowercase letters, got {word!r}")
        self._word, self._shown, self._wrong = word, set(), 0
        return self._get_obs(), self._get_info()

    def step(self, action: str):
        hidden = [c for c in self._word if c not in self._shown]
        if action == self._word:
            revealed = len(hidden)
        elif len(action) == 1 and action in hidden:
            revealed = hidden.count(action)
        else:
            revealed = 0
        self._shown |= set(self._word) if action == self._word else {action}
        reward = revealed / len(self._word) if revealed else -0.1
        self._wrong += revealed == 0
        terminated = set(self._word) <= self._shown
        return self._get_obs(), reward, terminated, False, self._get_info()

    def render(self):
        if self.render_mode == "ansi":
            return self._get_obs()


gym.register(id="Hangman-v0", entry_point=HangmanEnv, max_episode_steps=6)

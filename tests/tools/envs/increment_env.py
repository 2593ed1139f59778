"""Environments in the shapes of TRL's GRPO docs ("Environments" in docs/source/grpo_trainer.md), written for these
tests: a class for `GRPOTrainer(environment_factory=...)` whose `reset(**kwargs)` either self-samples its task and
returns the prompt (no dataset) or reads the row's `target` column; one tool method with a Google docstring; an
optional `get_reward`. Nothing here knows cohort; `RESETS` records what each `reset` was given, so a test can compare
it with what the reward functions got."""

from __future__ import annotations

import random

RESETS: list[dict] = []  # every reset's keyword arguments, in call order (this process)
REWARDED: list[dict] = []  # every `seen_by_reward` call's view: prompts and columns


class IncrementEnv:
    """The docs' dataset-less shape: reset self-samples a target and returns the prompt; get_reward scores."""

    def reset(self, **kwargs) -> str | None:
        RESETS.append(dict(kwargs))
        self.counter = 0
        self.target = random.randint(1, 6)
        return f"Increment the counter by {self.target}."

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class TargetEnv:
    """The docs' external-dataset shape: the row's `target` (and `seed`) columns arrive as keyword arguments."""

    def reset(self, target, **kwargs) -> None:
        RESETS.append({"target": target, **kwargs})
        self.counter = 0
        self.target = target

    def get_reward(self) -> float:
        return float(self.counter == self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.

        Returns:
            The updated counter value.
        """
        self.counter += step
        return self.counter


class BoardEnv:
    """Shows a board at reset (as an OpenEnv game or a chess FEN would): the text the model must see."""

    def reset(self, **kwargs) -> str:
        self.board = f" Board: {kwargs.get('board', '....')}"
        return self.board

    def get_reward(self) -> float:
        return 1.0

    def move(self, square: int) -> str:
        """
        Play a square.

        Args:
            square: The square to play, 0 to 3.

        Returns:
            The board after the move.
        """
        return self.board


class NoResetEnv:
    """A class a user forgot to give `reset` (TRL refuses it)."""

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        return step


class FlakyEnv:
    """reset raises for target 1 and shows a board of 400 words for target 3; get_reward reads state only a clean
    reset sets (so a run that scores a failed episode with it fails)."""

    def reset(self, target, **kwargs) -> str | None:
        if target == 1:
            raise RuntimeError(f"no board for target {target}")
        if target == 3:
            return " Board:" + " square" * 400
        self.target = target
        return None

    def get_reward(self) -> float:
        return float(self.target)

    def increment(self, step: int) -> int:
        """
        Increment the internal counter.

        Args:
            step: Value to add to the counter.
        """
        return step


def target_seen(environments, target, **kwargs) -> list[float]:
    """1.0 where the completion's environment was reset with the row the reward functions got."""
    return [float(getattr(env, "target", None) == t) for env, t in zip(environments, target)]


def seen_by_reward(prompts, completions, conversations, **kwargs) -> list[float]:
    """Records what a reward function is given (prompts, conversations, columns); scores nothing."""
    REWARDED.append({"prompts": prompts, "conversations": conversations, **kwargs})
    return [0.0 for _ in completions]

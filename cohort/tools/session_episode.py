"""The bookkeeping of an environment that speaks reset/step results as a tool-loop environment (`SessionEpisode`),
shared by the adapters that make another hub's environments TRL-shaped classes (cohort/tools/openenv.py,
cohort/tools/gym_text.py), so that neither adapter is built on the other.

A subclass opens a session (`_open_session`: an object with `reset(row)`, `step(action)`, `close()`, each returning
`{observation, reward, done, ...}`) and says how an observation reads (`_render(result)`); this class keeps the
episode: the rewards summed (`get_reward`, None for a failed episode), `done`, the last observation, and `failure`.
Any exception of the session ends the episode with the environment's message; `EnvironmentLost` (the service gone)
is raised as it is, so the tool loop fails the step (cohort/tools/loop.py).
"""

from __future__ import annotations

from typing import Any


class EnvironmentLost(RuntimeError):
    """An environment's service is gone (refused, dropped, silent): its episode fails and so does the step (the tool
    loop, cohort/tools/loop.py). Here, torch-free, so validation can resolve a session environment without loading the
    rollout layer."""


class SessionEpisode:
    """One episode of a session-speaking environment (module docstring); subclasses set `source` (the environment's
    name in messages), `_open_session` and `_render`, and offer the tools that call `_act`."""

    source: str = ""
    timeout_s: float = 10.0

    def __init__(self):
        self.rewards: list[float] = []
        self.done = False
        self.failure: str | None = None
        self.observation: str | None = None
        self._session: Any = None

    def _open_session(self) -> Any:
        raise NotImplementedError

    def _render(self, result: dict[str, Any]) -> str:
        raise NotImplementedError

    def reset(self, **row: Any) -> str:
        self._session = self._guard("reset", self._open_session)
        return self._record(self._guard("reset", lambda: self._session.reset(row)))

    def _act(self, action: dict[str, Any]) -> str:
        if self.done:
            raise RuntimeError("the episode is over (done); no more steps")
        return self._record(self._guard("step", lambda: self._session.step(action)))

    def _record(self, result: dict[str, Any]) -> str:
        if result.get("reward") is not None:
            self.rewards.append(float(result["reward"]))
        self.done = bool(result.get("done"))
        self.observation = self._render(result)
        return self.observation

    def _guard(self, what: str, call):
        """`call()`; any failure ends the episode (done, `failure` set) and is raised with the environment's message."""
        try:
            return call()
        except EnvironmentLost as exc:
            self.done, self.failure = True, str(exc)
            raise
        except Exception as exc:  # noqa: BLE001 - the environment's own error: this episode fails, not the run
            self.done, self.failure = True, f"{self.source} {what} raised {type(exc).__name__}: {exc}"
            raise RuntimeError(self.failure) from exc

    def get_reward(self) -> float | None:
        """The episode's rewards summed; None for a failed episode."""
        return None if self.failure is not None else float(sum(self.rewards))

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

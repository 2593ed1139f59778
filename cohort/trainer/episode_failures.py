"""Failed episodes reach the user: a step whose episodes failed says so, and a run whose every episode fails stops.

An episode fails when whatever runs it failed it before the model could play it (`EpisodeRecord.failed`: a reset
that raised, a first observation past the context, an agent environment's episode that ended with errors, such as the agent
endpoint refusing its every call). Such an episode is scored by nothing and trains nothing (cohort/rollout/collect.py's
failure rule), so training goes on past a few of them; but a batch whose every episode failed teaches nothing, and a
run that goes on like that trains on nothing and calls it done (issue 60: an agent environment's glossary task on SmolLM2, 8 of 8
episodes failed at every step, exit 0, not a word).

- `EpisodeFailures.of(trajectories)`: a generation batch's failed episodes, counted over its runs before seats widen
  them (cohort/trainer/agent_samples.py), with each one's message (`EpisodeRecord.failure_message`: the words of
  whatever failed it, with its fix where cohort wrote one).
- `FailureWatch(limit).observe(step, failures)`: the line for the console and warnings.jsonl when some episode of
  the step's batch failed (the count and the first message; its other messages, each once, in warnings.jsonl's
  record), and `EpisodesFailed` once every episode failed for `limit` generating steps in a row
  (`run.max_failed_steps`; 0: never). The training loop raises it between steps, so the run-failure path
  (cohort/trainer/failure.py) saves the state after the last step, writes logs/error.log and exits 4.

Left out: stopping on a share of failures below all (a flaky environment that fails some episodes is the
environment's to fix; each step's line says so), and counting steps that train on a batch generated earlier
(train.steps_per_generation > 1: the batch's failures were counted on the step that generated it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from cohort.rollout.base import Trajectory
from cohort.trainer.diagnostics import RunWarning

KIND = "failed_episodes"


class EpisodesFailed(RuntimeError):
    """Every episode failed for `run.max_failed_steps` generating steps in a row; the message says what failed them."""


@dataclass(frozen=True)
class EpisodeFailures:
    """A generation batch's episodes (`total`) and the messages of those that failed, in batch order."""

    total: int
    messages: tuple[str, ...] = ()

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> EpisodeFailures:
        """The batch's runs (one trajectory per request, before seats widen them), each failed one's message."""
        failed = [t.episode for t in trajectories if t.episode is not None and t.episode.failed]
        return cls(len(trajectories), tuple(e.failure_message or f"the {e.kind} episode failed (no message)" for e in failed))

    @property
    def count(self) -> int:
        return len(self.messages)

    @property
    def all_failed(self) -> bool:
        return self.total > 0 and self.count == self.total

    def distinct(self) -> dict[str, int]:
        """Each message once, with how many episodes it failed, in order of first appearance."""
        out: dict[str, int] = {}
        for message in self.messages:
            out[message] = out.get(message, 0) + 1
        return out


@dataclass(frozen=True)
class FailureRecord(RunWarning):
    """A failed-episodes warning; warnings.jsonl's record also holds each distinct message with its count."""

    failures: dict[str, int] = field(default_factory=dict)


@dataclass
class FailureWatch:
    """Counts the generating steps in a row whose every episode failed (module docstring); `limit` 0 never stops."""

    limit: int
    streak: int = 0
    streak_start: int | None = None  # the streak's first step
    shown: tuple[str, int] | None = None  # the first message the console last showed in full, and its step
    stop: EpisodesFailed | None = None  # set by `observe` once the streak reached `limit`: the loop raises it

    def observe(self, step: int, failures: EpisodeFailures) -> FailureRecord | None:
        """The step's warning (None when no episode failed); sets `stop` once every episode failed for `limit` steps
        in a row."""
        if not failures.all_failed:
            self.streak, self.streak_start = 0, None
        else:
            self.streak, self.streak_start = self.streak + 1, self.streak_start or step
            if self.limit and self.streak >= self.limit:
                self.stop = EpisodesFailed(self._stop_message(step, failures))
        if not failures.count:
            return None
        first = failures.messages[0]
        if self.shown is not None and self.shown[0] == first:
            said = f"the same as at step {self.shown[1]}"
        else:
            said, self.shown = first, (first, step)
        text = f"{failures.count} of {failures.total} episodes failed (scored by nothing, trained on nothing): {said}"
        if failures.all_failed and self.limit and self.stop is None:
            text += (f" [the run stops when every episode fails for {self.limit} steps in a row: run.max_failed_steps; "
                     f"{self.streak} so far]")
        return FailureRecord(step, KIND, "episodes/failed", float(failures.count), text, failures.distinct())

    def _stop_message(self, step: int, failures: EpisodeFailures) -> str:
        others = len(failures.distinct()) - 1
        more = f" ({others} other message(s) in RUN_DIR/warnings.jsonl)" if others > 0 else ""
        steps = f"steps {self.streak_start} to {step}" if self.streak_start != step else f"step {step}"
        return (f"every episode failed at {steps} ({failures.count} of {failures.total} at step {step}), so the run "
                f"trained on nothing: {failures.messages[0]}{more}. Fix that cause, or set run.max_failed_steps=0 to "
                "train on regardless")

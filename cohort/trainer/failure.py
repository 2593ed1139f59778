"""A run that fails keeps what it earned: its last good state saved, one short message, the traceback in a file.

Any exception inside `cohort train` that is not a configuration or checkpoint
problem (a reward function that raises or breaks the contract, a dead rollout
server, an engine error) becomes `RunFailed`, whose message names the step, the
phase (generate, reward, logprob, update, critic, sync) and the error as its
raiser worded it (a `RewardError` names the function and the offending
completion); the full traceback goes to RUN_DIR/logs/error.log and the message
gives that path. The CLI prints it and exits 4.

Which state is saved (`settle`, given the `StepStart` taken at the step's start and
whether `optimizer.step()` was entered during the step, seen by a step pre-hook):
- the optimizer step was not taken (the failure came in generate, reward,
  log-probs or the backward pass; the weights and optimizer moments are those of
  the step's start): the counters, RNG, sampler and batch are rewound to the
  step's start, and that state (after step N−1) is saved, exactly as for a
  non-finite loss;
- the step completed and only the push of its weights into the engine failed:
  the state after step N is consistent (the engine is not part of a checkpoint),
  and saved; that step's metrics line is not written;
- the optimizer stepped but the step was not recorded (a PPO critic update that
  failed after the policy's): the policy and the critic disagree, so nothing new
  is saved and the message names the newest earlier checkpoint, if any.
A non-finite loss or gradient norm is the first case (it is caught before the optimizer
step): rewound, saved, and `halted` builds the `RunHalted` that says so.
A failure between steps (logging, a mid-run eval) leaves the state after the last
recorded step, which is saved. Before the first completed step nothing is saved
(resuming would be starting over); the message then names the newest checkpoint
already there, if any (a resume that failed before its first step). Multi-process runs save nothing
(`checkpoint.unsupported`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cohort.runs.error_log import describe, write_error_log
from cohort.trainer import checkpoint
from cohort.trainer.phases import Phases
from cohort.trainer.state import Checkpointed, TrainerState, rng_state, set_rng_state
from cohort.trainer.stopping import NonFiniteError, RunHalted



class RunFailed(RuntimeError):
    """The run failed; the message says what, where the traceback is, and how to resume (the CLI exits 4)."""


class StepFailed(RuntimeError):
    """Step `step` raised (the cause is `__cause__`) in `phase`; `state` is `settle`'s verdict."""

    def __init__(self, step: int, phase: str | None, state: str):
        self.step, self.phase, self.state = step, phase, state
        super().__init__(f"step {step} failed in {phase or 'an unknown phase'}")


class OptimizerWatch:
    """`with OptimizerWatch(opt) as watch:` … `watch.stepped`: whether `opt.step()` was entered inside (even if it then raised)."""

    def __init__(self, optimizer):
        self.optimizer, self.stepped, self._handle = optimizer, False, None

    def _mark(self, *args) -> None:
        self.stepped = True

    def __enter__(self) -> OptimizerWatch:
        self._handle = self.optimizer.register_step_pre_hook(self._mark)
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.remove()


@dataclass(frozen=True)
class StepStart:
    """The cheap part of the state at the start of a step (`take`), to `rewind` to if the step fails before its
    optimizer step (a non-finite loss among such failures).

    Copied: the `TrainerState` (counters, the batch reference), RNG, and every stateful part whose state holds no
    tensors (the sampler, a KL controller, the LR schedule, the rollout scheduler with its generation index). Not
    copied: weights and optimizer moments, which such a step never changed."""

    state: TrainerState
    rng: dict[str, Any]
    parts: dict[str, Any]  # part name -> a deep copy of its state dict

    @classmethod
    def take(cls, saved: Checkpointed) -> StepStart:
        small = {name: part.state_dict() for name, part in saved.stateful.items()}
        return cls(saved.state.copy(), rng_state(),
                   {name: copy.deepcopy(state) for name, state in small.items() if not _holds_tensors(state)})

    def rewind(self, saved: Checkpointed) -> None:
        """Back to this start: the counters and batch, the small part states, RNG; no gradients left."""
        saved.state.rewind_to(self.state)
        for name, state in self.parts.items():
            saved.stateful[name].load_state_dict(state)
        set_rng_state(self.rng)
        saved.parts.optimizer.zero_grad(set_to_none=True)


def _holds_tensors(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensors(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v) for v in value)
    return False


def settle(saved: Checkpointed, phases: Phases, start: StepStart, optimizer_stepped: bool) -> str:
    """Put a trainer whose step raised into its newest consistent state (`start`: taken at the step's start; a rewound
    step's phase timers are emptied too); returns which: rewound | complete | inconsistent."""
    if not optimizer_stepped:  # the weights and moments are still the step's start
        start.rewind(saved)
        phases.pop()
        return "rewound"
    if saved.state.step == start.state.step + 1:  # the step was recorded; the weight push after it failed
        return "complete"
    return "inconsistent"


def halted(saved: Checkpointed, error: NonFiniteError) -> RunHalted:
    """After a non-finite loss or gradient norm (the step rewound by `settle`): save that last good state and build the
    `RunHalted` that says so and how to go on (the caller raises it)."""
    run_dir = saved.parts.run_dir
    if (reason := checkpoint.unsupported(saved.parts.dist)) is None:
        kept = f"Saved the last good state (after step {saved.state.step}) to {checkpoint.save_checkpoint(saved)}"
    else:
        kept = f"Nothing saved: {reason}"
    return RunHalted(f"stopped: {error.metric} is {error.value} at step {error.step} (non-finite); the optimizer step "
                     f"was not taken. {kept}. Common causes: a learning rate far too high, rewards so large they overflow, "
                     f"fp16 overflow. Fix the cause, then resume with: cohort train --resume {run_dir}")


def run_failed(saved: Checkpointed, error: BaseException) -> RunFailed:
    """Save what can be saved after `error` and build the `RunFailed` that reports it (the caller raises it)."""
    if isinstance(error, StepFailed):
        cause, step, state = error.__cause__ or error, error.step, error.state
        where = f"at step {step}" + (f" ({error.phase})" if error.phase else "")
    else:
        cause, state = error, "complete"
        where = f"after step {saved.state.step}" if saved.state.step else "before the first step"
    try:
        kept = _save_last_good_state(saved, state)
    except checkpoint.CheckpointError as exc:
        kept = f"Saving the last good state failed too: {exc}"
    log = write_error_log(saved.parts.run_dir, cause)
    return RunFailed(f"run failed {where}: {describe(cause)}\n{kept}\nFull traceback: {log}")


def _save_last_good_state(saved: Checkpointed, state: str) -> str:
    run_dir, step = saved.parts.run_dir, saved.state.step
    resume = f"Fix the cause, then resume with: cohort train --resume {run_dir}"
    latest = checkpoint.latest_checkpoint(run_dir)
    if state == "inconsistent":
        found = f"the newest checkpoint is {latest}. {resume}" if latest else "no earlier checkpoint exists."
        return (f"Nothing saved: the failure came after the optimizer step and before the step was recorded, so the state "
                f"is half-updated; {found}")
    if (reason := checkpoint.unsupported(saved.parts.dist)) is not None:
        return f"Nothing saved: {reason}."
    if step == 0 and latest is not None:  # e.g. a resume that failed before its first step
        return (f"Nothing new saved (no step completed in this process); the checkpoints already saved are unchanged, "
                f"the newest is {latest}. {resume}")
    if step == 0:
        return "Nothing saved (no step had completed); run again once the cause is fixed."
    if latest is None or latest.name != checkpoint.checkpoint_dir(run_dir, step).name:
        latest = checkpoint.save_checkpoint(saved)
    return f"Saved the last good state (after step {step}) to {latest}. {resume}"


def setup_failed(run_dir: Path, error: BaseException) -> RunFailed:
    """A failure before the trainer existed (loading, starting the engine): traceback to the log, a short message."""
    log = write_error_log(run_dir, error)
    return RunFailed(f"run failed before training started: {describe(error)}\nFull traceback: {log}")

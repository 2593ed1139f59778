"""From one agent run's model calls to what the trainer consumes (pure: token ids in, `Trajectory` records out).

Every call the agent made through the endpoint is a `SampledCall` (cohort/agents/chat.py): the exact prompt ids the
engine was given and the engine's trajectory (sampled ids with the stop token kept, log-probs, per-token policy
versions). `run_trajectory(calls, ...)` decides between two shapes:

- **one trajectory** when the run is a chain: every call's prompt starts with the previous call's prompt followed by
  the previous call's sampled ids, token for token (the agent kept its history and the endpoint rendered it without
  re-tokenizing, cohort/agents/chat.py's `Conversation`). The trajectory's prompt is the first call's prompt; its
  completion is everything after: each call's sampled ids (loss mask 1, the engine's log-probs and versions) and,
  between them, the ids the next prompt added (tool results, user turns, the next assistant header: loss mask 0,
  log-prob 0, the version of the call that follows). This is exactly what the in-process tool loop
  (cohort/tools/loop.py) builds for the same tokens.
- **one sample per call** when some call's prompt does not extend the one before (the agent rewrote, trimmed or
  summarised its history): each call is its own sample (its prompt, its sampled ids, loss mask 1). The run's
  trajectory is its last call; the earlier ones ride along as `AgentRun.samples` and become rows of the batch, with
  the run's reward, before it is scored (cohort/trainer/agent_samples.py).

A last call that found the run's budget spent (AgentEngine answers it with nothing sampled, finish_reason "length")
is left out and the run ends "length", as the tool loop ends a trajectory whose tool turn does not fit. A run that
made no call has an empty completion (prompt: the request's prompt), which trains nothing.

The run's record is an `AgentRun` (cohort/agents/engine.py sets it as the trajectory's `episode`), which the layers
that know no connector read through `cohort.rollout.base.EpisodeRecord`: reward functions may name `agent_runs=`
(each trajectory's `AgentRun`), completions.jsonl gets its conversation, status and calls (and a failed episode's
error as `failure`, as the tool loop's failed episodes have it), and the metrics are
`agent/<key>` (the mean over the runs that returned it of each key the agent's dict returned besides `reward`),
`agent/failed` (runs that ended with an error: only an environment's failed episodes get this far,
cohort/agents/verifiers.py), `agent/calls_mean` (model calls per run) and `agent/samples_mean` (trained samples per
run: 1, or its calls when it rewrote its history). A run whose error the agent marked as its episode's only (an agent
object marked `episode_only = True`, verifiers' `VerifiersAgent`) is `failed` in the rollout's sense: scored by
nothing, by the environment's reward and any added `rewards` alike. Any other error reaches the agent reward, which
fails like a reward function (cohort/agents/reward.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Sequence

from cohort.rewards.text import content_text
from cohort.rollout.base import EpisodeRecord, Trajectory
from cohort.tools.parsers import written_calls


@dataclass
class AgentRun(EpisodeRecord, kind="agent_run"):
    """One agent run's record (cohort/agents/engine.py writes it on the run's trajectory as its `episode`): what the
    agent returned (`outcome`: `reward` and its other keys) or why it failed (`error`, status "error" or "timeout"),
    its model calls, the last call's messages and answer (`conversation`), and, when the agent rewrote its history,
    its earlier calls as `samples` (this trajectory is its last call). A run that played several seats (a verifiers
    multi-agent episode: one trace per seat, each with its own reward) has `seats`: one trajectory per seat, each
    carrying its own `AgentRun` (`seat` its name, `outcome` its reward), which the trainer trains in the run's place
    (cohort/trainer/agent_samples.py's `with_seats`)."""

    outcome: dict[str, float] | None = None
    error: str | None = None
    status: str = "ok"  # ok | error | timeout | aborted
    turns: int = 0  # model calls
    conversation: list[dict[str, Any]] = field(default_factory=list)
    samples: list[Trajectory] = field(default_factory=list)
    seat: str | None = None  # this record is one seat of a run: the seat's name
    seats: list[Trajectory] = field(default_factory=list)
    episode_only: bool = False  # the error failed this episode only (an environment's, e.g. verifiers'): scored by nothing
    resumable: ClassVar[bool] = False  # a run cut off by a partial rollout starts over: its program died with the cut

    @property
    def failed(self) -> bool:
        """An episode the environment failed (`episode_only`): no reward function scores it, training goes on."""
        return self.error is not None and self.episode_only

    @property
    def failure_message(self) -> str | None:
        """A failed episode's error (the environment's message; the endpoint's refusal with its fix, when it refused
        one of the run's calls: cohort/agents/engine.py)."""
        return self.error if self.failed else None

    def reward_arguments(self, prompt: Any) -> dict[str, Any]:
        return {"agent_runs": self}

    def completion_fields(self) -> dict[str, Any]:
        """completions.jsonl: the last call's conversation, status and calls, and a failed episode's `failure`."""
        fields = {"conversation": list(self.conversation), "tool_status": self.status, "turns": self.turns}
        return {**fields, "failure": self.error} if self.failed else fields

    @classmethod
    def batch_metrics(cls, records: Sequence[AgentRun]) -> dict[str, float]:
        """The agent runs' metrics (module docstring); {} for no run."""
        if not records:
            return {}
        reported: dict[str, list[float]] = {}
        for run in records:
            for key, value in (run.outcome or {}).items():
                if key != "reward":
                    reported.setdefault(f"agent/{key}", []).append(float(value))
        out = {key: sum(values) / len(values) for key, values in sorted(reported.items())}
        out["agent/failed"] = float(sum(run.error is not None for run in records))
        out["agent/calls_mean"] = sum(run.turns for run in records) / len(records)
        out["agent/samples_mean"] = sum(1 + len(run.samples) for run in records) / len(records)
        out["agent/ignored_calls"] = float(sum(run.ignored_calls for run in records))
        return out

    def unplayed_seat(self, name: str) -> AgentRun:
        """This failed run's record for a seat it never played (`EpisodeRecord.unplayed_seat`)."""
        return replace(self, samples=[], seats=[], seat=name)

    @property
    def ignored_calls(self) -> int:
        """Calls the model wrote that tools.parser did not read: call objects (cohort/tools/parsers.py's
        `written_calls`) in assistant messages the endpoint answered without `tool_calls` (so the agent took them
        for the final answer and never ran them)."""
        return sum(len(written_calls(content_text(m.get("content")))) for m in self.conversation
                   if m.get("role") == "assistant" and not m.get("tool_calls"))

    def to_state(self) -> dict[str, Any]:
        """Plain data: the earlier calls' and the seats' trajectories as they save themselves."""
        return {"outcome": dict(self.outcome) if self.outcome is not None else None, "error": self.error,
                "status": self.status, "turns": self.turns, "conversation": [dict(m) for m in self.conversation],
                "samples": [t.to_state() for t in self.samples], "seat": self.seat,
                "seats": [t.to_state() for t in self.seats], "episode_only": self.episode_only}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> AgentRun:
        return cls(**{**state, "samples": [Trajectory.from_state(t) for t in state["samples"]],
                      "seats": [Trajectory.from_state(t) for t in state["seats"]]})


def is_chain(calls: Sequence) -> bool:
    """Whether every call's prompt is the previous call's prompt + sampled ids, then possibly more."""
    for before, call in zip(calls, calls[1:]):
        head = list(before.prompt_ids) + list(before.trajectory.token_ids)
        if list(call.prompt_ids[: len(head)]) != head:
            return False
    return True


def chain_trajectory(calls: Sequence, request_id: str) -> Trajectory:
    """The calls of a chain (`is_chain`) as one trajectory: prompt = the first call's prompt, then each call's sampled
    ids (mask 1) with the ids the next prompt adds in between (mask 0, log-prob 0, the next call's version)."""
    first = calls[0]
    token_ids: list[int] = []
    logprobs: list[float] = []
    versions: list[int] = []
    mask: list[int] = []
    with_logprobs = all(len(c.trajectory.logprobs) == len(c.trajectory.token_ids) for c in calls)
    for k, call in enumerate(calls):
        t = call.trajectory
        if k:  # what this prompt added after the previous call's prompt + sampled ids (tool results, user turns)
            added = list(call.prompt_ids[len(first.prompt_ids) + len(token_ids):])
            token_ids += added
            logprobs += [0.0] * len(added)
            versions += [t.policy_version] * len(added)
            mask += [0] * len(added)
        token_ids += t.token_ids
        logprobs += t.logprobs if with_logprobs else []
        versions += t.versions
        mask += t.loss_mask
    last = calls[-1].trajectory
    return Trajectory(token_ids, logprobs if with_logprobs else [], last.status, first.trajectory.policy_version, versions,
                      mask, list(first.prompt_ids), request_id, last.error)


def call_samples(calls: Sequence, request_id: str) -> list[Trajectory]:
    """Each call as its own sample (its prompt, its sampled ids); the last keeps `request_id`, the others get
    `<request_id>/call<k>`."""
    out = []
    for k, call in enumerate(calls):
        rid = request_id if k == len(calls) - 1 else f"{request_id}/call{k}"
        out.append(replace(call.trajectory, prompt_ids=list(call.prompt_ids), request_id=rid, episode=None))
    return out


def run_trajectory(calls: Sequence, request_id: str, prompt_ids: Sequence[int], policy_version: int
                   ) -> tuple[Trajectory, list[Trajectory]]:
    """(the run's trajectory, its earlier samples): one chained trajectory and [] for a chain, else the last call and
    the calls before it (module docstring). No call: an empty completion of `prompt_ids`."""
    cut = bool(calls) and not calls[-1].trajectory.token_ids and calls[-1].trajectory.status == "length"
    if cut:  # the last call found the budget spent (nothing sampled): the run ends "length", that prompt not appended
        calls = calls[:-1]
    if not calls:
        return Trajectory([], [], "length" if cut else "stop", policy_version, prompt_ids=list(prompt_ids),
                          request_id=request_id), []
    if is_chain(calls):
        trajectory, samples = chain_trajectory(calls, request_id), []
    else:
        *samples, trajectory = call_samples(calls, request_id)
    return (replace(trajectory, status="length") if cut else trajectory), samples

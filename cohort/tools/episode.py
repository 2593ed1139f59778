"""The tool loop's record of one trajectory (`Episode`, cohort/tools/loop.py writes it as the trajectory's `episode`),
and what the layers that know no connector read from it through `cohort.rollout.base.EpisodeRecord`.

Reward functions receive `conversations=` (the prompt's messages, then the completion's assistant and tool messages
in order; the last is the final answer) and, with an environment, `environments=` (each trajectory's instance, already
closed), when they name those parameters (`Episode.reward_arguments`; cohort/rollout/collect.py makes the calls). A
first observation (what the environment's reset returned) is appended to the prompt the rewards get; an episode whose
environment failed at reset, or whose first observation did not fit the context, is scored by nothing (`failed`).

Metrics (`Episode.batch_metrics`, only when some trajectory went through the tool loop):
- `tools/call_frequency`: tool calls run per trajectory (mean); `tools/failure_frequency`: calls that timed out or
  raised, over calls run (0 with no call); `tools/calls/<name>`: calls of each tool in the batch;
- `tools/timeouts`, `tools/parse_errors`, `tools/argument_errors`: counts in the batch;
- `tools/turns_mean`: assistant turns per trajectory; `tools/status/<status>`: the fraction of trajectories that
  ended with each tool status (ok, truncated, tool_timeout, error);
- `tools/call_forms/<form>`: calls the batch's turns wrote in each form (tagged, fenced, bare: cohort/tools/parsers.py,
  whatever the parser read); `tools/tagged_share`: the tagged ones over all written (0 with none), the share in the
  template's own format; `tools/ignored_calls`: written calls the run's parser did not read (a model that writes
  untagged calls under `tools.parser: hermes`: its calls are counted here, not run); `tools/used_result`: the share
  of trajectories whose final answer quotes a tool's result verbatim (`Episode.used_result`);
- `tools/failed_episodes`: episodes in the batch whose environment failed at reset (or whose first observation did
  not fit the context): scored by nothing, trained on nothing (`Episode.failure`; completions.jsonl's `failure`).

Across a partial rollout's abort the record is saved without its environment instance (a resumed trajectory gets a
fresh one, cohort/tools/loop.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from cohort.rollout.base import EpisodeRecord
from cohort.tools.parsers import CALL_FORMS

TOOL_STATUSES = ("ok", "truncated", "tool_timeout", "error")  # in rising severity


@dataclass
class Episode(EpisodeRecord, kind="tool_loop", unmarked=True):
    """One trajectory's multi-turn record: the conversation, the environment instance, the tool status and counts.
    `segments`: (start, end, role) token ranges of the completion, role "assistant" or "tool". (Saved records of
    checkpoints from before records named their kind are this kind's: `unmarked`.)"""

    conversation: list[dict[str, Any]] = field(default_factory=list)
    environment: Any = None
    status: str = "ok"
    turns: int = 0
    calls: Counter = field(default_factory=Counter)  # tool name -> calls run
    failed_calls: int = 0  # calls that timed out or raised
    timeouts: int = 0
    parse_errors: int = 0
    argument_errors: int = 0  # unknown tool, missing or unexpected arguments
    call_forms: Counter = field(default_factory=Counter)  # form -> calls written (cohort/tools/parsers.py's CALL_FORMS)
    ignored_calls: int = 0  # calls written that the parser did not read
    segments: list[tuple[int, int, str]] = field(default_factory=list)
    observation: str | None = None  # what the environment's reset returned: appended to the prompt (`with_observation`)
    failure: str | None = None  # why the episode failed (reset raised, or its prompt passed the context): scored by nothing

    def mark(self, status: str) -> None:
        if TOOL_STATUSES.index(status) > TOOL_STATUSES.index(self.status):
            self.status = status

    @property
    def failed(self) -> bool:
        return self.failure is not None

    @property
    def failure_message(self) -> str | None:
        return self.failure

    @property
    def used_result(self) -> bool:
        """The final answer (the last message, an assistant turn) quotes a tool's result verbatim: a successful call's
        answer (not an error) appears in its text, as a calculator's "5535" in "123*45 = 5535"."""
        results = [m["content"].strip() for m in self.conversation
                   if m["role"] == "tool" and m.get("name") not in ("reset", "close") and not m["content"].startswith("error")
                   and not m["content"].startswith('{"error"')]
        last = self.conversation[-1] if self.conversation else None
        return last is not None and last["role"] == "assistant" and any(r and r in last["content"] for r in results)

    def reward_arguments(self, prompt: Any) -> dict[str, Any]:
        """`conversations`: the prompt as the model saw it (a text prompt as one user message), then the completion's
        assistant and tool turns; with an environment, `environments`: its instance."""
        head = list(prompt) if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        out: dict[str, Any] = {"conversations": head + self.conversation}
        if self.environment is not None:
            out["environments"] = self.environment
        return out

    def completion_fields(self) -> dict[str, Any]:
        """completions.jsonl: the conversation (assistant and tool turns), tool status and turns, the calls written by
        form and those the parser ignored (when any), and with an environment what its reset showed the model
        (`observation`) or why the episode failed (`failure`)."""
        extra = {"observation": self.observation, "failure": self.failure,
                 "call_forms": dict(self.call_forms) or None, "ignored_calls": self.ignored_calls or None}
        return {"conversation": list(self.conversation), "tool_status": self.status, "turns": self.turns,
                **{k: v for k, v in extra.items() if v is not None}}

    def completion_messages(self) -> list[dict[str, Any]] | None:
        """The conversation's assistant and tool messages (TRL's `completions` of a tool run: an assistant turn that
        called a tool carries its calls in `tool_calls` and the text outside them as `content`); None before any
        assistant turn."""
        if not any(m["role"] == "assistant" for m in self.conversation):
            return None
        return [dict(m) for m in self.conversation if m["role"] in ("assistant", "tool")]

    @classmethod
    def batch_metrics(cls, records: Sequence[Episode]) -> dict[str, float]:
        """The tool metrics of a batch's episodes (module docstring)."""
        n = len(records)
        if not n:
            return {}
        calls: Counter = Counter()
        for e in records:
            calls.update(e.calls)
        total = sum(calls.values())
        out = {
            "tools/call_frequency": total / n,
            "tools/failure_frequency": sum(e.failed_calls for e in records) / total if total else 0.0,
            "tools/timeouts": float(sum(e.timeouts for e in records)),
            "tools/parse_errors": float(sum(e.parse_errors for e in records)),
            "tools/argument_errors": float(sum(e.argument_errors for e in records)),
            "tools/turns_mean": sum(e.turns for e in records) / n,
            "tools/failed_episodes": float(sum(e.failure is not None for e in records)),
            "tools/ignored_calls": float(sum(e.ignored_calls for e in records)),
            "tools/used_result": sum(e.used_result for e in records) / n,
        }
        forms: Counter = Counter()
        for e in records:
            forms.update(e.call_forms)
        written = sum(forms.values())
        out.update({f"tools/call_forms/{form}": float(forms[form]) for form in CALL_FORMS})
        out["tools/tagged_share"] = forms["tagged"] / written if written else 0.0
        out.update({f"tools/calls/{name}": float(count) for name, count in sorted(calls.items())})
        out.update({f"tools/status/{s}": sum(e.status == s for e in records) / n for s in TOOL_STATUSES})
        return out

    def to_state(self) -> dict[str, Any]:
        """Every field as plain data but the environment instance (left out: a resumed episode gets a fresh one)."""
        return {"conversation": [dict(m) for m in self.conversation], "environment": None, "status": self.status,
                "turns": self.turns, "calls": dict(self.calls), "failed_calls": self.failed_calls,
                "timeouts": self.timeouts, "parse_errors": self.parse_errors, "argument_errors": self.argument_errors,
                "segments": [list(x) for x in self.segments], "observation": self.observation, "failure": self.failure,
                "call_forms": dict(self.call_forms), "ignored_calls": self.ignored_calls}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Episode:
        return cls(**{**state, "calls": Counter(state["calls"]), "segments": [tuple(x) for x in state["segments"]],
                      "call_forms": Counter(state.get("call_forms", {}))})  # (saved before forms were counted: none)

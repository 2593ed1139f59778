"""Warnings while a run trains: the metric that looks wrong, its value, and what to try.

`Diagnostics.observe(step, metrics)` reads one step's metrics and returns the
warnings that became due. Each rule needs its condition to hold for a few
observations in a row (`patience`, counted over the steps where the metric is
logged: generation-batch metrics appear only on the step that generated), warns
once, and re-arms only after the condition has cleared, so a long bad stretch
gives one line, not one per step. The driver prints each warning through the
metrics logger and appends it to `warnings.jsonl`.

The rules and their thresholds (module constants, documented in docs/runs.md):

- `frac_reward_zero_std` > 0.9: most groups got identical rewards, so they have
  zero advantage and teach nothing (the task is too easy or too hard). Not under
  on-policy distillation (`teacher_signal`): the teacher gives every token an
  advantage whatever the rewards.
- `completions/clipped_ratio` > 0.5: most completions hit max_completion_length.
- `mismatch/logprob_abs_max` > 1.0 nats: the trainer and the rollout engine
  disagree about some sampled token's log-prob by more than a factor e.
- `timing/reward_s` is the largest phase of the step: reward functions, not the
  model, bound the speed of the run.
- `answers/top_share` >= 0.5 and at least 0.1 above the references' own (the
  mean of `answers/reference_top_share` over the batches so far): one answer is
  half of what the policy says, more than the task's answer prior explains. The
  policy is collapsing onto the prior (a constant answer that pays), the signature
  of a gain that is not the skill (docs/runs.md). The answers/* metrics come from
  the first reward function's answers (cohort/rewards/answer_reading.py); a task
  whose answers cannot be read logs none and this rule stays silent.
- `tools/ignored_calls` > 0, at once (no patience): the model wrote tool calls that `tools.parser` does not read
  (a `{"name", "arguments"}` object in a fenced block or bare, under `hermes`), so they never ran; the line says
  how many of each form and names the parser that reads them (`json`).

Left out: stopping the run on a warning (a NaN stops it: cohort.trainer.stopping)
and thresholds per config field (these are advisories, not contracts).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Callable

ZERO_STD_THRESHOLD = 0.9
CLIPPED_THRESHOLD = 0.5
MISMATCH_THRESHOLD = 1.0
COLLAPSE_SHARE = 0.5  # one answer is at least half of the batch's completions ...
COLLAPSE_MARGIN = 0.1  # ... and at least this much above the references' own top share
PATIENCE = 3
PHASE_KEY = re.compile(r"^timing/([a-z_]+)_s$")  # timing/generate_s; not timing/step_s, not timing/reward/<fn>_s


@dataclass(frozen=True)
class RunWarning:
    step: int
    kind: str
    metric: str
    value: float
    message: str

    @property
    def text(self) -> str:
        return f"warning at step {self.step} [{self.kind}]: {self.message}"

    def record(self) -> dict:
        return asdict(self)


@dataclass
class _Rule:
    kind: str
    metric: str
    check: Callable[[dict], float | None]  # the value when the condition holds, None when it does not, or skip
    advise: Callable[[float, dict], str]
    streak: int = 0
    fired: bool = False
    patience: int | None = None  # observations in a row before it warns; None: the Diagnostics' own


def _above(metric: str, threshold: float) -> Callable[[dict], float | None]:
    def check(metrics: dict) -> float | None:
        value = metrics.get(metric)
        if not isinstance(value, (int, float)) or math.isnan(value):
            return math.nan  # not logged this step: neither extends nor breaks the streak
        return float(value) if value > threshold else None

    return check


def _reward_phase_slowest(metrics: dict) -> float | None:
    phases = {m.group(1): float(v) for k, v in metrics.items() if (m := PHASE_KEY.match(k)) and isinstance(v, (int, float))}
    phases.pop("step", None)
    if "reward" not in phases or len(phases) < 2:
        return math.nan
    slowest = max(phases, key=phases.get)
    return phases["reward"] if slowest == "reward" else None


class _AnswerCollapse:
    """The `answer_collapse` check: `answers/top_share` against the mean reference top share of the batches so far
    (one batch's is noisy: 8 prompts of a task whose key is "1" 57% of the time often hold 6 or 7)."""

    def __init__(self):
        self.reference_shares: list[float] = []
        self.first_distinct: float | None = None

    def __call__(self, metrics: dict) -> float | None:
        share, reference = metrics.get("answers/top_share"), metrics.get("answers/reference_top_share")
        if not isinstance(share, (int, float)) or math.isnan(share):
            return math.nan
        if isinstance(reference, (int, float)) and not math.isnan(reference):
            self.reference_shares.append(float(reference))
        distinct = metrics.get("answers/distinct_per_group")
        if self.first_distinct is None and isinstance(distinct, (int, float)):
            self.first_distinct = float(distinct)
        return float(share) if share >= max(COLLAPSE_SHARE, self.prior() + COLLAPSE_MARGIN) else None

    def prior(self) -> float:
        """The references' mean top share so far (0 when the references were never read)."""
        return sum(self.reference_shares) / len(self.reference_shares) if self.reference_shares else 0.0

    def advise(self, value: float, metrics: dict) -> str:
        distinct = _if_logged(metrics, "answers/distinct_per_group", "{:.2g} distinct answers per group")
        was = f" (was {self.first_distinct:.2g} on the first batch)" if distinct and self.first_distinct is not None else ""
        zero = _if_logged(metrics, "frac_reward_zero_std", "; {:.0%} of the groups without signal (frac_reward_zero_std)")
        return (f"answers/top_share = {value:.2f}: one answer is {value:.0%} of the completions for {PATIENCE} generation "
                f"batches, while the most common reference answer is {self.prior():.0%} of them; {distinct}{was}{zero}. The "
                "policy is collapsing onto the answer prior: a constant answer pays, and a rising reward here is not the "
                "task learned (read the eval's accuracy beyond the two most common answers). Try more exploration where "
                "groups carry no signal (a larger rollout.num_generations, a higher rollout.temperature), "
                "pipeline.dynamic_sampling=true (refills all-equal groups), training rows balanced by answer so that "
                "no constant answer pays (data.max_answer_share), or, for a task whose scorer gives partial credit, data.task_credit=full "
                "(no partial credit for an answer that merely contains the key)")


class Diagnostics:
    def __init__(self, *, max_completion_length: int, patience: int = PATIENCE, teacher_signal: bool = False):
        self.patience = patience
        zero_std = _Rule("reward_zero_std", "frac_reward_zero_std", _above("frac_reward_zero_std", ZERO_STD_THRESHOLD),
                         _advise_zero_std)
        self.rules = [
            *([] if teacher_signal else [zero_std]),  # (distill: constant-reward groups still learn from the teacher)
            _Rule("length_limit", "completions/clipped_ratio", _above("completions/clipped_ratio", CLIPPED_THRESHOLD),
                  lambda v, m: _advise_length(v, max_completion_length)),
            _Rule("logprob_mismatch", "mismatch/logprob_abs_max", _above("mismatch/logprob_abs_max", MISMATCH_THRESHOLD),
                  _advise_mismatch),
            _Rule("slow_reward", "timing/reward_s", _reward_phase_slowest, _advise_slow_reward),
            _Rule("answer_collapse", "answers/top_share", collapse := _AnswerCollapse(), collapse.advise),
            _Rule("ignored_calls", "tools/ignored_calls", _above("tools/ignored_calls", 0.0), _advise_ignored_calls,
                  patience=1),
            _Rule("ignored_calls", "agent/ignored_calls", _above("agent/ignored_calls", 0.0), _advise_ignored_calls,
                  patience=1),  # (the same through the agent endpoint: its answers held calls it did not read)
        ]

    def observe(self, step: int, metrics: dict) -> list[RunWarning]:
        due = []
        for rule in self.rules:
            value = rule.check(metrics)
            if value is not None and math.isnan(value):
                continue
            if value is None:
                rule.streak, rule.fired = 0, False
                continue
            rule.streak += 1
            if rule.streak >= (rule.patience or self.patience) and not rule.fired:
                rule.fired = True
                due.append(RunWarning(step, rule.kind, rule.metric, value, rule.advise(value, metrics)))
        return due


def _if_logged(metrics: dict, key: str, template: str) -> str:
    """``template`` formatted with ``metrics[key]`` where that metric is a number this step, else ""."""
    value = metrics.get(key)
    return template.format(value) if isinstance(value, (int, float)) else ""


def _advise_zero_std(value: float, metrics: dict) -> str:
    level = _if_logged(metrics, "reward", "mean reward {:.3g}; ")
    return (f"frac_reward_zero_std = {value:.2f} (> {ZERO_STD_THRESHOLD}) for {PATIENCE} generation batches: most groups scored "
            f"all-equal rewards, which give zero advantage and no gradient ({level}all at the top: the task is too easy; all at "
            "the bottom: too hard). Use harder or easier prompts, a reward with partial credit, or more completions per prompt "
            "(rollout.num_generations)")


def _advise_length(value: float, limit: int) -> str:
    return (f"completions/clipped_ratio = {value:.2f} (> {CLIPPED_THRESHOLD}) for {PATIENCE} generation batches: most completions "
            f"stop at rollout.max_completion_length = {limit} tokens. Raise it, penalise length (the soft_overlong reward), or "
            "leave truncated completions out of the loss (algorithm.mask_truncated_completions=true)")


def _advise_mismatch(value: float, metrics: dict) -> str:
    mean_text = _if_logged(metrics, "mismatch/logprob_abs_mean", " (mean {:.3g})")
    return (f"mismatch/logprob_abs_max = {value:.3g} nats (> {MISMATCH_THRESHOLD}){mean_text}: the rollout engine and the trainer "
            "disagree about the log-probability of sampled tokens, so the engine samples from a different policy than the one "
            "trained. Generate in the training dtype (engine.dtype=auto), check that sampling settings (temperature, top_p, "
            "top_k) are what the trainer assumes, or correct with importance weights")


def _advise_ignored_calls(value: float, metrics: dict) -> str:
    forms = ", ".join(f"{form} {metrics[f'tools/call_forms/{form}']:g}" for form in ("tagged", "fenced", "bare")
                      if metrics.get(f"tools/call_forms/{form}"))
    metric = "tools/ignored_calls" if metrics.get("tools/ignored_calls") else "agent/ignored_calls"
    return (f"{metric} = {value:g}: the model wrote {value:g} tool call(s) that tools.parser does not read, so "
            f"they never ran (calls written this batch by form: {forms or 'none'}). A model that writes the template's "
            '{"name", "arguments"} object without its <tool_call> tags (in a ``` block or bare) needs tools.parser: json '
            "(docs/tools.md, \"A real model's calls\")")


def _advise_slow_reward(value: float, metrics: dict) -> str:
    share = _if_logged(metrics, "timing/step_s", " of a {:.3g} s step")
    return (f"timing/reward_s = {value:.3g} s{share} is the slowest phase for {PATIENCE} generation batches: the reward "
            "functions, not the model, bound the run's speed. Make them async or vectorised, cache repeated work, or run "
            "expensive checks (code execution) with more parallel workers")

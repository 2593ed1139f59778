"""The weight-sync check: after each push, does the rollout engine hold the policy the trainer holds?

Two sets of kernels never agree to the last bit. In float32 the engine's and
the trainer's log-probs of the same tokens differ by ~5e-7 nats; in bfloat16 by
~4e-3 on average and up to ~0.1 on single tokens, and that noise grows, not
shrinks, as training sharpens the model. A fixed bound on the largest per-token gap is
therefore either too tight for bfloat16 (every run dies: the issue that
motivated this module) or too loose to catch a stale engine in float32. So the
check calibrates itself:

1. Canaries: completions of the first generation batch (one per group first,
   up to CANARY_TOKENS tokens, CANARY_TOKENS_FLOAT32 when both sides compute in float32), sampled by the model itself, so they sit where
   the policy puts its mass; engines score them in one batched call.
2. Noise floor: while the engine and the trainer provably hold the same weights
   (the first batch, sampled at the trainer's current version), both score the
   canaries; the mean and root-mean-square per-token gaps are the floor.
3. The floor moves: bf16 noise grows as training sharpens the model. Under
   mixed precision the trainer also scores the canaries in float32; its own
   bf16-vs-float32 gap (its "sensitivity" to rounding) grows with the
   engine's noise, so the floor is stretched by sensitivity now / at
   calibration (never shrunk). That needs no engine, so a stale engine cannot
   stretch its own bound.
4. After each push, `judge` applies two tests to the per-token vectors
   engine (e), trainer now (t) and trainer at the last verified sync (p):
   - closeness: mean |e − t| ≤ max(FLOOR_MULTIPLE × floor mean × stretch,
     MIN_GAP_NATS, or the larger `min_gap` a LoRA run passes). An engine that missed a layer or the tied head drifts
     past it.
   - following: when the update moved the canaries clearly (rms |t − p| ≥
     FOLLOW_SIGNAL × floor rms × stretch), the engine must have moved with it: the
     projection of e − p on t − p, divided by |t − p|², is 1 for an engine that
     took the update and 0 for one that kept the old weights. Noise moves it by
     at most rms(noise) / rms(t − p) ≤ 1 / FOLLOW_SIGNAL (Cauchy–Schwarz), so
     requiring ≥ FOLLOW_MIN is safe, and a stale engine fails even when the
     update is smaller than the closeness bound. The bound holds only if the
     noise at this sync is as spread as the floor's; bf16 noise has outlier
     tokens (one canary token 3.7 nats off while the mean gap stayed ≤ 0.03,
     in a 300-step bf16 run on tiny:arith_chat, pulled the projection to 43%
     and stopped a healthy run). So the projection leaves out the
     FOLLOW_TRIM fraction of tokens with the largest |e − t|: for a fresh
     engine those are the noise outliers; for a stale one the remaining tokens
     still moved with the update and it still scores ~0%.

`engine.sync_check_tolerance`, when a user sets it, keeps its old meaning: the
largest per-token gap must not exceed it (no calibration, no following test).

What it cannot see: an update too small to rise above the noise (a stale engine
then also samples what the fresh one would, up to that noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CANARY_TOKENS = 512  # canary completions are added (one per group, then second members, ...) until this many tokens...
CANARY_TOKENS_FLOAT32 = 128  # ...when engine and trainer both compute in float32: the floor is ~5e-7 nats and a stale
# engine's gap orders of magnitude above it, so a quarter of the tokens judges the same (bf16's heavy-tailed noise needs
# the 512); the canaries cost 20% of a small model's step (bench/profile_step.py, tiny workload) at 512
CANARY_MAX = 256  # ...or this many completions
FLOOR_MULTIPLE = 4.0  # closeness: mean gap at most this many times the calibrated floor...
MIN_GAP_NATS = 1e-5  # ...and never less than this (float32 floors are ~5e-7 here; a mean over a few hundred tokens wobbles)
FOLLOW_SIGNAL = 5.0  # following test only when the update moved the canaries by this many noise rms...
FOLLOW_NOISE_MIN = 1e-6  # ...counting the noise as at least this (a float32 floor measured on few tokens can read ~1e-8)
FOLLOW_MIN = 0.5  # the engine must have taken at least half of the update (1.0: all of it; noise: ±1/FOLLOW_SIGNAL)
FOLLOW_TRIM = 0.05  # the projection leaves out this fraction of tokens, those with the largest engine-trainer gap


def canary_tokens(engine_dtype: str, compute_dtype: torch.dtype) -> int:
    """The canary budget for an engine generating in `engine_dtype` and a trainer computing in `compute_dtype`."""
    return CANARY_TOKENS_FLOAT32 if engine_dtype == "float32" and compute_dtype == torch.float32 else CANARY_TOKENS


class SyncCheckError(RuntimeError):
    """The engine does not hold the weights the trainer pushed."""


@dataclass(frozen=True)
class Verdict:
    ok: bool
    gap_mean: float  # mean |engine − trainer| per canary token, nats
    gap_max: float  # largest per-token gap, nats
    bound: float  # the bound the deciding statistic was held to
    followed: float | None  # fraction of the update the engine took (None: update too small to tell)
    reason: str  # why it failed ("" when ok)


def judge(engine: torch.Tensor, trainer: torch.Tensor, previous: torch.Tensor | None, *, floor_mean: float,
          floor_rms: float, noise_scale: float = 1.0, fixed_tolerance: float | None = None,
          min_gap: float = MIN_GAP_NATS) -> Verdict:
    """Decide one sync from flat (M,) per-token log-probs of the canaries (module docstring for the two tests).

    `noise_scale` (>= 1) stretches the calibrated floor by how much more sensitive to rounding the weights have become
    since calibration (`SyncCheck.check`)."""
    gap = (engine - trainer).abs()  # (M,)
    gap_mean, gap_max = float(gap.mean()), float(gap.max())
    if fixed_tolerance is not None:
        ok = gap_max <= fixed_tolerance
        return Verdict(ok, gap_mean, gap_max, fixed_tolerance, None,
                       "" if ok else f"the largest per-token gap {gap_max:.3g} > engine.sync_check_tolerance = {fixed_tolerance:g}")
    bound = max(FLOOR_MULTIPLE * floor_mean * noise_scale, min_gap)
    followed = None
    if previous is not None:
        keep = gap.argsort()[: gap.numel() - int(FOLLOW_TRIM * gap.numel())]  # noise outliers out (module docstring)
        step = (trainer - previous)[keep]  # how the update moved the canaries
        signal = float(step.pow(2).mean().sqrt())
        if signal >= FOLLOW_SIGNAL * max(floor_rms * noise_scale, FOLLOW_NOISE_MIN):
            followed = float(((engine - previous)[keep] * step).sum() / step.pow(2).sum())
    if not gap_mean <= bound:
        return Verdict(False, gap_mean, gap_max, bound, followed,
                       f"the mean per-token gap {gap_mean:.3g} > {bound:.3g} ({FLOOR_MULTIPLE:g} × the noise floor "
                       f"{floor_mean:.3g} measured when both held the same weights, × {noise_scale:.2g} for the weights' "
                       "sensitivity to rounding since)")
    if followed is not None and not followed >= FOLLOW_MIN:
        return Verdict(False, gap_mean, gap_max, bound, followed,
                       f"the engine took {followed:.0%} of the update's change to the canaries' log-probs (a fresh engine "
                       f"takes ~100%, a stale one ~0%)")
    return Verdict(True, gap_mean, gap_max, bound, followed, "")


def noise_floor(engine: torch.Tensor, trainer: torch.Tensor) -> tuple[float, float]:
    """(mean, rms) per-token gap between two scorings of the same tokens under the same weights."""
    gap = engine - trainer
    return float(gap.abs().mean()), float(gap.pow(2).mean().sqrt())


class SyncCheck:
    """The canaries, their noise floor and the trainer's log-probs at the last verified sync (saved in checkpoints)."""

    def __init__(self, fixed_tolerance: float | None = None, min_gap: float = MIN_GAP_NATS):
        self.min_gap = min_gap  # the closeness bound's floor in nats (LoRA runs pass a larger one: trainer/lora_sync.py)
        self.fixed_tolerance = fixed_tolerance  # engine.sync_check_tolerance (None: calibrated)
        self.canaries: list[tuple[list[int], list[int]]] = []  # (prompt ids, completion ids)
        self.floor: tuple[float, float] | None = None  # (mean, rms) per-token gap at calibration
        self.sensitivity: float | None = None  # the trainer's own low-precision vs float32 gap at calibration (mixed only)
        self.previous: list[float] | None = None  # trainer log-probs of the canary tokens at the last verified sync

    @property
    def ready(self) -> bool:
        """Whether a push can be checked (calibrated, or a fixed tolerance with canaries)."""
        return bool(self.canaries) and (self.floor is not None or self.fixed_tolerance is not None)

    def choose(self, prompts: list[list[int]], completions: list[list[int]], group_size: int, *,
               tokens: int = CANARY_TOKENS, limit: int = CANARY_MAX) -> None:
        """Non-empty completions, the first member of each group, then the second, ..., until `tokens` tokens or `limit`."""
        group_size = max(1, group_size)
        order = sorted(range(len(completions)), key=lambda i: (i % group_size, i // group_size))  # member rank, then group
        picks, total = [], 0
        for i in order:
            if total >= tokens or len(picks) >= limit:
                break
            if completions[i]:
                picks.append((list(prompts[i]), list(completions[i])))
                total += len(completions[i])
        self.canaries = picks

    def calibrate(self, engine: torch.Tensor, trainer: torch.Tensor, sensitivity: float | None = None) -> dict[str, float]:
        """Record the floor from a scoring under identical weights; flat (M,) tensors over every canary token.

        `sensitivity`: mean |trainer in low precision − trainer in float32| over the same tokens (None when the
        trainer computes in float32), the yardstick `check` uses to follow the floor as training moves the weights."""
        self.floor = noise_floor(engine, trainer)
        self.sensitivity = sensitivity
        self.previous = trainer.tolist()
        return {"sync/canary_floor": self.floor[0]}

    def noise_scale(self, sensitivity: float | None) -> float:
        """How much the floor has grown since calibration: the ratio of the trainer's own rounding sensitivity now to
        then, never below 1. bf16 noise grows as training sharpens the model (measured over 1,000 demo syncs: the
        engine/trainer gap 2.3× the starting floor at the median, 6.7× at worst), and the trainer's own
        bf16-vs-float32 gap grows with it (their ratio stayed within 0.8–1.6 over 300 steps; docs/runs.md)."""
        if not sensitivity or not self.sensitivity:
            return 1.0
        return max(1.0, sensitivity / self.sensitivity)

    def check(self, version: int, engine: torch.Tensor, trainer: torch.Tensor, sensitivity: float | None = None) -> dict[str, float]:
        """Judge a push; raise SyncCheckError naming the statistic, else remember the trainer's log-probs."""
        floor_mean, floor_rms = self.floor or (math.nan, math.nan)
        previous = torch.tensor(self.previous, device=trainer.device) if self.previous is not None else None
        scale = self.noise_scale(sensitivity)
        verdict = judge(engine, trainer, previous, floor_mean=floor_mean, floor_rms=floor_rms, noise_scale=scale,
                        fixed_tolerance=self.fixed_tolerance, min_gap=self.min_gap)
        if not verdict.ok:
            raise SyncCheckError(
                f"weight sync check failed at policy version {version}: {verdict.reason}. The rollout engine would sample "
                "from a policy other than the one being trained (a weight that was not pushed, or pushed under another "
                "name). If this is noise from a change of kernels, set engine.sync_check_tolerance to a fixed bound "
                "on the largest per-token gap in nats")
        self.previous = trainer.tolist()
        metrics = {"sync/canary_gap_mean": verdict.gap_mean, "sync/canary_gap_max": verdict.gap_max, "sync/noise_scale": scale}
        if verdict.followed is not None:
            metrics["sync/canary_followed"] = verdict.followed
        return metrics

    def state_dict(self) -> dict:
        return {"canaries": self.canaries, "floor": self.floor, "sensitivity": self.sensitivity, "previous": self.previous}

    def load_state_dict(self, state: dict) -> None:
        self.canaries = [(list(p), list(c)) for p, c in state["canaries"]]
        self.floor = tuple(state["floor"]) if state["floor"] is not None else None
        self.sensitivity = state.get("sensitivity")
        self.previous = state["previous"]

"""Weight sync: push the policy into the rollout engine, score the canaries on both sides, calibrate and judge.

`WeightSync` is the Trainer's one object for it (the Trainer calls `push` before each generation and at the end of a
generation batch, and `calibrate` after each collection):
- `push`: when the policy changed since the last push, its weights go to the engine as a stream (each tensor cast to
  the engine's dtype, merged under LoRA, made when the engine reads it: never a whole copy at once), between two of the
  engine's steps when requests are in flight (a staleness bound k >= 1); an engine that generates with the policy
  module itself (transformers, colocated) only learns the new version. Then the canaries are scored by the engine and
  the trainer, and the pair judged (`SyncCheck.check`, cohort/trainer/sync_check.py, which holds the statistics).
  Under LoRA the engine must also show the adapter's change to the canaries (cohort/trainer/lora_sync.py).
- `calibrate`: the first batch's completions become the canaries, and the noise floor is measured once engine and
  trainer provably hold the same weights (the batch sampled at the trainer's version, already pushed).
- the last check's statistics (`metrics`, `last_canary_gap`) and the bytes a rollout server reports receiving
  (`bytes_sent`) are reported with the next step (`pop_metrics`).

It reads the trainer's parts (policy, adapter, precision, engine, device) from `TrainerParts` and the versions from
`TrainerState`, whose `synced_version` it alone advances. Its timer is the step's `sync` phase. Saved in checkpoints:
`check`, the `SyncCheck` (canaries, floor, last verified log-probs), under the name `sync_check`.
"""

from __future__ import annotations

import torch

from cohort.models.batching import pack_right_padded
from cohort.models.logprobs import completion_logprobs
from cohort.models.precision import DTYPES, float32_weights
from cohort.rollout.base import EngineLock, WeightStream
from cohort.trainer.lora_sync import LORA_MIN_GAP_NATS, adapter_effect
from cohort.trainer.parts import TrainerParts
from cohort.trainer.phases import Phases
from cohort.trainer.state import TrainerState
from cohort.trainer.sync_check import MIN_GAP_NATS, SyncCheck, canary_tokens


class WeightSync:
    """The engine's copy of the policy kept current and checked (module docstring)."""

    def __init__(self, parts: TrainerParts, state: TrainerState, lock: EngineLock, phases: Phases, *,
                 generation_dtype: str, group_size: int, fixed_tolerance: float | None):
        self.parts, self.state, self.lock, self.phases = parts, state, lock, phases  # lock: the rollout scheduler's
        self.generation_dtype = generation_dtype  # the engine's dtype (cfg.generation_dtype): what a push casts to
        self.group_size = group_size  # completions per prompt: canaries are picked one per group first
        self.check = SyncCheck(fixed_tolerance,  # canaries + noise floor (engine.sync_check_tolerance; checkpointed)
                               min_gap=LORA_MIN_GAP_NATS if parts.lora is not None else MIN_GAP_NATS)
        self.metrics: dict[str, float] = {}  # the last sync check's statistics, reported with the next step
        self.last_canary_gap: float | None = None  # largest per-token canary gap at the last sync, nats
        self.bytes_sent = 0.0  # bytes the engine reports receiving since the last step's metrics (server mode)

    def push(self) -> None:
        """Push the policy into the engine if it changed since the last push, then check the canaries.

        With requests in flight (a staleness bound k >= 1) the engine loads them between two of its steps."""
        state, parts = self.state, self.parts
        if state.synced_version == state.policy_version:
            return
        with self.phases("sync"), self.lock:  # (asynchronous: between two of the engine's steps)
            if parts.engine_shares_policy:
                parts.engine.update_weights((), state.policy_version)  # nothing to copy: only the version its tokens carry
            else:
                self.bytes_sent += float(self._send() or 0)
                # the canaries are scored beside requests in flight by engines that take in-flight updates; the tokens
                # sampled under the new weights are also checked when they are trained (mismatch/*)
                if self.check.ready and (not parts.engine.in_flight or getattr(parts.engine, "in_flight_updates", False)):
                    self._check_push()
        state.synced_version = state.policy_version

    def _send(self):
        """update_weights with the policy as a stream (merged under LoRA, cast to the engine's dtype); in flight when
        requests are (a staleness bound k >= 1). Returns what the engine returns (a server: the bytes sent)."""
        parts, dtype = self.parts, DTYPES[self.generation_dtype]  # the engine's copy: bfloat16 from float32 masters, say
        weights = parts.lora.merged_weights if parts.lora is not None else parts.policy.named_parameters
        stream = WeightStream(lambda: ((name, p.detach().to(dtype)) for name, p in weights()))
        in_flight = {"in_flight": True} if parts.engine.in_flight else {}
        return parts.engine.update_weights(stream, self.state.policy_version, **in_flight)

    def _check_push(self) -> None:
        """Judge the push by the canaries (raises SyncCheckError); under LoRA, also the adapter's effect."""
        engine, trainer, sensitivity = self.canary_logprobs()
        self.metrics.update(self.check.check(self.state.policy_version, engine, trainer, sensitivity))
        self.last_canary_gap = self.metrics["sync/canary_gap_max"]
        if self.parts.lora is not None:  # LoRA: the engine must hold the adapter, not the base (trainer/lora_sync.py)
            floor = self.check.floor
            self.metrics.update(adapter_effect(engine, trainer, self._base_canary_logprobs(),
                                               floor_rms=floor[1] if floor else 0.0))

    def canary_logprobs(self) -> tuple[torch.Tensor, torch.Tensor, float | None]:
        """Flat (M,) log-probs of every canary token, the engine's and the trainer's (temperature 1), and under mixed
        precision the trainer's own rounding sensitivity: mean |its autocast log-probs − its float32 ones|."""
        parts, canaries = self.parts, self.check.canaries
        engine = parts.engine.score([p for p, _ in canaries], [c for _, c in canaries], 1.0)
        trainer = self._trainer_logprobs(parts.precision.autocast())
        sensitivity = None
        if parts.precision.mixed:  # the same weights in float32 (a LoRA base held in bf16: upcast one module at a time)
            sensitivity = float((trainer - self._trainer_logprobs(float32_weights(parts.policy))).abs().mean())
        return torch.tensor([x for row in engine for x in row], dtype=torch.float32, device=parts.device), trainer, sensitivity

    def _base_canary_logprobs(self) -> torch.Tensor:
        """Flat (M,) log-probs of the canary tokens under the base model (the LoRA adapter disabled), temperature 1."""
        parts = self.parts
        with parts.lora.adapter_disabled():
            return self._trainer_logprobs(parts.precision.autocast())

    def _trainer_logprobs(self, context) -> torch.Tensor:
        """Flat (M,) log-probs of the canary tokens under the policy, inside `context` (an autocast), temperature 1."""
        parts, canaries = self.parts, self.check.canaries
        packed = pack_right_padded([p for p, _ in canaries], [c for _, c in canaries], parts.pad_id, parts.device)
        with torch.no_grad(), context:
            logp, _ = completion_logprobs(parts.policy, packed.input_ids, packed.attention_mask, packed.prompt_lengths,
                                          packed.completion_ids, packed.completion_mask, temperature=1.0)
        return torch.cat([logp[row, : len(completion)].float() for row, (_, completion) in enumerate(canaries)])

    def calibrate(self, sampled_version: int, prompts: list[list[int]], outs) -> None:
        """Pick the canaries from the first batch and measure the noise floor while engine and trainer provably agree.
        Engine calls only while there is something to do: each waits for a driver thread's poll in progress."""
        check = self.check
        if self.parts.engine_shares_policy or check.floor is not None or (check.canaries and check.fixed_tolerance is not None):
            return
        with self.lock:  # (a driver thread polls between engine calls, never during one)
            if not check.canaries:
                check.choose(prompts, [o.token_ids for o in outs], self.group_size,
                             tokens=canary_tokens(self.generation_dtype, self.parts.precision.compute_dtype))
            same_weights = sampled_version == self.state.policy_version == self.state.synced_version
            if check.canaries and same_weights and check.fixed_tolerance is None:
                with self.phases("sync"):
                    self.metrics.update(check.calibrate(*self.canary_logprobs()))

    def pop_metrics(self) -> dict[str, float]:
        """What the pushes since the last call report: sync/bytes_sent (when the engine sent any) and the last check's
        statistics; both start again from nothing."""
        out = {"sync/bytes_sent": self.bytes_sent} if self.bytes_sent else {}
        out.update(self.metrics)
        self.bytes_sent, self.metrics = 0.0, {}
        return out

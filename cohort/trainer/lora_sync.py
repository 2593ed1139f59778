"""The LoRA half of the weight-sync check: does the engine sample from base + adapter, not from the base alone?

A push of merged LoRA weights can silently do nothing: a name the engine does
not know is skipped, and the engine keeps sampling from the base model (vLLM
#34186 is the adapter-loading form of it). The calibrated canary check
(cohort/trainer/sync_check.py) already fails when the engine is far from the
trainer; this check names the failure mode. After each push the weight sync
(cohort/trainer/weight_sync.py) also scores the canaries with the adapter
disabled (the base, b), and `adapter_effect` asks how much of the
adapter's change to the canaries (t − b, trainer minus base) the engine shows:
the projection of e − b on t − b, divided by |t − b|², is 1 for an engine that
holds the adapter and 0 for one left on the base. It is only asked once the
adapter moved the canaries clearly above the noise (rms |t − b| ≥ FOLLOW_SIGNAL
× the floor's rms), as the following test of sync_check does; at the start B = 0
and the adapter changes nothing, so there is nothing to see.

The closeness test's minimum bound is larger under LoRA (LORA_MIN_GAP_NATS):
the engine computes (W + s·BA)x with merged weights, the trainer Wx + s·B(Ax),
and in float32 the two orders of summation differ. Measured on the random tiny
model (rank 8, lr 2e-2, sevens task, 30 syncs): the mean canary gap stayed at
2–4e-6 nats with one sync at 1.15e-5 (one token at log-prob ≈ −25 contributing
5.7e-4) as the policy saturated, above sync_check's 1e-5 floor for full weights.
A stale engine is still caught by the following test and a base engine by the
adapter test, neither of which uses that bound.

Left out: which module was missed (the check sees log-probs only).
"""

from __future__ import annotations

import torch

from cohort.trainer.sync_check import FOLLOW_MIN, FOLLOW_NOISE_MIN, FOLLOW_SIGNAL, SyncCheckError

LORA_MIN_GAP_NATS = 5e-5  # closeness bound's floor under LoRA: 4x the largest merged-vs-factorized mean gap measured


def adapter_effect(engine: torch.Tensor, trainer: torch.Tensor, base: torch.Tensor, *, floor_rms: float) -> dict[str, float]:
    """Judge flat (M,) canary log-probs: engine e, trainer t (base + adapter), base b. Raises SyncCheckError when the
    adapter moved the canaries clearly but the engine took less than FOLLOW_MIN of that move."""
    effect = trainer - base  # (M,) what the adapter does to the canaries
    signal = float(effect.pow(2).mean().sqrt())
    metrics = {"sync/adapter_effect_rms": signal}
    if signal < FOLLOW_SIGNAL * max(floor_rms, FOLLOW_NOISE_MIN):
        return metrics  # the adapter is still too small to tell base and adapter apart
    followed = float(((engine - base) * effect).sum() / effect.pow(2).sum())
    metrics["sync/adapter_followed"] = followed
    if not followed >= FOLLOW_MIN:
        raise SyncCheckError(
            f"LoRA weight sync check failed: the engine shows {followed:.0%} of the adapter's change to the canaries' "
            f"log-probs (rms {signal:.3g} nats; an engine holding base + adapter shows ~100%, one left on the base ~0%). "
            "The merged weights did not reach the engine under the names it expects (lora.target_modules on a "
            "layer the engine names differently?)")
    return metrics

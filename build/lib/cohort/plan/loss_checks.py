"""Checks of the policy-loss fields of `algorithm` (loss_type and its parameters), with fix-it messages.

`loss_problems(cfg)` is one part of `cohort.plan.validate.validate_config`: the
ranges of the dual clip, the entropy knobs, SAPO's temperatures and VESPO's
shape, and the combinations a loss type cannot take: cispo, sapo and vespo
have no hard clip (so `delta` and `clip_ratio_c` would do nothing), and a loss
type with its own ratio (`LOSS_TYPES[...].ratio_level`) cannot be given another
`importance_sampling_level`. Every algorithm takes every loss type.

Left out: a cispo cap (`epsilon_high`) below 1 is allowed, as in TRL (whose
default is 0.2): it scales every on-policy token's gradient by the cap.
"""

from __future__ import annotations

from cohort.algorithms.specs import LOSS_TYPES
from cohort.config import CohortConfig

CLIPPED_LOSS_TYPES = ", ".join(name for name, row in LOSS_TYPES.items() if row.hard_clip)


def loss_problems(cfg: CohortConfig) -> list[str]:
    a, problems = cfg.algorithm, []
    if a.clip_ratio_c is not None and a.clip_ratio_c <= 1:
        problems.append(f"algorithm.clip_ratio_c = {a.clip_ratio_c}: must be > 1 (the dual clip caps the loss at −A·c; "
                        "verl uses 3.0), or unset it (null) to turn dual clipping off")
    if not 0 < a.top_entropy_quantile <= 1:
        problems.append(f"algorithm.top_entropy_quantile = {a.top_entropy_quantile}: must be in (0, 1] (the fraction of "
                        "tokens kept by entropy: 1.0 keeps all, the paper uses 0.2)")
    for key in ("sapo_temperature_pos", "sapo_temperature_neg", "vespo_lambda_pos", "vespo_lambda_neg"):
        if getattr(a, key) <= 0:
            problems.append(f"algorithm.{key} = {getattr(a, key)}: must be > 0 (TRL's default is "
                            f"{type(a).model_fields[key].default})")
    for key in ("vespo_k_pos", "vespo_k_neg"):
        if getattr(a, key) < 0:
            problems.append(f"algorithm.{key} = {getattr(a, key)}: must be >= 0 (TRL's default is "
                            f"{type(a).model_fields[key].default})")
    row = LOSS_TYPES[a.loss_type]
    if row.ratio_level is not None and a.importance_sampling_level not in ("auto", row.ratio_level):
        problems.append(f"algorithm.loss_type = {a.loss_type} computes its own {row.ratio_level}-level ratio, but "
                        f"algorithm.importance_sampling_level = {a.importance_sampling_level}; set it to auto "
                        f"(or {row.ratio_level})")
    if not row.hard_clip:
        for key in ("clip_ratio_c", "delta"):
            if getattr(a, key) is not None:
                problems.append(f"algorithm.{key} = {getattr(a, key)} with algorithm.loss_type = {a.loss_type}: that "
                                f"loss has no hard clip to cap, so it would do nothing; unset algorithm.{key} or use a "
                                f"clipped loss type ({CLIPPED_LOSS_TYPES})")
    return problems

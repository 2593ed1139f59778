"""How noisy is the weight-sync check's statistic over a long run? (issue 17: no false alarm in 1,000 bf16 syncs)

Runs the embedded arith demo (`cohort train` with no config, a fresh checkpoint
of tiny:arith) for --steps optimizer steps in the given precision, with the
check's bounds switched off so nothing stops the run, and records after every
sync the statistics the check judges: the mean per-token canary gap divided by
the calibrated floor (must stay below FLOOR_MULTIPLE) and, when the update was
large enough to tell, the fraction of the update the engine followed (must stay
above FOLLOW_MIN). Prints one JSON object: the floor, the distribution of both
ratios, and the margin to each bound.

  .venv/bin/python bench/sync_check_noise.py --steps 1000 --set model.dtype=bfloat16
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import _common
from _common import load_average

_common.cohort_cli_environment()  # the environment `cohort train` runs in, before torch and vLLM load

from cohort.config.resolve import load_config  # noqa: E402  (after the environment above)
from cohort.trainer import sync_check  # noqa: E402
from cohort.trainer.trainer import Trainer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. model.dtype=bfloat16")
    args = parser.parse_args()
    bounds = sync_check.FLOOR_MULTIPLE, sync_check.FOLLOW_MIN
    sync_check.FLOOR_MULTIPLE, sync_check.FOLLOW_MIN = float("inf"), float("-inf")  # record, never stop
    cfg = load_config(None, [f"train.max_steps={args.steps}", "run.progress=false", *args.set])
    load_before, start = load_average(), time.perf_counter()
    trainer = Trainer(cfg, run_dir=f"/tmp/sync-check-noise-{int(time.time())}", log=lambda *a: None)
    ratios, raw_ratios, scales, followed, gaps = [], [], [], [], []
    try:
        for _ in range(args.steps):
            metrics = trainer.step()
            if "sync/canary_gap_mean" in metrics:
                floor, scale = trainer.sync.check.floor[0], metrics["sync/noise_scale"]
                gaps.append(metrics["sync/canary_gap_mean"])
                scales.append(scale)
                raw_ratios.append(metrics["sync/canary_gap_mean"] / floor)
                ratios.append(metrics["sync/canary_gap_mean"] / (floor * scale))
            if "sync/canary_followed" in metrics:
                followed.append(metrics["sync/canary_followed"])
    finally:
        trainer.close()
    q = lambda xs, f: sorted(xs)[min(len(xs) - 1, int(f * len(xs)))] if xs else None  # noqa: E731
    print(json.dumps({
        "config": args.set, "steps": args.steps, "syncs_checked": len(ratios),
        "canary_tokens": sum(len(c) for _, c in trainer.sync.check.canaries),
        "floor_mean_nats": trainer.sync.check.floor[0], "floor_rms_nats": trainer.sync.check.floor[1],
        "gap_over_stretched_floor": {"median": statistics.median(ratios), "p99": q(ratios, 0.99), "max": max(ratios)},
        "gap_over_starting_floor": {"median": statistics.median(raw_ratios), "p99": q(raw_ratios, 0.99), "max": max(raw_ratios)},
        "noise_scale": {"median": statistics.median(scales), "max": max(scales)},
        "bound_floor_multiple": bounds[0], "false_alarms_closeness": sum(r > bounds[0] for r in ratios),
        "followed": {"count": len(followed), "min": min(followed, default=None), "median": statistics.median(followed) if followed else None},
        "bound_follow_min": bounds[1], "false_alarms_following": sum(f < bounds[1] for f in followed),
        "gap_mean_nats": {"median": statistics.median(gaps), "max": max(gaps)},
        "wall_s": time.perf_counter() - start, "load_before": load_before, "load_after": load_average(),
    }, indent=2))


if __name__ == "__main__":
    main()

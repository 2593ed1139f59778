"""On-policy distillation against GRPO from the same start: held-out accuracy against steps and training seconds.

    .venv/bin/python bench/distill_vs_grpo.py [--config examples/smollm2_add.yaml] [--out bench/distill_vs_grpo.json] \
        [overrides...]
    .venv/bin/python bench/distill_vs_grpo.py --grpo-run RUN_A --distill-run RUN_B   # only read two finished runs

First `cohort train CONFIG` (GRPO; its final/ is the teacher), then `cohort train CONFIG algorithm.name=distill
teacher.path=<GRPO run>/final`: the same model, task, sampling and schedule, the student the model GRPO started from.
Both runs evaluate greedily every `run.eval_every` steps (the overrides set it; say `run.eval_every=3`). For each run
it prints the curve (step, training seconds up to that step = the sum of `timing/step_s`, evals excluded, held-out
accuracy) and the first step and second at which the accuracy comes within 3 points of the teacher's (GRPO's final
accuracy): for GRPO, of its own end. The 1-minute load average before and after each run is recorded; timings under
load are upper bounds (accuracy is not affected).

Not part of `make bench` (`run_all.py`): on the 135M model each run takes tens of minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import _common as common

WITHIN_POINTS = 3.0


def curve(run_dir: Path) -> list[dict]:
    """[{step, train_s, accuracy}] from eval.jsonl (step 0: before training) and metrics.jsonl's step times."""
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    seconds, total = {0: 0.0}, 0.0
    for row in metrics:
        if "timing/step_s" in row:
            total += row["timing/step_s"]
            seconds[row["step"]] = total
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines() if line.strip()]
    points = sorted({int(e["step"]): float(e["accuracy"]) for e in evals if isinstance(e.get("accuracy"), (int, float))}.items())
    return [{"step": s, "train_s": round(seconds.get(s, total), 1), "accuracy": round(a, 4)} for s, a in points]


def reach(points: list[dict], target: float) -> dict | None:
    """The first point within WITHIN_POINTS of `target` (an accuracy in [0, 1]), or None."""
    for p in points:
        if p["accuracy"] >= target - WITHIN_POINTS / 100:
            return {"step": p["step"], "train_s": p["train_s"], "accuracy": p["accuracy"]}
    return None


def train(config: str, run_dir: Path, overrides: list[str]) -> dict:
    cmd = [sys.executable, "-m", "cohort.cli", "train", config, f"run.output_dir={run_dir}", "run.progress=false",
           "run.loggers=[jsonl]", *overrides]
    load_before, start = common.load_average(), time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    out = {"command": " ".join(cmd[2:]), "wall_s": round(time.perf_counter() - start, 1), "load_before": load_before,
           "load_after": common.load_average()}
    if proc.returncode != 0:
        out["error"] = proc.stderr[-2000:]
    return out


def compare(grpo_dir: Path, distill_dir: Path) -> dict:
    grpo, distill = curve(grpo_dir), curve(distill_dir)
    teacher = grpo[-1]["accuracy"]
    return {"teacher_accuracy": teacher, "within_points": WITHIN_POINTS,
            "grpo": {"run": str(grpo_dir), "curve": grpo, "reaches_teacher": reach(grpo, teacher)},
            "distill": {"run": str(distill_dir), "curve": distill, "reaches_teacher": reach(distill, teacher)}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(common.REPO / "examples" / "smollm2_add.yaml"))
    parser.add_argument("--work", default=None, help="where the two runs go (default: a new directory under /tmp)")
    parser.add_argument("--grpo-run", default=None)
    parser.add_argument("--distill-run", default=None)
    parser.add_argument("--out", default=None)
    ns, overrides = parser.parse_known_args()
    runs = {}
    if ns.grpo_run and ns.distill_run:
        grpo_dir, distill_dir = Path(ns.grpo_run), Path(ns.distill_run)
    else:
        work = Path(ns.work or f"/tmp/distill_vs_grpo-{time.strftime('%Y%m%d-%H%M%S')}")
        grpo_dir, distill_dir = work / "grpo", work / "distill"
        runs["grpo"] = train(ns.config, grpo_dir, overrides)
        runs["distill"] = train(ns.config, distill_dir, [*overrides, "algorithm.name=distill",
                                                         f"teacher.path={grpo_dir / 'final'}"])
    result = {**compare(grpo_dir, distill_dir), "runs": runs}
    common.emit(result)
    if ns.out:
        Path(ns.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

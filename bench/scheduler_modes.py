"""The rollout scheduler's rules, each alone and combined, through `cohort train` as a user runs it: 10 steps of the
embedded demo per mode (and examples/tool_calc.yaml under a staleness bound), one JSON object on stdout.

Per mode: the exit code, the steps logged, the mean reward of the first and last 3 steps, the largest
`staleness/max` seen (every trained token within the bound k), and what each rule did (`partial/aborted`,
`dynamic_sampling/groups_dropped`, `async/stale_*`). `k0_equals_sync`: the synchronous run and `max_staleness=0`
logged the same metrics at every step (timings left out) and saved the same final weights, byte for byte.

    .venv/bin/python bench/scheduler_modes.py [--steps 10] [--only NAME ...] > bench/scheduler_modes.json

Not a speed benchmark: the runs are timed only to show where the time went.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODES: dict[str, list[str]] = {
    "synchronous": [],
    "max_staleness=0": ["pipeline.max_staleness=0"],
    "max_staleness=1": ["pipeline.max_staleness=1"],
    "max_staleness=2": ["pipeline.max_staleness=2"],
    "over_provision=2": ["pipeline.over_provision=2"],
    "over_provision=2+max_staleness=2": ["pipeline.over_provision=2", "pipeline.max_staleness=2"],
    "dynamic_sampling+max_staleness=1": ["pipeline.dynamic_sampling=true", "pipeline.max_staleness=1"],
    "tool_calc+max_staleness=1": ["examples/tool_calc.yaml", "pipeline.max_staleness=1"],
    "local_server+max_staleness=1": ["engine.mode=local_server", "pipeline.max_staleness=1"],
}
COUNTED = ("partial/aborted", "partial/resumed", "dynamic_sampling/groups_dropped", "async/stale_dropped",
           "async/stale_masked_tokens")


def run_mode(name: str, args: list[str], steps: int, root: Path) -> dict:
    out = root / name.replace("+", "_").replace("=", "")
    config = [a for a in args if a.endswith(".yaml")]
    overrides = [a for a in args if not a.endswith(".yaml")]
    command = [str(Path(sys.executable).parent / "cohort"), "train", *config, *overrides, f"train.max_steps={steps}",
               f"run.output_dir={out}", "run.eval_every=0", "run.progress=false"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    metrics_file = out / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    rows = [r for r in rows if "reward" in r]
    result = {"returncode": done.returncode, "steps": len(rows), "seconds": round(seconds, 1)}
    if done.returncode:
        result["stderr_tail"] = done.stderr[-2000:]
    if rows:
        result["reward_first3"] = round(sum(r["reward"] for r in rows[:3]) / len(rows[:3]), 4)
        result["reward_last3"] = round(sum(r["reward"] for r in rows[-3:]) / len(rows[-3:]), 4)
        result["staleness_max"] = max((r.get("staleness/max", 0.0) for r in rows), default=0.0)
        result.update({key: sum(r.get(key, 0.0) for r in rows) for key in COUNTED if any(key in r for r in rows)})
    weights = out / "final" / "model.safetensors"
    result["final_weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None
    result["_rows"] = rows
    return result


def same_run(a: dict, b: dict) -> bool:
    """Every logged metric except timings equal at every step, and the same final weights."""
    strip = lambda row: {k: v for k, v in row.items() if not k.startswith("timing/") and not k.endswith("_s")}  # noqa: E731
    return ([strip(r) for r in a["_rows"]] == [strip(r) for r in b["_rows"]] and a["final_weights_sha256"] is not None
            and a["final_weights_sha256"] == b["final_weights_sha256"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--only", nargs="*", default=None, help="mode names (default: all)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    results = {}
    with tempfile.TemporaryDirectory(prefix="cohort-modes-") as tmp:
        for name, mode_args in MODES.items():
            if args.only is None or name in args.only:
                results[name] = run_mode(name, mode_args, args.steps, Path(tmp))
                print(f"{name}: rc {results[name]['returncode']}, {results[name]['steps']} steps", file=sys.stderr)
    out = {"steps": args.steps, "load_before": load_before, "load_after": os.getloadavg()[0], "modes": results}
    if "synchronous" in results and "max_staleness=0" in results:
        out["k0_equals_sync"] = same_run(results["synchronous"], results["max_staleness=0"])
    for result in results.values():
        result.pop("_rows")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

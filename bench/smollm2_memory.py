"""The planner's memory estimate for SmolLM2-135M-Instruct beside the measured peak RSS of the training process (JSON).

`cohort plan` estimates the training process at the peak of its update (weights, gradients, AdamW moments,
activations, the log-prob chunk) and names the colocated vLLM engine's part "on top" (its weights in the generation
dtype and engine.kv_cache_gib of KV cache on a CPU). This script adds the two, runs `cohort train` on
examples/smollm2_add.yaml for a few steps in a fresh process (engine.mode=colocate: vLLM is inside it), and reads that
process's resident high-water mark (/proc/PID/status VmHWM, polled until it exits; ru_maxrss would include what the
parent held at fork). Its held-out evaluations are cut to 8 prompts, unless `--whole`: the example as a user runs it,
evaluations whole. Each run also says in which phase the peak was reached (`phases`: setup, eval before, step k, eval
after, save, each with its highest sampled RSS and the high-water mark when it ended). `imports_mib` is the peak of a
process that only imported torch, transformers, vLLM and cohort's trainer: the fixed cost the planner does not count,
reported beside so the gap can be read.

Peak RSS does not depend on the machine's load (the timings here are not reported).

Measured on the shared machine (load 10-12), 2 steps, micro-batch 16: peak RSS 8,055 MiB; the planner's rows then
summed to 5,636 MiB (trainer 4,099 + vLLM weights and KV cache 1,537: 0.70x); imports alone 441 MiB. The full run of
the example (steps 1-2, /usr/bin/time): 8,128 MiB. `cohort plan` now adds vLLM's working allowance (1 GiB) and the
imports (450 MiB): 7,110 MiB, 0.88x of 8,055 (0.87x of 8,128).

Before the heap trims (train.release_host_memory, 2026-12-03), `--steps 3 --whole`: 8,573 MiB, reached in step 3 (setup
2,768, eval before 3,550, step 1 6,974, step 2 8,400, step 3 8,573; the evaluations after it stayed below), 0.84x of
the planner's 7,220; so the evaluations were never the peak, the updates were. With them: docs/runs.md, "Memory on the
CPU", and bench/smollm2_memory.json.

    PYTHONPATH=. python bench/smollm2_memory.py [--steps 3] [--micro-batch 16 32] [--whole]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, emit, load_average

EXAMPLE = REPO / "examples" / "smollm2_add.yaml"
IMPORTS = "import torch, transformers, vllm; import cohort.trainer.trainer; print('ok')"


def _status_mib(pid: int) -> tuple[float, float] | None:
    """(VmRSS, VmHWM) of `pid` in MiB; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    rss, hwm = (re.search(rf"{key}:\s+(\d+)", text) for key in ("VmRSS", "VmHWM"))
    return (int(rss.group(1)) / 1024, int(hwm.group(1)) / 1024) if rss and hwm else None


def _lines(path: Path) -> int:
    try:
        return path.read_text().count("\n")
    except OSError:
        return 0


def run_phase(run_dir: Path, console: str, max_steps: int) -> str:
    """Which part of `cohort train` the run in `run_dir` is in, from what it has written so far (its console, and the
    lines of metrics.jsonl and eval.jsonl: one per finished step, one per finished evaluation)."""
    steps, evals = _lines(run_dir / "metrics.jsonl"), _lines(run_dir / "eval.jsonl")
    if "eval before training: scoring" not in console:
        return "setup"
    if evals == 0:
        return "eval before"
    if steps < max_steps:
        return f"step {steps + 1}"
    return "eval after" if evals == 1 else "save"


def peak_of(command: list[str], env: dict, run_dir: Path | None = None, max_steps: int = 0) -> tuple[float, int, str, list]:
    """(peak RSS MiB, exit code, the output's tail, the phases) of `command`, run to its end. With `run_dir` (a
    `cohort train` run's directory), also where the peak was reached: for each phase of the run (`run_phase`) its
    highest sampled RSS and the high-water mark when it ended, so the phase in which the mark last rose holds the peak."""
    peak, phases = 0.0, []
    with tempfile.TemporaryFile("w+") as sink:  # (a file, not a pipe: a full pipe would stall the child)
        child = subprocess.Popen(command, env=env, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, text=True)
        while child.poll() is None:
            status = _status_mib(child.pid)
            if status is not None:
                peak = max(peak, status[1])
                if run_dir is not None:
                    sink.seek(0)
                    phase = run_phase(run_dir, sink.read(), max_steps)
                    sink.seek(0, os.SEEK_END)
                    if not phases or phases[-1]["phase"] != phase:
                        phases.append({"phase": phase, "max_rss_mib": 0.0, "hwm_mib": 0.0})
                    phases[-1]["max_rss_mib"] = round(max(phases[-1]["max_rss_mib"], status[0]))
                    phases[-1]["hwm_mib"] = round(status[1])
            time.sleep(0.2)
        sink.seek(0)
        out = sink.read()
    return peak, child.returncode, out[-1500:], phases


def estimate(overrides: list[str]) -> dict:
    """The planner's rows for this config, as `cohort plan` prints them (validation converts the GGUF file once)."""
    from cohort.config.resolve import load_config
    from cohort.plan.memory import cpu_engine_share, memory_estimate, model_facts
    from cohort.plan.validate import validate_config

    cfg = load_config(EXAMPLE, overrides)
    run = validate_config(cfg)  # (model.dtype = auto: settled in run.config)
    cfg, plan = run.config, run.batch
    facts = model_facts(cfg.model.path, cfg.model.revision)  # (a GGUF file: its converted checkpoint)
    trainer, engine = memory_estimate(cfg, plan, facts), cpu_engine_share(cfg, facts)
    mib = lambda rows: round(sum(size for _, size, _ in rows) / 2**20)  # noqa: E731
    return {"rows_mib": {name: round(size / 2**20) for name, size, _ in trainer + engine}, "trainer_mib": mib(trainer),
            "engine_and_runtime_mib": mib(engine), "total_mib": mib(trainer + engine)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, nargs="+", default=[16])
    parser.add_argument("--whole", action="store_true",
                        help="the example as a user runs it (its held-out evaluations whole, not 8 prompts), with the peak's phase")
    args = parser.parse_args()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    load_before = load_average()
    imports_mib, code, out, _ = peak_of([sys.executable, "-c", IMPORTS], env)
    assert code == 0, out
    runs = []
    for micro_batch in args.micro_batch:
        with tempfile.TemporaryDirectory() as run_dir:
            overrides = [f"train.max_steps={args.steps}", f"train.micro_batch_size={micro_batch}", f"run.output_dir={run_dir}/run",
                         "run.progress=false", *([] if args.whole else ["data.eval_max_samples=8"])]
            planned = estimate(overrides)
            peak, code, out, phases = peak_of([sys.executable, "-m", "cohort.cli", "train", str(EXAMPLE), *overrides], env,
                                              Path(run_dir) / "run", args.steps)
            assert code == 0, out
        runs.append({"micro_batch_size": micro_batch, "estimate": planned, "peak_rss_mib": round(peak),
                     "estimate_over_peak": round(planned["total_mib"] / peak, 3), "phases": phases})
    emit({"bench": "smollm2_memory", "model": "gguf:smollm2-135m-instruct", "config": str(EXAMPLE.relative_to(REPO)),
          "steps": args.steps, "whole": args.whole, "imports_mib": round(imports_mib), "runs": runs,
          "load_before": load_before, "load_after": load_average()})


if __name__ == "__main__":
    main()

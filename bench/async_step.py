"""Where an asynchronous step of the arith demo goes: per-thread and per-process CPU time, lock waits, phases.

    .venv/bin/python bench/async_step.py [--steps 40] [--warmup 5] [overrides...]

Builds the Trainer in-process from examples/arith.yaml (the demo's preset) plus the overrides, in the CLI's
environment, runs `--warmup` steps unmeasured, then `--steps` steps the way `cohort train` runs them (the step, then
the metrics logger and diagnostics) and reports, per measured step:

- `wall_s`: the loop's wall time; `step_s`: Trainer.step alone; `metrics_s`: the logger and diagnostics after it;
- `timing`: the means of the step's own timing/* phases (generate, reward, logprob, update, sync);
- `cpu_s_by_thread`: CPU seconds of each thread of this process (by thread name; /proc/self/task), and of each child
  process (engine.mode=local_server: vLLM's process), per step; `cpu_cores`: their sum over the wall time;
- `lock_wait_s`: time spent waiting for the engine lock, the trainer's calls (by thread and the function
  that takes the lock) and the driver's polls (`driver`), per step;
- `async`: the scheduler's async/* means (trainer_wait_frac, engine_idle_frac).

The floor of an asynchronous step is the update plus the push (generation and rewards hidden behind them). The
1-minute load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import _common as common

common.cohort_cli_environment()  # as `cohort train` runs, before torch loads

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads (summed by name) and of its child processes' whole trees."""
    out: dict[str, float] = collections.defaultdict(float)
    names = {t.native_id: t.name for t in threading.enumerate()}  # Python's thread names (the OS knows only "python")
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            stat = (task / "stat").read_text()
            name, fields = stat[stat.index("(") + 1: stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            out[names.get(int(task.name), "os:" + name)] += (int(fields[11]) + int(fields[12])) / TICK
    import psutil  # (bench-only; vLLM depends on it)

    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            out[f"child:{child.name()}"] += times.user + times.system
    return out


class LockTimer:
    """Wraps EngineLock's two ways in so that waits are summed: `caller` (with lock:) and `driver` (lock.driver())."""

    def __init__(self):
        from cohort.rollout.base import EngineLock

        self.waits: dict[str, float] = collections.defaultdict(float)
        enter, driver = EngineLock.__enter__, EngineLock.driver
        timer = self

        def timed_enter(lock):
            start = time.perf_counter()
            try:
                return enter(lock)
            finally:
                site = sys._getframe(1).f_code.co_name  # the function whose `with lock:` this is
                timer.waits[f"{threading.current_thread().name}:{site}"] += time.perf_counter() - start

        @contextlib.contextmanager
        def timed_driver(lock):
            start = time.perf_counter()
            with driver(lock):
                timer.waits["driver"] += time.perf_counter() - start
                yield

        EngineLock.__enter__, EngineLock.driver = timed_enter, timed_driver


def delta(after: dict[str, float], before: dict[str, float], steps: int) -> dict[str, float]:
    return {k: round((after[k] - before.get(k, 0.0)) / steps, 4) for k in sorted(after) if after[k] - before.get(k, 0.0) > 0.005}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)

    from cohort.config.resolve import load_config
    from cohort.trainer.diagnostics import Diagnostics
    from cohort.runs.loggers import MetricsLogger
    from cohort.trainer.trainer import Trainer

    locks = LockTimer()
    run_dir = common.CACHE / "async_step" / f"run-{int(time.time())}"
    overrides = [f"run.output_dir={run_dir}", "run.progress=false", "run.loggers=[jsonl]",
                 f"train.max_steps={args.warmup + args.steps + 1}", *args.overrides]
    cfg = load_config(str(common.REPO / "examples" / "arith.yaml"), overrides)
    with contextlib.redirect_stdout(sys.stderr):
        trainer = Trainer(cfg, run_dir=run_dir)
        logger = MetricsLogger(run_dir, cfg.run.loggers, total_steps=cfg.train.max_steps, progress=False, config=cfg.to_dict())
        diagnostics = Diagnostics(max_completion_length=cfg.rollout.max_completion_length)
        try:
            for _ in range(args.warmup):
                trainer.step()
            load_before, history = common.load_average(), []
            cpu0, waits0 = thread_cpu(), dict(locks.waits)
            step_s = metrics_s = 0.0
            start = time.perf_counter()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                metrics = trainer.step()
                t1 = time.perf_counter()
                logger.log(trainer.state.step, metrics)
                diagnostics.observe(trainer.state.step, metrics)
                step_s, metrics_s = step_s + t1 - t0, metrics_s + time.perf_counter() - t1
                history.append(metrics)
            wall = time.perf_counter() - start
            cpu1, waits1, load_after = thread_cpu(), dict(locks.waits), common.load_average()
        finally:
            logger.close()
            trainer.close()
    cpu = delta(cpu1, cpu0, args.steps)
    mean = lambda key: round(statistics.mean(m[key] for m in history if key in m), 4) if any(key in m for m in history) else None
    timing = {k.split("/", 1)[1]: mean(k) for k in sorted({k for m in history for k in m if k.startswith("timing/")})}
    result = {"overrides": args.overrides, "steps": args.steps, "warmup": args.warmup,
              "wall_s_per_step": round(wall / args.steps, 4), "step_s": round(step_s / args.steps, 4),
              "metrics_s": round(metrics_s / args.steps, 4), "timing": timing,
              "floor_update_plus_sync_s": round((timing.get("update_s") or 0) + (timing.get("sync_s") or 0), 4),
              "cpu_s_by_thread": cpu, "cpu_cores": round(sum(cpu.values()) / (wall / args.steps), 3),
              "lock_wait_s": delta(waits1, waits0, args.steps),
              "async": {k: mean(k) for k in ("async/trainer_wait_frac", "async/engine_idle_frac", "staleness/max")},
              "load_before": load_before, "load_after": load_after, "torch_threads": _torch_threads()}
    common.emit(result)
    return result


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    main()

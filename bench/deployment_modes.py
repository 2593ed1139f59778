"""Seconds per GRPO step by deployment mode: colocate vs server vs 2 processes (issue 8).

The same workload as bench/grpo_step.py (random tiny Qwen2, 64 addition prompts,
4 prompts × G=8 per step, 16 tokens, 10 steps) trained by `cohort train` in
three ways, each as its own process tree:

- `colocate`: vLLM inside the trainer process, weights reloaded in place;
- `server`: a `cohort serve` child on loopback (started before timing), the
  trainer pushes safetensors over HTTP after every step;
- `two_process`: `train.num_processes=2` (torchrun, FSDP2 over gloo), rank 0
  drives a private loopback vLLM server (vLLM cannot live in a multi-rank
  process), each rank trains on half the groups.

Reported per mode: median s/step over steps 2..N, the per-phase medians,
bytes pushed per sync, wall time including start-up, and the load average
before and after (`idle` is false when either was >= 0.5: on a busy 2-core
machine the numbers are not comparable). Prints one JSON object.

    .venv/bin/python bench/deployment_modes.py [--steps 10] [--only colocate server two_process]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import _common as common

PHASES = ("generate", "reward", "logprob", "update", "sync")
MODES = ("colocate", "server", "two_process")


def _overrides(run_dir, steps: int) -> list[str]:
    return [f"model.path={common.tiny_model_dir()}", f"data.train_files=[{common.addition_file(64)}]", "data.max_prompt_length=16",
            "engine.name=vllm", "rollout.num_generations=8", "rollout.max_completion_length=16", "algorithm.beta=0.0",
            "train.prompts_per_step=4", "train.micro_batch_size=32", "train.learning_rate=1e-4", f"train.max_steps={steps}",
            "rewards=[{name: 'bench._common:addition_reward'}]", f"run.output_dir={run_dir}", "run.progress=false",
            "run.loggers=[jsonl]", "run.log_completions_every=0", "run.diagnostics=false"]


def _train(extra: list[str], run_dir, steps: int, env: dict[str, str]) -> dict:
    cmd = [sys.executable, "-m", "cohort.cli", "train", *_overrides(run_dir, steps), *extra]
    start = time.perf_counter()
    with common.LoadWatch() as load:
        proc = subprocess.run(cmd, cwd=common.REPO, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-2000:]}
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = metrics[1:] or metrics
    return {
        "median_step_s": common.median([m["timing/step_s"] for m in steady]),
        "phases_median_s": {p: common.median([m.get(f"timing/{p}_s", 0.0) for m in steady]) for p in PHASES},
        "sync_bytes_per_push": common.median(pushed) if (pushed := [m["sync/bytes_sent"] for m in steady if m.get("sync/bytes_sent")])
        else 0,  # colocate: reloaded in place, nothing sent
        "step_s_all": [round(m["timing/step_s"], 4) for m in metrics],
        "wall_s_with_startup": time.perf_counter() - start,
        "reward_last": metrics[-1].get("reward"),
    } | load.record()


def run_mode(mode: str, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(common.REPO), "OMP_NUM_THREADS": "1" if mode == "two_process" else "2"}
    run_dir = common.CACHE / "runs" / f"deploy-{mode}-{os.getpid()}"
    if mode == "colocate":
        return {"mode": mode, "processes": 1} | _train(["train.num_threads=2"], run_dir, steps, env)
    if mode == "two_process":
        return {"mode": mode, "processes": 2, "note": "rank 0 drives a private loopback vLLM server"} | _train(
            ["train.num_processes=2", "train.num_threads=1"], run_dir, steps, env)
    from cohort.rollout.server.app import LocalServer

    start = time.perf_counter()
    server = LocalServer(common.tiny_model_dir(), max_model_len=64)
    started_s = time.perf_counter() - start
    try:
        env["COHORT_SERVER_TOKEN"] = server.token
        out = _train(["train.num_threads=2", "engine.mode=server", f"engine.server_urls=[{server.url}]"], run_dir, steps, env)
    finally:
        server.close()
    return {"mode": mode, "processes": 1, "server_start_s": started_s} | out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--only", nargs="*", choices=MODES, default=list(MODES))
    args = ap.parse_args(argv)
    result = {"benchmark": "deployment_modes", "steps": args.steps, "cpus": os.cpu_count(),
              "modes": {mode: run_mode(mode, args.steps) for mode in args.only}}
    result["idle"] = all(m.get("idle", False) for m in result["modes"].values())
    common.emit(result)
    return result


if __name__ == "__main__":
    main()

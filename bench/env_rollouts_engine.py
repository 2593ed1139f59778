"""Benchmark: what each environment connector adds to the rollout phase per episode, on the real model through vLLM.

Each connector's run is `cohort train` (the CLI, one fresh process per run) beside a plain-dataset run with the same
number of completions: the same prompts_per_step x num_generations, max_completion_length, temperature, seeds and
model, and the same prompts written to a jsonl file with the `numeric_match` reward, no environment. A run's rollout
phase is its `timing/generate_s + timing/reward_s` (the engine's requests, the tool loop or the agent's episodes,
and the reward functions: everything between admitting a batch and the batch being cut), summed over steps 2..N
(step 1 is vLLM's warm-up). The overhead per episode is (connector's rollout seconds - plain's) / episodes.

| run | connector | plain run beside it |
|---|---|---|
| reasoning_gym | `data.task: reasoning_gym:products` (max_digits 2, answer_format last_number) | the task's train rows (prompt, answer) |
| verifiers | `agent.environment: verifiers:cohort_vf_arith` (tests/agents/vf_envs; the `null` chat harness as a subprocess) | its tasks' prompts, the product as the answer |
| openenv | `tools.environment: _env_guess.GuessEnv` (bench/_env_guess.py: an OpenEnv class, in-process) | the guessing game's prompts |
| openenv_served | `tools.environment: ws://127.0.0.1:PORT` (the same class served by openenv's `create_app` on loopback) | (the same plain run) |
| trl_environment_factory | `tools.environment: _env_guess.GuessGame` (the same game in TRL's environment_factory shape) | (the same plain run) |

The three tool runs read every assistant turn as a guess (bench/_env_guess.py's parser: a 135M model writes no tool
call of its own), so their episodes are multi-turn and `rollout.max_completion_length` covers all turns and the
tool's tokens: their overhead includes the extra turns' engine requests, not only the connector's Python. Each side's
sampled tokens and turns are reported beside its seconds. The reasoning-gym connector's own work without the engine
(~28 us/episode) is bench/env_rollouts.py's.

    PYTHONPATH=. .venv/bin/python bench/env_rollouts_engine.py > bench/env_rollouts_engine.json   # 10-12 min on 2 cores
    PYTHONPATH=. .venv/bin/python bench/env_rollouts_engine.py --model DIR --steps 2 --runs plain_guess openenv   # a check

`--model` takes any chat checkpoint with 256 positions or more (the tests' random chat model will do for a check).

Prints one JSON object (bench/_common.py's `emit`): each run's raw numbers, the overhead per episode of each
connector, and the machine's load around the whole measurement (LoadWatch) and each run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from _common import BENCH_DIR, REPO, LoadWatch, emit, load_average

VF_ENVS = REPO / "tests" / "agents" / "vf_envs"  # cohort_vf_arith.py: the tests' verifiers taskset
VF_ARGS = {"taskset": {"num_tasks": 16}, "agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}}
RG_TASK, RG_CONFIG, RG_EVAL_SIZE = "products", {"max_digits": 2}, 8
GUESS_ROWS = 16
sys.path.insert(0, str(VF_ENVS))  # (plain_rows reads the verifiers taskset's prompts here too)

PLAIN_OF = {"reasoning_gym": "plain_reasoning_gym", "verifiers": "plain_verifiers", "openenv": "plain_guess",
            "openenv_served": "plain_guess", "trl_environment_factory": "plain_guess"}
ORDER = ("plain_reasoning_gym", "reasoning_gym", "plain_verifiers", "verifiers", "plain_guess", "openenv",
         "openenv_served", "trl_environment_factory")  # each plain run just before the connectors it is compared with


# --------------------------------------------------------------------------- the arithmetic


def summarise(lines: list[dict], completions_per_step: int, skip: int = 1) -> dict:
    """A run's rollout numbers over its metrics.jsonl lines after the first `skip` steps: seconds (generate, reward and
    their sum, `rollout_s`), episodes, sampled tokens (tool tokens left out), and turns per episode where recorded."""
    kept = [line for line in lines if line["step"] > skip]
    if not kept:
        raise ValueError(f"no step after the first {skip} in {len(lines)} metrics lines")
    generate = sum(line.get("timing/generate_s", 0.0) for line in kept)
    reward = sum(line.get("timing/reward_s", 0.0) for line in kept)
    turns = [line[key] for line in kept for key in ("tools/turns_mean", "agent/calls_mean") if key in line]
    return {"steps": [line["step"] for line in kept], "episodes": completions_per_step * len(kept),
            "rollout_s": round(generate + reward, 3), "generate_s": round(generate, 3), "reward_s": round(reward, 4),
            "rollout_s_per_step": [round(line.get("timing/generate_s", 0.0) + line.get("timing/reward_s", 0.0), 3) for line in kept],
            "sampled_tokens": int(sum(line.get("tokens/generated", 0.0) for line in kept)),
            "turns_per_episode": round(sum(turns) / len(turns), 3) if turns else 1.0,
            "reward_mean": round(sum(line["reward"] for line in kept) / len(kept), 4)}


def overhead_ms_per_episode(connector: dict, plain: dict) -> float:
    """(connector's rollout seconds - plain's) / episodes, in milliseconds; both runs must hold as many episodes."""
    if connector["episodes"] != plain["episodes"]:
        raise ValueError(f"the runs differ in episodes: {connector['episodes']} and {plain['episodes']}")
    return round(1e3 * (connector["rollout_s"] - plain["rollout_s"]) / connector["episodes"], 2)


# --------------------------------------------------------------------------- the runs


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def guess_rows() -> list[dict]:
    """The tool runs' rows: a prompt and a target 0-3 (GuessEnv.reset's and GuessGame.reset's keyword)."""
    text = "Game {}: I am thinking of a number from 0 to 3. Guess it: reply with one digit only."
    return [{"prompt": [{"role": "user", "content": text.format(k)}], "target": k % 4} for k in range(GUESS_ROWS)]


def plain_rows(kind: str) -> list[dict]:
    """The plain run's rows for one kind of connector: the prompts its model sees, with a numeric answer."""
    if kind == "reasoning_gym":
        from cohort.data.reasoning_gym import PREFIX, build_task

        task = build_task(PREFIX + RG_TASK, RG_CONFIG, seed=0, size=1000, eval_size=RG_EVAL_SIZE, answer_format="last_number")
        return [{"prompt": row["prompt"], "answer": row["answer"]} for row in task.train_rows]  # same rows, same order
    if kind == "verifiers":
        from cohort.data.verifiers import environment_rows

        rows = environment_rows("verifiers:cohort_vf_arith", VF_ARGS)
        products = [int(a) * int(b) for a, b in (re.match(r"(\d+)\*(\d+)=", row["prompt"][-1]["content"]).groups() for row in rows)]
        return [{"prompt": row["prompt"], "answer": str(p)} for row, p in zip(rows, products)]
    return [{"prompt": row["prompt"], "answer": str(row["target"])} for row in guess_rows()]  # (no first observation)


def run_config(name: str, args: argparse.Namespace, work: Path, served_url: str | None) -> dict:
    """The whole config of one run: the shared workload, then its data and connector."""
    config = {"model": {"path": args.model},
              # room for the first observation the tool runs append (the engine's max_model_len is sized from this)
              "data": {"max_prompt_length": args.max_prompt_length},
              "rollout": {"num_generations": args.num_generations, "max_completion_length": args.max_completion_length,
                          "temperature": args.temperature},
              "algorithm": {"beta": 0.0},
              "train": {"prompts_per_step": args.prompts_per_step, "micro_batch_size": args.prompts_per_step * args.num_generations,
                        "max_steps": args.steps, "seed": 0},
              "run": {"output_dir": str(work / name), "progress": False, "loggers": ["jsonl"], "log_completions_every": 0,
                      "save_every": 0, "eval_every": 0}}
    if name.startswith("plain_"):
        data = write_jsonl(work / f"{name}.jsonl", plain_rows(name[len("plain_"):]))
        return config | {"data": config["data"] | {"train_files": [str(data)]}, "rewards": [{"name": "numeric_match"}]}
    if name == "reasoning_gym":
        return config | {"data": config["data"] | {"task": f"reasoning_gym:{RG_TASK}", "task_config": RG_CONFIG, "task_eval_size": RG_EVAL_SIZE,
                                  "answer_format": "last_number"}}
    if name == "verifiers":
        return config | {"agent": {"environment": "verifiers:cohort_vf_arith", "environment_args": VF_ARGS, "timeout_s": 300}}
    environment = {"openenv": "_env_guess.GuessEnv", "openenv_served": served_url,
                   "trl_environment_factory": "_env_guess.GuessGame"}[name]
    data = write_jsonl(work / "guess.jsonl", guess_rows())
    return config | {"data": config["data"] | {"train_files": [str(data)]}, "rewards": [],
                     "tools": {"environment": environment, "parser": "_env_guess.guess_call", "max_turns": 3, "timeout_s": 10,
                               "in_prompt": False}}  # SmolLM2's template has no tools block; the recorded numbers had none


def child_env() -> dict:
    """This environment, with the repository, the bench and the tests' verifiers taskset on the children's path."""
    paths = [str(REPO), str(BENCH_DIR), str(VF_ENVS)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [p for p in [os.environ.get("PYTHONPATH")] if p]))


def run_one(name: str, config: dict, work: Path) -> dict:
    """`cohort train` on `config` in a fresh process; its summary, wall time and the load around it."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    before, start = load_average(), time.perf_counter()
    with open(work / f"{name}.log", "w") as log:
        rc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", str(path)], env=child_env(), stdout=log,
                            stderr=subprocess.STDOUT).returncode
    wall_s = time.perf_counter() - start
    if rc != 0:
        tail = (work / f"{name}.log").read_text()[-3000:]
        raise RuntimeError(f"{name}: cohort train exited with {rc}:\n{tail}")
    lines = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    per_step = config["train"]["prompts_per_step"] * config["rollout"]["num_generations"]
    print(f"{name}: {wall_s:.0f} s", file=sys.stderr, flush=True)
    return summarise(lines, per_step) | {"wall_s": round(wall_s, 1), "load_before": before, "load_after": load_average()}


def serve_guess(port: int, sessions: int) -> subprocess.Popen:
    """bench/_env_guess.py's `app` (openenv's create_app) under uvicorn on 127.0.0.1:port, once /health answers."""
    env = dict(child_env(), GUESS_SESSIONS=str(sessions))
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "_env_guess:app", "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=BENCH_DIR, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return server
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"the guess server exited with {server.returncode}")
            time.sleep(0.2)
    server.kill()
    raise RuntimeError("the guess server did not start in 60 s")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gguf:smollm2-135m-instruct")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--max-completion-length", type=int, default=32)
    parser.add_argument("--max-prompt-length", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--steps", type=int, default=3, help="steps per run; the first is left out (warm-up)")
    parser.add_argument("--runs", nargs="+", default=list(ORDER), choices=ORDER, help="which runs, in this order")
    parser.add_argument("--keep", type=Path, help="keep the run directories and logs here (default: a temporary directory)")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="env_rollouts_engine-"))
    work.mkdir(parents=True, exist_ok=True)
    server, served_url = None, None
    if "openenv_served" in args.runs:
        port = free_port()
        server = serve_guess(port, sessions=args.prompts_per_step * args.num_generations)  # one session per trajectory in flight
        served_url = f"ws://127.0.0.1:{port}"
    runs = {}
    try:
        with LoadWatch() as load:
            for name in [n for n in ORDER if n in args.runs]:
                runs[name] = run_one(name, run_config(name, args, work, served_url), work)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    overhead = {name: overhead_ms_per_episode(runs[name], runs[plain])
                for name, plain in PLAIN_OF.items() if name in runs and plain in runs}
    emit({"bench": "env_rollouts_engine", "model": args.model,
          "workload": {"prompts_per_step": args.prompts_per_step, "num_generations": args.num_generations,
                       "max_completion_length": args.max_completion_length, "temperature": args.temperature,
                       "steps": args.steps, "measured_steps": args.steps - 1},
          "overhead_ms_per_episode": overhead, "compared_with": {n: p for n, p in PLAIN_OF.items() if n in overhead},
          "runs": runs, **load.record()})


if __name__ == "__main__":
    main()

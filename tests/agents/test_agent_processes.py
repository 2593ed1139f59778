"""An agent that rewrites its history trains under two training processes (torchrun, gloo, the tiny tool model): the
agent endpoint runs beside rank 0's engine (each run once, on rank 0), every rank receives the finished runs, and each
rank trains its block of whole runs (a run's calls together; the slicing itself: tests/trainer/test_agent_samples.py).

Not compared number for number with one process (as tests/distributed/test_fsdp.py does for a plain task): an agent's
calls reach the transformers engine at moments its own program decides, so the engine's batches, and with them the
sampled tokens, differ from run to run (measured: step 1's reward 0.420 in one process, 0.509 under two)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Each run leaves a line in runs-<RANK> beside the module: the agent runs on rank 0 alone.
AGENT = '''import os, pathlib

async def agent(client, row):
    """Asks, then asks again in a fresh conversation holding only a summary of its first reply (a history rewrite)."""
    with open(pathlib.Path(__file__).with_name("runs-" + os.environ.get("RANK", "x")), "a") as f:
        f.write("run\\n")
    question = row["prompt"][-1]["content"]
    first = await client.chat.completions.create(model="m", messages=list(row["prompt"]), max_tokens=6)
    notes = (first.choices[0].message.content or "")[:12]
    again = await client.chat.completions.create(model="m", max_tokens=6, messages=[
        {"role": "user", "content": f"{question} (your notes so far: {notes!r})"}])
    text = (first.choices[0].message.content or "") + (again.choices[0].message.content or "")
    return (sum(map(ord, text)) % 7) / 7  # dense and arbitrary: every group has reward spread
'''


def _overrides(tmp_path: Path, out: Path) -> list[str]:
    # 2 steps per generation batch of 4 prompts x G = 4 runs, two calls each (32 rows); each step 2 prompts, one per rank
    return [f"agent.function={tmp_path / 'summarising.py'}:agent", "engine.name=hf", "rollout.num_generations=4",
            "train.prompts_per_step=2", "train.steps_per_generation=2", "train.max_steps=2", "train.micro_batch_size=4",
            "train.learning_rate=3e-3", "algorithm.rollout_correction=none", "run.eval_every=0", "run.save_every=0",
            "data.eval_max_samples=2", "run.eval_num_samples=0", "agent.timeout_s=600",
            "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0", f"run.output_dir={out}"]


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.builtin_models('tool_calc')
def test_a_rewriting_agent_trains_under_two_processes_its_runs_on_rank_0(tmp_path):
    # refused at 4f35103 ("agent runs are served in one process; set train.num_processes=1")
    (tmp_path / "summarising.py").write_text(AGENT)
    config = EXAMPLES / "agent_openai.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", str(config), *_overrides(tmp_path, tmp_path / "two"),
                           "train.num_processes=2"], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    second = _metrics(tmp_path / "two")
    assert [m["step"] for m in second] == [1, 2]
    assert second[0]["agent/samples_mean"] == 2.0  # every run rewrote its history: two rows each
    for metrics in second:  # both steps trained: a finite loss, a real gradient
        assert np.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0, metrics
    # 16 training runs (one generation batch) and the 2 eval prompts before and after training (greedy, no samples):
    # 20 runs, each once, on rank 0 (4f35103 wrapped the engine of every rank: each would have run its own agents)
    runs = {rank: len((tmp_path / f"runs-{rank}").read_text().split()) if (tmp_path / f"runs-{rank}").exists() else None
            for rank in ("0", "1")}
    assert runs == {"0": 20, "1": None}
    assert (tmp_path / "two" / "ranks" / "rank-1" / "metrics.jsonl").is_file()  # rank 1 trained beside it

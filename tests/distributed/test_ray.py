"""`distributed.backend=ray` on a local Ray: one vLLM rollout server actor, two trainer actors (FSDP2 between them).

The run is the server-mode e2e task (reward: share of "7" in the completion, a
random tiny model starting near 0); a working pipeline — actors placed, servers
found, weights pushed after every step, two ranks training on halves of each
step — raises the reward well above its start within 16 steps (measured 0.00 →
0.27 by step 11). A stale server, a rank training on nothing or a lost gradient
leaves it flat; a failing actor fails the command instead of hanging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from tests.builders import write_doubling

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
ray = pytest.importorskip("ray")

REWARD = "def sevens(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) for c in completions]\n"


def _run(tmp_path, model_dir, out, *extra):
    data = tmp_path / "train.jsonl"
    write_doubling(data, 32, answers=False)
    (tmp_path / "ray_rewards.py").write_text(REWARD)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    env.pop(TOKEN := "COHORT_SERVER_TOKEN", None)  # the driver makes one for its actors
    args = [f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "rollout.num_generations=4",
            "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=4", "train.learning_rate=3e-3",
            "rewards=[{name: ray_rewards.sevens}]", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0",
            "engine.mode=server", "distributed.backend=ray", "train.num_processes=2", f"run.output_dir={out}", *extra]
    assert TOKEN not in env
    return subprocess.run([sys.executable, "-m", "cohort.cli", "train", *args], env=env, capture_output=True, text=True, timeout=900)


def test_local_ray_run_with_server_and_trainer_actors_learns(tmp_path, tiny_model_dir):
    proc = _run(tmp_path, tiny_model_dir, tmp_path / "run", "train.max_steps=16")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "1 rollout server actor(s) at http://127.0.0.1:" in out and "2 trainer actor(s)" in out, out[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 17))
    assert all(m["sync/bytes_sent"] > 1e6 for m in lines[:-1])  # the full weights went to the server actor every step
    first, last = sum(m["reward"] for m in lines[:3]) / 3, sum(m["reward"] for m in lines[-3:]) / 3
    assert last > first + 0.1, (first, last)
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()
    assert (tmp_path / "run" / "ranks" / "rank-1" / "metrics.jsonl").is_file()


def test_a_failing_actor_fails_the_run_instead_of_hanging(tmp_path, tiny_model_dir):
    """Rank 0's reward raises while rank 1 waits for the batch in a collective: the driver must stop both."""
    (tmp_path / "ray_boom.py").write_text("def boom(prompts, completions, **kw):\n    raise RuntimeError('boom from the reward')\n")
    start = time.perf_counter()
    proc = _run(tmp_path, tiny_model_dir, tmp_path / "boom", "train.max_steps=3", "engine.mode=colocate", "engine.name=hf",
                "rewards=[{name: ray_boom.boom}]")
    assert proc.returncode != 0
    assert "boom from the reward" in proc.stdout + proc.stderr
    assert time.perf_counter() - start < 300

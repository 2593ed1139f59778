"""Several training processes with a token budget per micro-batch: every rank runs the same number of micro-batches.

FSDP2 all-gathers each unit's weights in every micro-batch's forward and backward, so ranks that form different
numbers of micro-batches stop issuing matching collectives: the rank with fewer goes on to the gradient clipping's
all-reduce while the other still waits in an all-gather (a hang on NCCL; on gloo, a hang or a broken pair). With
`train.max_tokens_per_microbatch` the count depends on each rank's own sequence lengths. cohort takes the largest
count over the ranks and splits its own micro-batches until it has as many (verl does the same).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from cohort.distributed.fsdp import LocalContext
from cohort.models.batching import length_sorted_micro_batches, split_to_count


def test_micro_batches_split_to_the_count_of_the_busiest_rank():
    # rows of lengths 36, 35 (a long prompt's group) and 8, 7: the budget of 40 cells puts each long row alone
    # (2 × 36 = 72 > 40) and both short rows together (2 × 8 = 16): 2 micro-batches against 1
    assert length_sorted_micro_batches([36, 35], 2, 40) == [[0], [1]]
    short = length_sorted_micro_batches([8, 7], 2, 40)
    assert short == [[0, 1]]
    assert split_to_count(short, 2) == [[0], [1]]  # the largest micro-batch is halved until there are 2
    assert split_to_count([[0, 1, 2, 3], [4]], 3) == [[0, 1], [2, 3], [4]]
    assert split_to_count([[0], [1]], 2) == [[0], [1]]
    with pytest.raises(ValueError, match="3 rows cannot make 4 micro-batches"):
        split_to_count([[0, 1], [2]], 4)
    assert LocalContext().max_count(3) == 3


@pytest.mark.slow
def test_two_ranks_with_different_micro_batch_counts_finish(tmp_path, tiny_model_dir):
    """`cohort train` on 2 gloo ranks, 2 prompts a step (one group each rank): one prompt of 30 tokens, one of 2, so
    under a 40-cell budget the long group's rank forms 2 micro-batches (each row ≥ 31 cells) and the short group's 1
    (2 rows ≤ 8 cells). Before the counts were evened out the run hung in its first update: a 240 s limit fails it."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+2+3+4+5+6+7+8+9+10+11+12="}) + "\n" + json.dumps({"prompt": "1="}) + "\n")
    (tmp_path / "count_rewards.py").write_text(
        "def spread(prompts, completions, **kw):\n    return [len(c) % 3 / 2 for c in completions]\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "cohort.cli", "train", f"model.path={tiny_model_dir}", f"data.train_files=[{data}]",
           "data.max_prompt_length=40", "engine.name=hf", "rollout.num_generations=2", "rollout.max_completion_length=6",
           "train.prompts_per_step=2", "train.micro_batch_size=2", "train.max_tokens_per_microbatch=40",
           "train.max_steps=2", "rewards=[{name: count_rewards.spread}]", "run.progress=false", "run.loggers=[jsonl]",
           "run.log_completions_every=0", f"run.output_dir={out}", "train.num_processes=2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # (its own process group: torchrun's ranks are ended with it)
    try:
        output, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"2 ranks with different micro-batch counts did not finish in 240 s (collectives out of step): "
                    f"{output[-2000:]}")
    assert proc.returncode == 0, output[-3000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1, 2] and all(m["grad_norm"] > 0 for m in steps)

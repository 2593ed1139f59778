"""Multi-process training (FSDP2, gloo) equals single-process training.

The same tiny run — off-policy (2 optimizer steps per generation batch, so old
log-probs are used), a KL term to a reference model, gradient accumulation (4
completions per micro-batch) — is trained once in this process and once by
`cohort train ... train.num_processes=2` (torchrun, 2 ranks, the decoder layers
sharded, each rank training on half the groups of every step). Sampling is
seeded per completion and rank 0 samples from a copy of the gathered weights,
so the two runs see the same completions; the per-step loss, KL, entropy and
gradient norm must agree to float32 reduction noise (measured: grad_norm
6.043222 vs 6.043259; final weights within ~2e-5 while training moved
them by ~4e-3). A wrong normaliser (global count not divided by W)
doubles grad_norm; overlapping or missing shards change every number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from cohort.config import ConfigError, load_config, validate_config
from cohort.distributed.fsdp import DistContext, LocalContext
from cohort.trainer.loop import Trainer

REWARD = "def sevens(prompts, completions, **kw):\n    return [c.count('7') / max(1, len(c)) for c in completions]\n"


def _overrides(tmp_path, model_dir, out):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{a}="}) + "\n" for a in range(32)))
    (tmp_path / "fsdp_rewards.py").write_text(REWARD)
    return [f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "rollout.engine=hf",
            "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=4", "train.micro_batch_size=4",
            "train.steps_per_generation=2", "train.max_steps=4", "train.learning_rate=3e-3", "algorithm.beta=0.04",
            "rewards=[{name: fsdp_rewards.sevens}]", "run.progress=false", "run.loggers=[jsonl]", "run.log_completions_every=0",
            f"run.output_dir={out}"]


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    one = Trainer(load_config(None, _overrides(tmp_path, tiny_model_dir, tmp_path / "one")))
    try:
        one.train()
    finally:
        one.close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", *_overrides(tmp_path, tiny_model_dir, tmp_path / "two"),
                           "train.num_processes=2"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, second = _metrics(tmp_path / "one"), _metrics(tmp_path / "two")
    assert [m["step"] for m in second] == [1, 2, 3, 4]
    for a, b in zip(first, second):
        assert a.get("reward") == b.get("reward")  # the same completions were sampled
        for key in ("loss", "kl", "entropy", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert second[-1]["grad_norm"] > 1 and second[-1]["kl"] > 0.1  # numbers worth comparing
    from transformers import AutoModelForCausalLM

    w1 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "one" / "final")).state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "two" / "final")).state_dict()
    w0 = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    assert set(w1) == set(w2)
    gap, moved = (max(float((x[k] - w2[k]).abs().max()) for k in w1) for x in (w1, w0))
    assert gap < 2e-4 and moved > 2e-3, (gap, moved)  # equal to reduction noise, while training moved them 10× more
    assert (tmp_path / "two" / "ranks" / "rank-1" / "metrics.jsonl").is_file()  # rank 1 logs aside, not over rank 0
    assert not (tmp_path / "two" / "ranks" / "rank-1" / "final").exists()


def test_each_rank_takes_a_contiguous_block_of_whole_groups():
    indices = list(range(16, 32))  # the second step of a generation batch: 4 groups of 4
    blocks = [DistContext.local_indices(SimpleNamespace(rank=r, world_size=2), indices, 4) for r in range(2)]
    assert blocks == [list(range(16, 24)), list(range(24, 32))]
    with pytest.raises(ValueError, match="cannot be split evenly"):
        DistContext.local_indices(SimpleNamespace(rank=0, world_size=3), indices, 4)
    assert LocalContext().local_indices(indices, 4) == indices
    assert LocalContext().global_count(torch.tensor(7.0)) == 7.0


def test_validation_for_several_processes(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(None, ["train.num_processes=3", "train.prompts_per_step=8", "run.save_every=5",
                                           "algorithm.name=ppo"]), check_files=False)
    text = str(info.value)
    assert "train.prompts_per_step = 8 must divide by the 3 training processes" in text and "use 6 or 9" in text
    assert "run.save_every = 5" in text and "algorithm.name = ppo" in text
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun its world size decides
    validate_config(load_config(None, ["train.prompts_per_step=8"]), check_files=False)

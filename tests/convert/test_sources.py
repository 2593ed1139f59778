"""Reading a verl launch script as a shell would (continuations, variables, env prefixes), and TRL files."""

from __future__ import annotations

import json

import pytest

from cohort.convert.sources import SourceError, count_rows, detect, read_trl, read_verl

SCRIPT = r"""#!/bin/bash
set -x
export VLLM_USE_V1=1
MODEL=/models/qwen   # a comment
N=${ROLLOUT_N:-4}
CUDA_VISIBLE_DEVICES=0,1 nohup python3 -m verl.trainer.main_ppo \
    actor_rollout_ref.model.path=$MODEL \
    actor_rollout_ref.rollout.n=$N \
    data.train_files="${DATA}/train.parquet" \
    trainer.logger=['console','wandb'] \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    +trainer.val_before_train=False \
    trainer.project_name='$NOT_EXPANDED' \
    "$@" 2>&1 | tee log.txt
"""


def test_a_script_is_read_as_a_shell_would(tmp_path):
    path = tmp_path / "run.sh"
    path.write_text(SCRIPT)
    options, notes = read_verl([str(path)], environ={"DATA": "/data"})
    assert options == {
        "actor_rollout_ref.model.path": "/models/qwen",  # the script's own variable
        "actor_rollout_ref.rollout.n": 4,  # ${ROLLOUT_N:-4}: unset, so the default; a number, as Hydra reads it
        "data.train_files": "/data/train.parquet",  # from the environment
        "trainer.logger": ["console", "wandb"],
        "actor_rollout_ref.actor.optim.lr": 1e-6,  # a float, as Hydra reads it (YAML 1.1 would keep a string)
        "trainer.val_before_train": False,  # Hydra's + prefix dropped
        "trainer.project_name": "$NOT_EXPANDED",  # single quotes: literal
    }
    assert any(n.startswith("$DATA = /data (from this shell's environment)") for n in notes)
    assert any("CUDA_VISIBLE_DEVICES=0,1" in n for n in notes) and any(n.startswith("$@") for n in notes)
    assert any("VLLM_USE_V1=1" in n for n in notes)


def test_arguments_and_files_are_told_apart(tmp_path):
    assert read_verl(["--", "python3", "-m", "verl.trainer.main_ppo", "data.train_batch_size=8"][1:])[0] == {"data.train_batch_size": 8}
    assert read_verl(["actor_rollout_ref.rollout.n=5"])[0] == {"actor_rollout_ref.rollout.n": 5}
    assert detect(["grpo.yaml"]) == "trl" and detect(["args.json"]) == "trl" and detect(["run.sh"]) == "verl"
    (tmp_path / "args.json").write_text(json.dumps({"num_generations": 4}))
    assert read_trl(str(tmp_path / "args.json")) == {"num_generations": 4}
    (tmp_path / "none.sh").write_text("echo hello\n")
    with pytest.raises(SourceError, match="no line of the script runs verl's trainer"):
        read_verl([str(tmp_path / "none.sh")])


def test_rows_are_counted_only_from_local_files(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": "1"}\n{"prompt": "2"}\n\n')
    assert count_rows([str(tmp_path / "a.jsonl")]) == 2 and count_rows([str(tmp_path / "missing.parquet")]) is None

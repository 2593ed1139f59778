"""`cohort plan` and `cohort train` with a model and a dataset named as on the Hub, from a Hugging Face cache built in
the test in the hub's own layout (and datasets' cache as a download leaves it), with HF_HUB_OFFLINE=1 as
tests/conftest.py sets it: nothing reaches the network."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import yaml

from cohort import cli

COMMIT_V1, COMMIT_MAIN = "1" * 40, "2" * 40
ROWS = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 5)]
SMALL = ["rewards=[{name: accuracy}]", "data.prompt_key=question", "rollout.max_completion_length=8", "rollout.num_generations=2",
         "train.prompts_per_step=2", "train.micro_batch_size=4"]


@pytest.fixture
def hub_names(place_in_hub, place_dataset, tiny_model_dir):
    """`org/tiny` (the random tiny checkpoint) at `v1` and at `main`, and the dataset `org/sums` (train and test)."""
    place_in_hub("org/tiny", tiny_model_dir, commit=COMMIT_V1, refs=("v1",))
    place_in_hub("org/tiny", tiny_model_dir, commit=COMMIT_MAIN, refs=("main",))
    place_dataset("org/sums", {"train": ROWS[:12], "test": ROWS[12:]})


def test_plan_by_hub_names_reads_no_weights(place_in_hub, place_dataset, tiny_model_dir, tmp_path, capsys):
    """Only the config and tokenizer are in the cache (what `cohort plan` fetches online): the plan is made, the
    prompts measured with the model's tokenizer; the memory needs the weights' size, which offline it cannot have."""
    meta = tmp_path / "meta"
    shutil.copytree(tiny_model_dir, meta, ignore=shutil.ignore_patterns("*.safetensors"))
    place_in_hub("org/tiny", meta)
    place_dataset("org/sums", {"train": ROWS[:12], "test": ROWS[12:]})
    assert cli.main(["plan", "model.path=org/tiny", "data.dataset_name=org/sums", "data.dataset_test_split=test", *SMALL]) == 0
    out = capsys.readouterr().out
    # the longest prompt: "4+4=" is 4 characters, one token each with the character tokenizer, and no chat template
    assert "(4 × (longest prompt 4 + max_completion_length 8)); the longest prompt kept, dataset org/sums split " in out, out
    assert "memory                not estimated" in out, out


def test_a_missing_hub_model_is_refused_before_any_weights_load(hub_names, monkeypatch, capsys):
    monkeypatch.setattr("cohort.models.pretrained.load_policy", lambda *a, **k: pytest.fail("weights loaded"))
    assert cli.main(["train", "model.path=org/absent", "data.dataset_name=org/sums", *SMALL]) == 2
    err = capsys.readouterr().err
    assert "model.path = 'org/absent': 'org/absent' is not a local directory, and Hub model org/absent is not in the " \
           "Hugging Face cache" in err
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in err


@pytest.mark.slow
def test_train_by_hub_names_offline_at_a_revision(hub_names, tmp_path):
    """Two steps as a user runs them (the command line, HF_HOME pointing at the cache); model.revision=v1 picks the
    older commit; the run keeps the names, not the cache paths, in its config."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", "model.path=org/tiny", "model.revision=v1",
                           "data.dataset_name=org/sums", "data.dataset_test_split=test", *SMALL, "engine.name=hf",
                           "train.max_steps=2", f"run.output_dir={run_dir}"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:]
    snapshot = tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / COMMIT_V1
    assert f"model.path: org/tiny (commit {COMMIT_V1[:12]}) from the Hugging Face cache, {snapshot}" in proc.stdout
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (saved["model"]["path"], saved["model"]["revision"], saved["data"]["dataset_name"]) == ("org/tiny", "v1", "org/sums")
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    evals = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [(e["label"], e["num_prompts"]) for e in evals] == [("before", 4), ("after", 4)]  # the test split's 4 rows

"""The two example inputs (examples/from_verl, examples/from_trl) convert into configs cohort accepts, and every option
they set is named in the output: beside the cohort field it became, or in the list of what was not mapped."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from cohort.config.resolve import resolve_config
from cohort.convert.core import convert_input, render
from cohort.convert.sources import read_trl, read_verl
from cohort.plan.validate import validate_config

ROOT = Path(__file__).resolve().parents[2]
VERL = ROOT / "examples" / "from_verl" / "run_qwen2-7b_gsm8k_grpo.sh"
TRL = ROOT / "examples" / "from_trl" / "grpo.yaml"


def named_where(text: str, key: str) -> list[str]:
    """The places `key` is named in a rendered conversion: `mapped` (in a field line's comment, as key=value) and/or
    `not mapped` (a line of the closing list that starts with key=)."""
    places = []
    for line in text.splitlines():
        if line.startswith("#   ") and line[4:].startswith(f"{key}="):
            places.append("not mapped")
        elif not line.startswith("#") and "  # " in line and re.search(rf"(^|[ ,(]){re.escape(key)}=", line.split("  # ", 1)[1]):
            places.append("mapped")
    return places


@pytest.mark.parametrize("path, read", [(VERL, lambda p: read_verl([str(p)])[0]), (TRL, lambda p: read_trl(str(p)))])
def test_every_option_of_the_examples_is_named_in_the_output(path, read):
    options = read(path)
    conversion = convert_input([str(path)], rows=7473)
    text = render(conversion)
    unmapped = {u.key for u in conversion.unmapped}
    for key in options:
        places = named_where(text, key)
        assert places, f"{key} is not named in the output"
        # never both: an option is either converted or listed, and each listed one carries a reason
        assert set(places) == ({"not mapped"} if key in unmapped else {"mapped"}), (key, places)
    assert all(u.reason for u in conversion.unmapped)
    # every override of the script (37 lines of key=value) and key of the YAML (43 lines of key: value) was read
    assert len(options) == (37 if path == VERL else 43)


def test_the_verl_example_converts_with_its_units(monkeypatch):
    monkeypatch.setenv("HOME", "/home/user")
    tree = yaml.safe_load(render(convert_input([str(VERL)], rows=7473)))
    # DATA_DIR=${DATA_DIR:-$HOME/data/gsm8k}: the default, with $HOME from the environment
    assert tree["data"]["train_files"] == ["/home/user/data/gsm8k/train.parquet"]
    # 1024 prompts × n=5 = 5120 completions per generation batch; 256 prompts per optimizer step (4 per generation)
    assert tree["rollout"]["generation_batch_size"] == 5120 and tree["train"]["prompts_per_step"] == 256
    # 15 epochs × floor(7473 / 1024) = 7 batches each = 105 generation batches × 4 optimizer steps = 420
    assert tree["train"]["max_steps"] == 420
    # verl's defaults that differ from cohort's and change the run: weight decay 0.01 (cohort 0)
    assert tree["train"]["weight_decay"] == 0.01
    assert tree["rewards"] == [{"name": "verl_default"}]
    assert tree["engine"]["tensor_parallel_size"] == 2 and tree["engine"]["mode"] == "local_server"


def _swapped(model_dir, data) -> list[str]:
    """The model and data swapped for local tiny ones; the completion shortened to fit the tiny model's 256
    positions, and wandb (not installed here) left out: the rest is the converted config."""
    return [f"model.path={model_dir}", f"data.train_files=[{data}]", f"data.eval_files=[{data}]",
            "rollout.max_completion_length=64", "run.loggers=[console, jsonl]"]


@pytest.mark.parametrize("path", [VERL, TRL])
def test_cohort_plan_accepts_the_converted_examples(path, tmp_path, tiny_chat_model_dir):
    data = tmp_path / "train.parquet"  # verl's layout, as its GSM8K preprocessing writes it
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{i}+1=?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": str(i + 1)}, "extra_info": {"split": "train", "index": i}}
        for i in range(40)]), data)
    out = tmp_path / "converted.yaml"
    out.write_text(render(convert_input([str(path)], rows=7473)))
    cfg = resolve_config(out, _swapped(tiny_chat_model_dir, data)).config
    plan = validate_config(cfg).batch
    if path == VERL:  # 1024 prompts per generation batch, 256 per step: 4 steps per generation batch
        assert (plan.prompts_per_generation, plan.prompts_per_step, plan.steps_per_generation) == (1024, 256, 4)
    else:  # 16 × 4 = 64 completions = 8 prompts per step; 8 micro-steps / 4 = 2 steps per generation batch
        assert (plan.prompts_per_step, plan.steps_per_generation, plan.generation_batch_size) == (8, 2, 128)


def test_the_cli_writes_the_yaml_and_lists_what_is_not_mapped_on_stderr(tmp_path, capsys):
    from cohort.cli import main

    out = tmp_path / "grpo.yaml"
    assert main(["convert", str(TRL), "-o", str(out), "--rows", "7473"]) == 0
    err = capsys.readouterr().err
    conversion = convert_input([str(TRL)], rows=7473)
    assert out.read_text() == render(conversion)
    assert err.splitlines()[0] == f"cohort convert: {len(conversion.entries)} cohort fields set from TRL's options; " \
                                  f"{len(conversion.unmapped)} not mapped:"
    assert all(f"  - {u.line('TRL')}" in err for u in conversion.unmapped)
    assert main(["convert", str(tmp_path / "missing.yaml")]) == 2

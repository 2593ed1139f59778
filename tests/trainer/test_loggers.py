"""Metric sinks: TensorBoard after a resume shows each step once; wandb logs offline with no network."""

from __future__ import annotations

import json
import os

import pytest

from cohort.trainer.loggers import MetricsLogger, format_metrics


def log_steps(run_dir, loggers, steps, value, start_step=0):
    logger = MetricsLogger(run_dir, loggers, total_steps=10, progress=False, config={"train": {"max_steps": 10}},
                           start_step=start_step)
    for s in steps:
        logger.log(s, {"reward": value + s, "timing/step_s": 0.1})
    logger.close()


def test_tensorboard_resume_purges_the_tail_of_the_killed_process(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log_steps(tmp_path, ["tensorboard"], [1, 2, 3, 4], 0.0)  # the process that was killed after step 4, checkpoint at 2
    log_steps(tmp_path, ["tensorboard"], [3, 4, 5], 100.0, start_step=2)  # the resumed process
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("reward")] == [(1, 1.0), (2, 2.0), (3, 103.0), (4, 104.0), (5, 105.0)]
    # metrics.jsonl is appended as is; the resume truncates it first (checkpoint.truncate_logs, tested with checkpoints)
    assert [json.loads(l)["step"] for l in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 3, 4, 5]


def test_wandb_offline(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")  # not a dependency: this runs where it is installed
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "unset")  # records the original, so the mode set below is undone after the test
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps(tmp_path, ["wandb"], [1, 2, 3], 0.0)
    assert os.environ["WANDB_MODE"] == "offline"
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline run file written"
    assert wandb.run is None  # finished


def test_step_line_fits_80_columns_and_breaks_only_between_metrics():
    # every console metric present, with the widest values a run produces (negative, exponent, 3-digit step)
    record = {"step": 120, "reward": 0.34375, "reward_std": 0.39901, "frac_reward_zero_std": 0.15625, "loss": -3.4281e-05,
              "kl": 0.00123456, "entropy": 0.571834, "grad_norm": 1581.23, "eval/accuracy": 0.39333,
              "completions/mean_length": 2.8671, "timing/step_s": 0.306291, "learning_rate": 1e-6}
    text = format_metrics(record)
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert lines[0].startswith("step 120 | reward 0.344 | ")
    assert all(line.startswith("  ") for line in lines[1:])  # continuation lines
    # each metric whole on one line, in CONSOLE_KEYS order, 3 significant digits
    items = [item.strip() for line in lines for item in line.split(" | ")]
    assert items == ["step 120", "reward 0.344", "reward_std 0.399", "zero_std 0.156", "loss -3.43e-05", "kl 0.00123",
                     "entropy 0.572", "grad_norm 1.58e+03", "accuracy 0.393", "length 2.87", "step_s 0.306"]
    assert format_metrics({"step": 1, "reward": 0.5}) == "step 1 | reward 0.5"
    assert format_metrics({"step": 2, "tools/call_frequency": 0.75}) == "step 2 | calls 0.75"  # tool runs only

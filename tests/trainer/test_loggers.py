"""Metric sinks: TensorBoard after a resume shows each step once; wandb logs offline with no network."""

from __future__ import annotations

import json
import os

import pytest

from cohort.trainer.loggers import MetricsLogger


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

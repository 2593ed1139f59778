"""Metric sinks: TensorBoard after a resume shows each step once; wandb as the user set it up (offline only when asked)."""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from cohort.runs.loggers import MetricsLogger, format_metrics, wandb_init_args


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


def test_wandb_offline_when_the_user_asks(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")  # not a dependency: this runs where it is installed
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")  # the user's choice, as they would set it
    monkeypatch.setenv("WANDB_SILENT", "true")
    log_steps(tmp_path, ["wandb"], [1, 2, 3], 0.0)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), "no offline run file written"
    assert wandb.run is None  # finished


class FakeWandb(types.ModuleType):
    """Stands in for the wandb package (not installed here) to record how cohort calls it; wandb's own login logic
    (netrc, WANDB_API_KEY, WANDB_MODE) is wandb's, so what is tested is that cohort leaves it all to wandb."""

    def __init__(self):
        super().__init__("wandb")
        self.calls = []

    def init(self, **kwargs):
        self.calls.append((kwargs, os.environ.get("WANDB_MODE")))
        return types.SimpleNamespace(log=lambda record, step: None, finish=lambda: None)


def test_a_wandb_login_in_netrc_without_a_key_in_the_environment_is_not_made_offline(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password " + "0" * 40 + "\n")  # `wandb login`
    monkeypatch.setenv("HOME", str(home))
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    run_dir = tmp_path / "run-1"
    run_dir.mkdir()
    logger = MetricsLogger(run_dir, ["wandb"], total_steps=10, progress=False, config={"train": {"max_steps": 10}},
                           wandb_project="my-project")
    logger.close()
    [(kwargs, mode)] = fake.calls
    assert mode is None and "WANDB_MODE" not in os.environ and "mode" not in kwargs  # wandb decides: online with the key
    assert kwargs == {"dir": str(run_dir), "config": {"train": {"max_steps": 10}}, "name": "run-1", "project": "my-project"}


def test_wandb_project_is_left_to_wandb_unless_the_field_is_set(tmp_path):
    """Without run.wandb_project, no project argument: wandb reads WANDB_PROJECT (and WANDB_ENTITY) itself."""
    assert "project" not in wandb_init_args(tmp_path, {}, None)
    assert wandb_init_args(tmp_path, {}, "p")["project"] == "p"


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

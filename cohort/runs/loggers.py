"""Metric sinks and the progress display.

`metrics.jsonl` is always written (one JSON object per step, flushed each line, so
nothing is lost on a crash; a resumed run appends to it). TensorBoard and wandb
are optional sinks, created only when named in `run.loggers`. wandb logs in as the
user set it up (`wandb login`'s ~/.netrc, WANDB_API_KEY, WANDB_MODE=offline or
disabled, WANDB_PROJECT, WANDB_ENTITY): nothing here sets or reads those; the run's
project is `run.wandb_project` when given, and the resolved config is logged with it.
The console shows a rich progress bar with ETA and the live reward, and prints a
compact line of key metrics every `every` steps, wrapped at metric boundaries to
80 columns. Both go to `cohort.console.terminal()`, the terminal even while the
engine's output is captured into RUN_DIR/logs/engine.log.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from cohort.console import terminal

CONSOLE_KEYS = {  # metric → its short name on the console step line (metrics.jsonl keeps the full names)
    "reward": "reward", "reward_std": "reward_std", "frac_reward_zero_std": "zero_std", "loss": "loss", "kl": "kl",
    "entropy": "entropy", "grad_norm": "grad_norm", "eval/accuracy": "accuracy", "completions/mean_length": "length",
    "timing/step_s": "step_s",
    "dynamic_sampling/groups_dropped": "dropped",  # (pipeline.dynamic_sampling only: constant groups replaced this step)
    "partial/aborted": "cut",  # (pipeline.over_provision only: requests interrupted this step, resumed later)
    "staleness/max": "stale",  # (off-policy tokens only: versions behind the policy, at most pipeline.max_staleness)
    "tools/call_frequency": "calls",  # (tools.functions / tools.environment only: share of trajectories that called one)
    "tools/tagged_share": "tagged",  # (the same: calls written in the template's tags, over all written)
    "tools/ignored_calls": "ignored",  # (the same: calls written that tools.parser did not read)
}


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


class JsonlWriter:
    def __init__(self, path: Path):
        self.fh = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self.fh.write(json.dumps({k: _jsonable(v) for k, v in record.items()}) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


class MetricsLogger:
    def __init__(self, run_dir: Path, loggers: list[str], *, total_steps: int, progress: bool, config: dict, every: int = 10,
                 start_step: int = 0, wandb_project: str | None = None):
        self.run_dir = run_dir
        self.jsonl = JsonlWriter(run_dir / "metrics.jsonl")
        self.console = "console" in loggers
        self.every = every
        self.tb = self._tensorboard(run_dir, start_step) if "tensorboard" in loggers else None
        self.wandb = self._wandb(wandb_init_args(run_dir, config, wandb_project)) if "wandb" in loggers else None
        self.progress = None
        if progress:
            # no stdout/stderr redirection: what libraries print belongs in the engine log, not above the bar
            self.progress = Progress(TextColumn("[bold]training"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                     TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.description}"),
                                     console=Console(file=terminal()), redirect_stdout=False, redirect_stderr=False)
            self.task = self.progress.add_task("", total=total_steps, completed=start_step)
            self.progress.start()

    @staticmethod
    def _tensorboard(run_dir: Path, start_step: int):
        try:  # here, not at the top: it loads tensorboard and protobuf (about a second), for runs that log to it only
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard not installed
            raise RuntimeError("run.loggers has 'tensorboard' but the tensorboard package is missing; pip install tensorboard") from exc
        # purge_step: on resume, TensorBoard hides what the interrupted process logged after the checkpoint
        return SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1 if start_step else None)

    @staticmethod
    def _wandb(init_args: dict[str, Any]):
        try:  # optional dependency
            import wandb
        except ImportError as exc:
            raise RuntimeError("run.loggers has 'wandb' but wandb is not installed; pip install wandb") from exc
        return wandb.init(**init_args)

    def print(self, text: str) -> None:
        """Notices (resume, warnings, stops) are always shown; `console` only governs the per-step metric lines."""
        if self.progress is not None:
            self.progress.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=terminal(), flush=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        self.jsonl.write(record)
        if self.tb is not None:
            for k, v in record.items():
                if isinstance(v, (int, float)) and k != "step":
                    self.tb.add_scalar(k, v, step)
        if self.wandb is not None:
            self.wandb.log(record, step=step)
        if self.progress is not None:
            reward = record.get("reward")
            desc = f"reward {reward:.3f}" if isinstance(reward, (int, float)) else ""
            self.progress.update(self.task, completed=step, description=desc)
        if self.console and (step % self.every == 0 or step == 1):
            self.print(format_metrics(record))

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        self.jsonl.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def wandb_init_args(run_dir: Path, config: dict, project: str | None) -> dict[str, Any]:
    """wandb.init's arguments: the run directory, the resolved config, the run's name, and `project` only when
    run.wandb_project is set (else wandb reads WANDB_PROJECT itself). No mode: wandb decides online or offline from
    the user's login and WANDB_MODE, so a key in ~/.netrc (`wandb login`) logs online."""
    args: dict[str, Any] = {"dir": str(run_dir), "config": config, "name": run_dir.name}
    if project:
        args["project"] = project
    return args


def format_metrics(record: dict[str, Any], width: int = 80) -> str:
    """`step N | name value | ...` for the CONSOLE_KEYS present, wrapped between metrics into lines of at most `width`
    columns (continuation lines indented), so an 80-column terminal never breaks a metric in two."""
    parts = [f"step {record.get('step')}"]
    for key, label in CONSOLE_KEYS.items():
        value = record.get(key)
        if isinstance(value, (int, float)):
            parts.append(f"{label} {value:.3g}")
    lines, line = [], parts[0]
    for part in parts[1:]:
        if len(line) + 3 + len(part) <= width:
            line += " | " + part
        else:
            lines.append(line)
            line = "  " + part
    return "\n".join([*lines, line])

"""Where `cohort train` runs its training processes, decided before any model loads.

- `distributed.backend=ray`: this process becomes a Ray driver
  (`cohort.launch.ray_cluster`); trainer and rollout-server actors do the work.
- `train.num_processes=N > 1`: re-launch `cohort train` under torchrun with N
  local processes (`--standalone` rendezvous on a free local port), with
  `run.output_dir` pinned so that every rank agrees on the run directory.
- otherwise (or already under torchrun, WORLD_SIZE set): train here (`train_here`).

`run_config` is the one orchestration of a run that `cohort train` and `cohort.train` both call, with the plan their
validation returned (cohort/plan/run_plan.py): launch elsewhere when asked (Ray actors receive the plan), else train
here with it.

Before any of these, `fetch_by_name` downloads what the config names by its Hub name (model.path, critic.path, a
reward model, data.dataset_name) into the Hugging Face cache, in this process, on the terminal with its progress
bars: the torchrun children and the trainer then read it from the cache, so a download happens once per node,
not once per rank (Ray actors on other nodes fetch into their own node's cache).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from cohort.config import CohortConfig, ConfigError, default_output_dir
from cohort.console import capture_output
from cohort.data.datasets import DataError
from cohort.data.named import named_splits
from cohort.launch.ray_cluster import train_with_ray
from cohort.models import hub
from cohort.models.pretrained import ModelLoadError, resolve_model_dir
from cohort.plan.run_plan import RunPlan
from cohort.runs.jsonl import RunFileError
from cohort.trainer.checkpoint import CheckpointError
from cohort.trainer.failure import setup_failed
from cohort.trainer.run import run_training
from cohort.trainer.trainer import Trainer

# Problems of the config, data, model, a checkpoint or a run directory's file: raised as they are worded (the command
# line prints them and exits 2), never wrapped as a run failure.
USER_ERRORS: tuple[type[Exception], ...] = (ConfigError, DataError, ModelLoadError, CheckpointError, RunFileError)


def run_config(plan: RunPlan, cli_args: list[str], *, resume: str | None = None) -> dict | int | None:
    """The one orchestration of a run, for `cohort train` (cli.cmd_train) and `cohort.train` (api.run): torchrun
    children or Ray actors when the config asks (`launch_elsewhere`: torchrun re-runs `cohort <cli_args>`, Ray actors
    receive the plan), else train in this process (`train_here`). Returns rank 0's summary, the torchrun children's
    exit status, or None on a rank > 0 of a multi-process run. `plan`: what validating the config returned (nothing
    validates it again)."""
    outcome = launch_elsewhere(plan, cli_args)
    if outcome is not None:
        return outcome
    return train_here(plan, resume)


def train_here(plan: RunPlan, resume: str | None = None) -> dict | None:
    """Train in this process, the engine's and libraries' output going to RUN_DIR/logs/engine.log (cohort/console.py).

    Returns the summary (None on ranks > 0). A failure that is not a config, data, model or checkpoint problem
    (`USER_ERRORS`, raised as they are) becomes `RunFailed`: one message, the traceback in RUN_DIR/logs/error.log."""
    cfg = plan.config
    run_dir = Path(cfg.run.output_dir or default_output_dir())
    rank = int(os.environ.get("RANK", "0"))
    with capture_output(run_dir / "logs" / ("engine.log" if rank == 0 else f"engine-rank{rank}.log"), verbose=cfg.run.verbose) as term:
        started = time.perf_counter()
        if rank == 0:  # (the silence before the first eval line: say what it is)
            print(_starting_line(cfg), file=term, flush=True)
        try:
            trainer = Trainer(plan, run_dir=run_dir)
        except USER_ERRORS:
            raise
        except Exception as exc:  # loading, starting the engine: RunFailed from it
            raise setup_failed(run_dir, exc) from exc
        if rank == 0:
            print(f"started in {time.perf_counter() - started:.0f} s (what the engine printed: {run_dir / 'logs' / 'engine.log'})",
                  file=term, flush=True)
        try:
            summary = run_training(trainer, resume_from=resume)  # raises RunFailed itself, after saving what it can
        finally:
            trainer.close()
    return summary if trainer.parts.dist.is_main else None


def _starting_line(cfg: CohortConfig) -> str:
    """The console's line before the model loads and the engine starts (tens of seconds on a CPU, minutes for a big model)."""
    engine = {"vllm": "vLLM", "hf": "the transformers engine"}.get(cfg.engine.name, cfg.engine.name)
    where = {"colocate": "", "local_server": " in a child process"}.get(cfg.engine.mode, f" at {', '.join(cfg.engine.server_urls or [])}")
    return f"loading {cfg.model.path} and starting {engine}{where} ..."


def torchrun_command(num_processes: int, cli_args: list[str], output_dir: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_processes}",
            "-m", "cohort.cli", *cli_args, f"run.output_dir={output_dir}"]


def launch_elsewhere(plan: RunPlan, cli_args: list[str]) -> dict | int | None:
    """None: train in this process. Else rank 0's summary (Ray) or the torchrun child's exit code. First (not in a
    torchrun child: its parent did it) whatever is named by its Hub name is fetched (`fetch_by_name`)."""
    cfg = plan.config
    if "WORLD_SIZE" in os.environ:
        return None
    for line in fetch_by_name(cfg):
        print(line, flush=True)
    if cfg.distributed.backend == "ray":
        return train_with_ray(plan)
    if cfg.train.num_processes <= 1:
        return None
    output_dir = cfg.run.output_dir or default_output_dir()
    print(f"cohort: starting {cfg.train.num_processes} training processes (torchrun); run directory {output_dir}", flush=True)
    return subprocess.call(torchrun_command(cfg.train.num_processes, cli_args, output_dir))


def fetch_by_name(cfg) -> list[str]:
    """Resolve every model and dataset `cfg` names by its Hub name (downloading what the cache lacks, when the network
    is allowed); returns one line per Hub model: its id, revision and snapshot directory. Raises ModelLoadError /
    DataError as loading would (validation has already checked the same names, without the weights)."""
    lines = []
    for field, path, revision in _hub_models(cfg):
        snapshot = resolve_model_dir(path, revision)
        lines.append(f"{field}: {path} (commit {snapshot.name[:12]}) from the Hugging Face cache, {snapshot}")
    if cfg.data.dataset_name:
        named_splits(cfg.data.dataset_name, cfg.data.dataset_config)
    return lines


def _hub_models(cfg) -> list[tuple[str, str, str | None]]:
    """(field, path, revision) of each model path in `cfg` that is a Hub id, not a local directory."""
    named = [("model.path", cfg.model.path, cfg.model.revision)]
    named += [("critic.path", cfg.critic.path, None)] if cfg.critic.path else []
    for i, spec in enumerate(cfg.rewards or []):
        options = spec.options()
        if spec.name == "reward_model" and isinstance(options.get("model"), str):
            named.append((f"rewards[{i}].model", options["model"], options.get("revision")))
    return [(field, path, revision) for field, path, revision in named
            if not os.path.isdir(os.path.expanduser(path)) and hub.looks_like_hub_id(path)]

"""Where `cohort train` runs its training processes, decided before any model loads.

- `distributed.backend=ray`: this process becomes a Ray driver
  (`cohort.launch.ray_cluster`); trainer and rollout-server actors do the work.
- `train.num_processes=N > 1`: re-launch `cohort train` under torchrun with N
  local processes (`--standalone` rendezvous on a free local port), with
  `run.output_dir` pinned so that every rank agrees on the run directory.
- otherwise (or already under torchrun, WORLD_SIZE set): train here.
"""

from __future__ import annotations

import os
import subprocess
import sys

from cohort.config import default_output_dir
from cohort.launch.ray_cluster import train_with_ray


def torchrun_command(num_processes: int, cli_args: list[str], output_dir: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_processes}",
            "-m", "cohort.cli", *cli_args, f"run.output_dir={output_dir}"]


def launch_elsewhere(cfg, cli_args: list[str]) -> dict | int | None:
    """None: train in this process. Else rank 0's summary (Ray) or the torchrun child's exit code."""
    if "WORLD_SIZE" in os.environ:
        return None
    if cfg.distributed.backend == "ray":
        return train_with_ray(cfg)
    if cfg.train.num_processes <= 1:
        return None
    output_dir = cfg.run.output_dir or default_output_dir()
    print(f"cohort: starting {cfg.train.num_processes} training processes (torchrun); run directory {output_dir}", flush=True)
    return subprocess.call(torchrun_command(cfg.train.num_processes, cli_args, output_dir))

"""`train.num_processes=N`: re-launch `cohort train` under torchrun with N local processes.

The same command line runs in every process (torchrun's `--standalone`
rendezvous on a free local port), with `run.output_dir` pinned so that every
rank agrees on the run directory. For several machines, run torchrun (or Ray,
`distributed.backend=ray`) yourself; see docs/deployment.md.
"""

from __future__ import annotations

import os
import subprocess
import sys


def torchrun_command(num_processes: int, cli_args: list[str], output_dir: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={num_processes}",
            "-m", "cohort.cli", *cli_args, f"run.output_dir={output_dir}"]


def relaunch_under_torchrun(cfg, cli_args: list[str]) -> int | None:
    """The exit code of the torchrun child when this process should hand over to it; None to train here."""
    if cfg.train.num_processes <= 1 or "WORLD_SIZE" in os.environ:
        return None
    from cohort.config import default_output_dir

    output_dir = cfg.run.output_dir or default_output_dir()
    print(f"cohort: starting {cfg.train.num_processes} training processes (torchrun); run directory {output_dir}", flush=True)
    return subprocess.call(torchrun_command(cfg.train.num_processes, cli_args, output_dir))

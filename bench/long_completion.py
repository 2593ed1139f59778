"""The long-completion benchmark: 8 prompts × G=8 per step, max_completion_length 128 and 256.

The tiny benchmark model's random lengths are long-tailed (transformers'
default initialisation leaves the end-of-text token about 1/259 likely at each
step: measured p50 ≈ 130, a third cut at 256), so padding and the engine's
handling of ragged batches matter here. Each length runs in a fresh process
(its own vLLM engine and a clean peak-RSS reading) through grpo_step.py with
`--limits`, which also reports how close generation is to the engine's raw
tokens/s and the update to a bare forward+backward over the same sequences.

    .venv/bin/python bench/long_completion.py [--lengths 128 256] [--steps 6] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import _common as common


def run_cohort(length: int, steps: int, extra: list[str], engine: str = "vllm") -> dict:
    cmd = [sys.executable, str(common.BENCH_DIR / "grpo_step.py"), "--name", "long_completion", "--engine", engine,
           "--prompts-per-step", "8", "--num-generations", "8", "--max-completion-length", str(length),
           "--steps", str(steps), "--limits"]
    for item in extra:
        cmd += ["--set", item]
    return last_json(subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO))


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The benchmark's JSON line (the last stdout line that parses as an object)."""
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{\""):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return {"error": f"exit {proc.returncode}", "stderr_tail": proc.stderr[-3000:]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--set", dest="extra", action="append", default=[])
    args = ap.parse_args(argv)
    result = {"benchmark": "long_completion", "trainer": "cohort",
              "runs": {str(n): run_cohort(n, args.steps, args.extra, args.engine) for n in args.lengths}}
    common.emit(result)
    return result


if __name__ == "__main__":
    main()

"""`cohort train` as a user runs it, with vLLM: a quiet console, and a failure that reads as one message.

The embedded demo (tiny:arith on vLLM) with a reward that raises in step 3: call 1 is the
"before" eval (one call for the whole eval set); training then scores groups as they finish, in
as many calls as the engine's polls make, so the reward counts completions, not calls: it raises
on the first call past the 2 × 512 completions of steps 1 and 2 (64 prompts × G=8 per step, the
demo preset), so the run fails in step 3 after two good steps. Before this, such a run printed
about 25 start-up warnings, two vLLM "Failed to load weights" lines per step and a
30-line traceback with every line prefixed `[rank0]:`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from cohort.config.demo import DEMO_PRESET
from cohort.trainer import checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.builtin_models('arith')]

REWARD_MODULE = textwrap.dedent('''
    import os
    CALLS = [0]
    TRAINED = [0]  # completions scored after the "before" eval (calls 1 and 2: greedy, then pass@k's samples)

    def exact_or_raise(prompts, completions, answer, **kwargs):
        CALLS[0] += 1
        if CALLS[0] > 2:
            TRAINED[0] += len(completions)
            if TRAINED[0] > int(os.environ["COHORT_TEST_FAIL_AFTER"]):
                raise ValueError("the grader lost its answer key")
        return [float(c.strip() == a) for c, a in zip(completions, answer)]
''')
STEP_COMPLETIONS = DEMO_PRESET["train"]["prompts_per_step"] * DEMO_PRESET["rollout"]["num_generations"]  # 64 × 8
COHORT_LINES = ("config: ", "loading tiny:arith and starting vLLM ...", "started in ", "eval before training: ", "step ",
                "  ", "training ", "cohort: run failed at step 3 (reward): ",
                "Saved the last good state (after step 2) to ", "Full traceback: ")


def test_vllm_run_console_has_only_cohort_lines_and_a_failure_is_one_message(tmp_path):
    pytest.importorskip("vllm")
    (tmp_path / "console_test_rewards.py").write_text(REWARD_MODULE)
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
               COHORT_TEST_FAIL_AFTER=str(2 * STEP_COMPLETIONS))
    proc = subprocess.run([sys.executable, "-m", "cohort.cli", "train", "train.max_steps=5", f"run.output_dir={run_dir}",
                           "rewards=[{name: 'console_test_rewards:exact_or_raise'}]"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 4, proc.stdout[-3000:]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step 1 | "))
    assert first_step <= 15, lines[:first_step]  # the bar (measured: 1, the "before" eval line)
    strays = [line for line in lines if not line.startswith(COHORT_LINES)]
    assert strays == [], strays  # no vLLM, transformers, torch or C++ line, at start-up or per step
    assert "[rank0]" not in proc.stdout and "Traceback" not in proc.stdout
    step_lines = [line for line in lines if line.startswith(("step ", "  "))]
    assert all(len(line) <= 80 for line in step_lines), step_lines
    assert lines[-1] == f"Full traceback: {run_dir}/logs/error.log"
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000002"
    engine_log = (run_dir / "logs" / "engine.log").read_text()
    assert "WARNING" in engine_log  # vLLM's start-up notices went here ...
    assert "Failed to load weights" not in engine_log  # ... but never the expected reload warnings
    assert "ValueError: the grader lost its answer key" in (run_dir / "logs" / "error.log").read_text()

"""Failures a user meets first end in one line with the fix on the console, the traceback only in the run's logs
(issue 53, defects 11 and 12): the whole of a long refusal reaches the console (an OpenEnv server with too few
sessions), and only the real cause of an environment that fails to import is printed. Each runs the command line
(`cohort.cli.main`) and reads what it printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cohort import cli
from cohort.trainer import failure

from tests.tools.test_openenv import free_port, serve_guess


def _rows(path: Path, n: int = 4) -> str:
    path.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"Guess {i}."}], "target": i % 4}) + "\n"
                            for i in range(n)))
    return str(path)


def test_a_long_failure_line_is_kept_whole_up_to_its_fix_and_a_dump_keeps_both_ends():
    fix = "Serve it with create_app(..., max_concurrent_envs=16)"
    refusal = ValueError("x" * 900 + fix)  # 900 + 52 characters: over the old 300-character cut, under 2,000
    assert failure.describe(refusal) == f"ValueError: {'x' * 900}{fix}"
    dump = failure.describe(RuntimeError("a" * 1000 + "b" * 3000 + "c" * 1000))  # 5,000 + "RuntimeError: " (14)
    # the first 600 characters ("RuntimeError: " + 586 a's) and the last 600 (c's), 5,014 - 1,200 = 3,814 left out
    assert dump == f"RuntimeError: {'a' * 586} ... (3,814 characters left out) ... {'c' * 600}"


@pytest.mark.slow  # starts an OpenEnv server under uvicorn (~20 s under load)
@pytest.mark.builtin_models("tool_calc")
def test_the_openenv_capacity_refusal_reaches_the_console_with_its_fix(tmp_path, capsys):
    port = free_port()
    server = serve_guess(port, sessions=1)  # openenv's create_app(..., max_concurrent_envs=1)
    try:
        code = cli.main(["train", "model.path=tiny:tool_calc", f"data.train_files=[{_rows(tmp_path / 'rows.jsonl')}]",
                         f"tools.environment=ws://127.0.0.1:{port}", "tools.parser=hermes", "rewards=[]",
                         "rollout.num_generations=2", "train.prompts_per_step=2", "train.micro_batch_size=4",
                         "rollout.max_completion_length=16", "run.eval_every=0", f"run.output_dir={tmp_path / 'run'}"])
    finally:
        server.kill()
        server.wait()
    err = capsys.readouterr().err
    assert code == 4
    # 2 prompts × 2 completions = 4 sessions open at once; the server takes 1
    (line,) = [line for line in err.splitlines() if "accepted 1 of the 4" in line]
    assert line.endswith("Serve it with `create_app(MyEnv, MyAction, MyObservation, max_concurrent_envs=4)` and set "
                         "`SUPPORTS_CONCURRENT_SESSIONS = True` on the environment class (only if its instances share no "
                         "state), or lower train.prompts_per_step")
    assert f"Full traceback: {tmp_path / 'run' / 'logs' / 'error.log'}" in err

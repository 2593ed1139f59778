"""Run-time failures: one short message, the traceback in logs/error.log, the last consistent state saved, exit 4.

Run as a user runs it (`python -m cohort.cli train ...` in a subprocess, engine.name=hf:
the engine is not the point). The failing reward behaves like `sevens` below except on
the call named by COHORT_TEST_FAIL_AT_CALL, so the run it fails and the run that
resumes it train on the same rewards as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from cohort import cli
from cohort.config.resolve import load_config
from cohort.trainer import checkpoint, failure
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from tests.builders import write_doubling

REWARD_MODULE = textwrap.dedent('''
    import os
    CALLS = [0]

    def sevens(prompts, completions, **kwargs):
        """Share of "7" in the completion; raises on call COHORT_TEST_FAIL_AT_CALL (one call per generation batch)."""
        CALLS[0] += 1
        if os.environ.get("COHORT_TEST_FAIL_AT_CALL") == str(CALLS[0]):
            raise ValueError("the grader lost its answer key")
        return [c.count("7") / max(1, len(c)) for c in completions]

    def short_list(prompts, completions, **kwargs):
        """Breaks the contract: one value too few."""
        return [0.0] * (len(completions) - 1)
''')


@pytest.fixture
def user_setup(tmp_path, monkeypatch):
    (tmp_path / "fail_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fail_test_rewards", raising=False)  # a fresh call counter per test
    monkeypatch.delenv("COHORT_TEST_FAIL_AT_CALL", raising=False)
    data = tmp_path / "train.jsonl"
    write_doubling(data, 12)
    return tmp_path, data


def overrides(model_dir, data, run_dir, reward, *extra):
    return [
        f"model.path={model_dir}", f"data.train_files=[{data}]", "data.max_prompt_length=16", "engine.name=hf",
        "rollout.num_generations=4", "rollout.max_completion_length=6", "train.prompts_per_step=2", "train.micro_batch_size=8",
        "train.learning_rate=3e-3", "train.num_threads=1", f"rewards=[{{name: 'fail_test_rewards:{reward}'}}]",
        f"run.output_dir={run_dir}", "run.progress=false", *extra,
    ]


def run_cli(tmp_path, args, **env_extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
               **env_extra)
    env.pop("COHORT_TEST_FAIL_AT_CALL", None)
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "cohort.cli", "train", *args], env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_reward_that_raises_at_step_3_saves_step_2_and_resume_finishes_the_run(user_setup, tiny_model_dir):
    tmp_path, data = user_setup
    run_dir = tmp_path / "run"
    proc = run_cli(tmp_path, overrides(tiny_model_dir, data, run_dir, "sevens", "train.max_steps=5"), COHORT_TEST_FAIL_AT_CALL="3")
    assert proc.returncode == 4, proc.stderr[-3000:]
    err = proc.stderr.splitlines()
    # one message: what failed (the function, the step, the phase, the completion), what was saved, where the traceback is
    assert err[0] == ("cohort: run failed at step 3 (reward): reward function 'sevens' failed: "
                      "ValueError: the grader lost its answer key"), err
    assert err[1].startswith("  completion[0] of 8 (the call failed as a whole; the row is unknown): ")
    assert err[2] == (f"Saved the last good state (after step 2) to {run_dir}/checkpoints/step-000002. "
                      f"Fix the cause, then resume with: cohort train --resume {run_dir}")
    assert err[3] == f"Full traceback: {run_dir}/logs/error.log"
    assert len(err) == 4
    assert "Traceback" not in proc.stderr + proc.stdout and "[rank0]" not in proc.stderr + proc.stdout
    log = (run_dir / "logs" / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "ValueError: the grader lost its answer key" in log
    assert 'fail_test_rewards.py", line' in log  # down to the user's own frame
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000002"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]

    # the printed command continues the run (the reward no longer fails) ...
    resumed = run_cli(tmp_path, ["--resume", str(run_dir)])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {run_dir}/checkpoints/step-000002 at step 2" in resumed.stdout
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]
    # ... exactly as if it had never failed: the rewound state is the one after step 2
    reference = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "ref", "sevens", "train.max_steps=5")))
    try:
        run_training(reference)
        final = Trainer(load_config(None, overrides(run_dir / "final", data, tmp_path / "final", "sevens", "train.max_steps=5")))
        for (name, p), q in zip(reference.parts.policy.named_parameters(), final.parts.policy.parameters()):
            assert torch.equal(p, q), name
        final.close()
    finally:
        reference.close()


@pytest.mark.slow
def test_a_contract_breach_at_step_1_saves_nothing_and_says_so(user_setup, tiny_model_dir, capsys):
    tmp_path, data = user_setup
    run_dir = tmp_path / "short"
    code = cli.main(["train", *overrides(tiny_model_dir, data, run_dir, "short_list", "train.max_steps=3")])
    err = capsys.readouterr().err
    err = err[err.index("cohort: "):]  # (in-process, pytest's sys.stderr also got the libraries' load bars)
    assert code == 4
    assert err.startswith("cohort: run failed at step 1 (reward): reward function 'short_list' returned "
                          "7 values for 8 completions; it must return a list with one float or None per completion\n")
    assert "Nothing saved (no step had completed); run again once the cause is fixed." in err
    assert checkpoint.latest_checkpoint(run_dir) is None
    assert "RewardError" in (run_dir / "logs" / "error.log").read_text()


def small_trainer(model_dir, data, run_dir, *extra) -> Trainer:
    return Trainer(load_config(None, overrides(model_dir, data, run_dir, "sevens", "train.max_steps=4", *extra)))


@pytest.mark.slow
def test_failure_after_the_optimizer_step_saves_nothing_half_updated(user_setup, tiny_model_dir):
    # a step post-hook that raises in step 2: the weights are step 2's, the counters still step 1's
    tmp_path, data = user_setup
    trainer = small_trainer(tiny_model_dir, data, tmp_path / "half", "run.save_every=1")

    def fail_in_step_2(optimizer, args, kwargs):
        if trainer.state.policy_version == 1:
            raise RuntimeError("optimizer hook broke")

    trainer.parts.optimizer.register_step_post_hook(fail_in_step_2)
    try:
        with pytest.raises(failure.RunFailed) as err:
            run_training(trainer)
    finally:
        trainer.close()
    message = str(err.value)
    assert message.startswith("run failed at step 2 (update): RuntimeError: optimizer hook broke\n")
    assert (f"Nothing saved: the failure came after the optimizer step and before the step was recorded, so the state is "
            f"half-updated; the newest checkpoint is {tmp_path / 'half'}/checkpoints/step-000001.") in message
    assert checkpoint.latest_checkpoint(tmp_path / "half").name == "step-000001"  # from run.save_every=1, nothing newer


@pytest.mark.slow
def test_failed_weight_push_after_a_complete_step_saves_that_step(user_setup, tiny_model_dir, monkeypatch):
    tmp_path, data = user_setup
    trainer = small_trainer(tiny_model_dir, data, tmp_path / "push")
    real_sync = trainer.sync.push

    def failing_sync():  # after step 2 is recorded (step_count 2), before step 3 generates
        if trainer.state.step == 2:
            raise ConnectionError("rollout server went away")
        real_sync()

    monkeypatch.setattr(trainer.sync, "push", failing_sync)
    try:
        with pytest.raises(failure.RunFailed) as err:
            run_training(trainer)
        saved = checkpoint.latest_checkpoint(tmp_path / "push")
        assert saved.name == "step-000002"
        assert json.loads((saved / "meta.json").read_text())["policy_version"] == 2  # the weights after step 2's update
    finally:
        trainer.close()
    assert str(err.value).startswith("run failed at step 2: ConnectionError: rollout server went away\n"
                                     f"Saved the last good state (after step 2) to {saved}.")


def test_describe_keeps_cohort_messages_and_names_foreign_types():
    from cohort.rewards.reward_set import RewardError

    assert failure.describe(RewardError("reward function 'f' failed")) == "reward function 'f' failed"
    assert failure.describe(KeyError("x")) == "KeyError: 'x'"
    long = failure.describe(RuntimeError("\n".join(f"line {i}" for i in range(10))))
    assert long.splitlines() == ["RuntimeError: line 0", "line 1", "line 2", "line 3", "  ..."]


def test_an_engine_that_cannot_start_is_one_message_and_exit_4(user_setup, tiny_model_dir, capsys, monkeypatch):
    tmp_path, data = user_setup
    run_dir = tmp_path / "noserver"
    monkeypatch.setenv("COHORT_SERVER_TOKEN", "t")
    # port 9 (discard) on loopback: nothing listens, the connection is refused at once
    code = cli.main(["train", *overrides(tiny_model_dir, data, run_dir, "sevens", "engine.mode=server",
                                         "engine.server_urls=[http://127.0.0.1:9]", "engine.server_timeout_s=5")])
    err = capsys.readouterr().err
    err = err[err.index("cohort: "):]
    assert code == 4
    assert err.startswith("cohort: run failed before training started: rollout server http://127.0.0.1:9/health: ")
    assert err.endswith(f"\nFull traceback: {run_dir}/logs/error.log\n") and err.count("\n") == 2
    assert "RemoteEngineError" in (run_dir / "logs" / "error.log").read_text()


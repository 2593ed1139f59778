"""Stopping: SIGTERM finishes the step, saves and exits 0; a second signal aborts; a NaN loss stops after saving.

The NaN trigger is a reward function whose scale overflows float32 from its third
call on (0 and 3e38 in one group: the group's sum is inf, its mean inf, so the
advantages and the loss are NaN). That is a real failure mode (a reward on the
wrong scale), and the run must stop at step 3 with the state after step 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from cohort import cli
from cohort.config.resolve import load_config
from cohort.trainer import checkpoint
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from cohort.trainer.stopping import GracefulStop, NonFiniteError, check_finite
from tests.builders import tiny_run, write_doubling

REWARD_MODULE = textwrap.dedent('''
    import os, pathlib, time
    CALLS = [0]

    def slow_sevens(prompts, completions, **kwargs):
        """Share of "7"; in call N (when asked) it announces itself, then takes a few seconds."""
        CALLS[0] += 1
        if os.environ.get("COHORT_TEST_BLOCK_AT_CALL") == str(CALLS[0]):
            pathlib.Path(os.environ["COHORT_TEST_MARKER"]).write_text("in step")
            time.sleep(float(os.environ["COHORT_TEST_SLEEP_S"]))
        return [c.count("7") / max(1, len(c)) for c in completions]

    def overflowing(prompts, completions, **kwargs):
        """Fine for two calls, then a reward scale float32 cannot sum."""
        CALLS[0] += 1
        if CALLS[0] >= 3:
            return [3e38 if i % 2 else 0.0 for i in range(len(completions))]
        return [c.count("7") / max(1, len(c)) for c in completions]
''')


@pytest.fixture
def user_setup(tmp_path, monkeypatch):
    (tmp_path / "stop_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stop_test_rewards", raising=False)  # a fresh call counter per test
    data = tmp_path / "train.jsonl"
    write_doubling(data, 12)
    return tmp_path, data


def overrides(model_dir, data, run_dir, reward, *extra):
    return tiny_run(model_dir, data, run_dir, "engine.name=hf", "rollout.max_completion_length=6", "train.prompts_per_step=2",
                    "train.micro_batch_size=8", "train.learning_rate=3e-3", "train.num_threads=1",
                    f"rewards=[{{name: 'stop_test_rewards:{reward}'}}]", *extra)


@pytest.mark.slow
def test_sigterm_finishes_the_step_saves_and_exits_0(user_setup, tiny_model_dir):
    tmp_path, data = user_setup
    run_dir, marker = tmp_path / "run", tmp_path / "in-step-2"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1",
               COHORT_TEST_BLOCK_AT_CALL="2", COHORT_TEST_MARKER=str(marker), COHORT_TEST_SLEEP_S="3")
    args = overrides(tiny_model_dir, data, run_dir, "slow_sevens", "train.max_steps=50")
    proc = subprocess.Popen([sys.executable, "-m", "cohort.cli", "train", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # while step 2's rewards are being computed
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-3000:]
    assert "received SIGTERM: finishing the current step" in out
    assert f"stopped by SIGTERM after step 2; checkpoint {run_dir}/checkpoints/step-000002. Resume with: cohort train --resume {run_dir}" in out
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000002"
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "SIGTERM" and summary["steps"] == 2
    assert not (run_dir / "final").exists()  # not finished: no final model

    # and the stop checkpoint resumes exactly: 4 steps uninterrupted == 2 + stop + 2
    reference = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "ref", "slow_sevens", "train.max_steps=4")))
    run_training(reference)
    resumed = Trainer(load_config(run_dir / "config.yaml", ["train.max_steps=4"]))
    summary = run_training(resumed, resume_from=run_dir)
    assert summary["steps"] == 4
    for (name, p), q in zip(reference.parts.policy.named_parameters(), resumed.parts.policy.parameters()):
        assert torch.equal(p, q), name
    reference.close()
    resumed.close()


def test_second_signal_aborts_at_once():
    notices, before = [], signal.getsignal(signal.SIGTERM)
    # (abort_after_s infinite: the watcher armed by the second signal must never end this pytest process, whose exit
    # may wait on other tests' threads; the abort itself is the subprocess test below)
    with GracefulStop(notices.append, abort_after_s=float("inf")) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handler runs in the main thread between bytecodes
        assert stop.requested == "SIGTERM"
        assert notices == ["received SIGTERM: finishing the current step, then saving a checkpoint (send it again to abort at once)"]
        with pytest.raises(KeyboardInterrupt, match="second signal"):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1.0)
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_check_finite_names_the_first_bad_metric():
    check_finite(3, loss=0.5, grad_norm=1e30)
    with pytest.raises(NonFiniteError) as err:
        check_finite(7, loss=1.0, grad_norm=float("inf"))
    assert (err.value.step, err.value.metric) == (7, "grad_norm")
    with pytest.raises(NonFiniteError, match="non-finite loss"):
        check_finite(7, loss=float("nan"), grad_norm=float("nan"))


@pytest.mark.slow
def test_nan_loss_stops_after_saving_the_last_good_state(user_setup, tiny_model_dir, capsys):
    tmp_path, data = user_setup
    run_dir = tmp_path / "nan"
    code = cli.main(["train", *overrides(tiny_model_dir, data, run_dir, "overflowing", "train.max_steps=6")])
    err = capsys.readouterr().err
    assert code == 3
    assert "stopped: loss is nan at step 3 (non-finite); the optimizer step was not taken." in err
    assert f"Saved the last good state (after step 2) to {run_dir}/checkpoints/step-000002" in err
    assert f"cohort train --resume {run_dir}" in err
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    # the saved state is the one after step 2: resuming it with a sane reward runs step 3 from the same sampler position
    ref = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "ref", "slow_sevens", "train.max_steps=2")))
    run_training(ref)
    restored = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "restored", "slow_sevens", "train.max_steps=2")))
    meta = checkpoint.load_checkpoint(restored.checkpointed(), run_dir / "checkpoints" / "step-000002")
    assert meta["step"] == 2 and restored.scheduler.generation_index == 2 and restored.state.policy_version == 2
    assert restored.parts.sampler.state_dict() == ref.parts.sampler.state_dict()
    for (name, p), q in zip(ref.parts.policy.named_parameters(), restored.parts.policy.parameters()):
        assert torch.isfinite(q).all() and torch.equal(p, q), name
    ref.close()
    restored.close()


HUNG_AGENT = textwrap.dedent('''
    import asyncio, os, pathlib, time
    RUNS = [0]

    async def agent(client, row):
        """One model call; from the 9th run on (step 2: 2 prompts x 4 a step) the episode hangs in a thread, as a
        verifiers seat waiting on a remote sandbox does: cancelling the run cannot stop the thread, and the
        interpreter's exit waits for it."""
        RUNS[0] += 1
        reply = await client.chat.completions.create(model="m", messages=row["prompt"], max_tokens=4)
        if RUNS[0] > 8:
            pathlib.Path(os.environ["COHORT_TEST_MARKER"]).write_text("hung")
            await asyncio.get_running_loop().run_in_executor(None, time.sleep, 600)
        return float(len(reply.choices[0].message.content or "") % 2)
''')


@pytest.mark.slow
def test_a_second_sigterm_during_a_hung_episode_aborts_at_once_keeping_the_last_checkpoint(tmp_path, tiny_chat_model_dir):
    # Before (4db2852): the second SIGTERM raised KeyboardInterrupt, and the process then waited for the hung thread
    # (600 s) at exit: it took SIGKILL. Now it exits (130) within GracefulStop's 10 s; step 1's checkpoint stays.
    (tmp_path / "hung_agent.py").write_text(HUNG_AGENT)
    data, run_dir, marker = tmp_path / "train.jsonl", tmp_path / "run", tmp_path / "hung"
    data.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": f"{i}+{i}="}]}) + "\n" for i in range(8)))
    args = tiny_run(tiny_chat_model_dir, data, run_dir, "engine.name=hf", "rollout.max_completion_length=4",
                    "train.prompts_per_step=2", "train.micro_batch_size=8", "train.max_steps=5", "run.save_every=1",
                    "data.max_prompt_length=64",
                    "run.eval_every=0", f"agent.function={tmp_path / 'hung_agent.py'}:agent", "agent.timeout_s=600")
    env = dict(os.environ, OMP_NUM_THREADS="1", COHORT_TEST_MARKER=str(marker))
    proc = subprocess.Popen([sys.executable, "-m", "cohort.cli", "train", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # step 2 is hung: the first only asks for a stop after the step
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    assert took < 30, took  # (10 s of grace, then os._exit; 600 s before)
    assert "received SIGTERM: finishing the current step" in out
    assert "cohort: interrupted" in err or "cohort: aborted" in err
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000001"  # the last saved state, intact

"""Checkpoints: exact resume (in process, and after `kill -9` with both engines), atomic writes, pruning, disk space,
falling back past a damaged checkpoint (the failure modes one by one: tests/runs/test_manifest.py).

"Exact" means: the resumed run samples the same completions (same text, rewards
and advantages in completions.jsonl) and ends with the same weights (max abs
difference <= 1e-6; measured: 0.0) as the run that was never interrupted.

The interrupted runs are `cohort train` subprocesses. To kill one at a known
place, the test's reward function parks the process in its N-th call (only when
COHORT_TEST_BLOCK_AT_CALL is set, i.e. only in the process to be killed): the
process is then inside a step, after the newest checkpoint, with log lines
already written past it. The resumed process must drop those lines and redo the
steps.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cohort.config.resolve import load_config
from cohort.trainer import checkpoint
from cohort.trainer.trainer import Trainer
from cohort.trainer.run import run_training
from cohort.trainer.state import stateful_parts
from tests.builders import tiny_run, write_doubling

REWARD_MODULE = textwrap.dedent('''
    import os, pathlib, time
    CALLS = [0]

    def sevens(prompts, completions, **kwargs):
        """Share of "7" in the completion; parks the process in call N when asked (the test kills it there)."""
        CALLS[0] += 1
        if os.environ.get("COHORT_TEST_BLOCK_AT_CALL") == str(CALLS[0]):
            pathlib.Path(os.environ["COHORT_TEST_MARKER"]).write_text("parked")
            time.sleep(float(os.environ.get("COHORT_TEST_SLEEP_S", "600")))
        return [c.count("7") / max(1, len(c)) for c in completions]
''')


@pytest.fixture
def user_setup(tmp_path, monkeypatch):
    (tmp_path / "ckpt_test_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "ckpt_test_rewards", raising=False)  # a fresh call counter per test
    data = tmp_path / "train.jsonl"
    write_doubling(data, 12)
    return tmp_path, data


def overrides(model_dir, data, run_dir, engine, *extra):
    """6 steps; a generation batch serves 2 steps (so step 3 is inside one); 2 micro-batches per step."""
    return tiny_run(model_dir, data, run_dir, f"engine.name={engine}", "rollout.max_completion_length=6",
                    "train.prompts_per_step=2", "train.steps_per_generation=2", "train.micro_batch_size=4", "train.max_steps=6",
                    "train.learning_rate=3e-3", "train.num_threads=1", "rewards=[{name: 'ckpt_test_rewards:sevens'}]",
                    "run.log_completions_every=1", "run.num_completions_to_log=16", *extra)


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "final" / "model.safetensors"))


def assert_same_run(a: Path, b: Path, model_dir: Path) -> None:
    completions_a = (a / "completions.jsonl").read_text().splitlines()
    completions_b = (b / "completions.jsonl").read_text().splitlines()
    # each step logs the 8 completions it trained on (2 prompts × G=4), so every generated completion appears once:
    # 3 generation batches × 16
    assert len(completions_a) == 6 * 8
    assert completions_a == completions_b
    steps = [json.loads(line)["step"] for line in (b / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    gap = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    assert gap <= 1e-6, gap
    start = load_file(str(model_dir / "model.safetensors"))
    assert max(float((wa[k] - start[k]).abs().max()) for k in wa) > 1e-3  # and training did move them


def run_uninterrupted(tmp_path, data, model_dir, engine, vllm_engine=None) -> Path:
    run_dir = tmp_path / f"reference-{engine}"
    trainer = Trainer(load_config(None, overrides(model_dir, data, run_dir, engine)), engine=vllm_engine)
    run_training(trainer)
    trainer.close()
    return run_dir


# --------------------------------------------------------------------------- in process


@pytest.mark.slow
def test_resume_from_every_checkpoint_equals_uninterrupted(user_setup, tiny_model_dir):
    """hf, num_iterations=2 (old log-probs saved with the batch): resuming after step 1..5 always ends identical."""
    tmp_path, data = user_setup
    ref = tmp_path / "ref"
    extra = ("algorithm.num_iterations=2", "run.save_every=1", "run.keep_checkpoints=10")
    trainer = Trainer(load_config(None, overrides(tiny_model_dir, data, ref, "hf", *extra)))
    run_training(trainer)
    trainer.close()
    saved = checkpoint.list_checkpoints(ref)
    assert [p.name for p in saved] == [f"step-{k:06d}" for k in range(1, 7)]
    # steps_per_generation 2 × num_iterations 2 = 4 steps per generation batch: only step 4 ends one
    assert [json.loads((p / "meta.json").read_text())["mid_generation"] for p in saved] == [True, True, True, False, True, True]
    for k in (2, 3, 4):
        copy = tmp_path / f"resumed-{k}"
        shutil.copytree(ref, copy)
        shutil.rmtree(copy / "final")
        cfg = load_config(copy / "config.yaml", [f"run.output_dir={copy}"])
        resumed = Trainer(cfg)
        run_training(resumed, resume_from=copy / "checkpoints" / f"step-{k:06d}")
        resumed.close()
        assert_same_run(ref, copy, tiny_model_dir)


@pytest.mark.slow
def test_a_new_stateful_part_is_saved_and_restored_once_listed(user_setup, tiny_model_dir, monkeypatch):
    """The explicit list: a part with state_dict/load_state_dict is checkpointed once `state.stateful_parts` names
    it, and only then (an attribute hung on the trainer from outside is not saved by reflection)."""
    tmp_path, data = user_setup

    class Counter:
        def __init__(self):
            self.value = 0

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    trainer = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "a", "hf")))
    trainer.my_controller = Counter()
    trainer.my_controller.value = 41
    assert "my_controller" not in trainer.checkpointed().stateful  # not listed: not saved
    listed, counters = stateful_parts, {}  # the run's parts -> its counter

    def with_counter(parts, sync_check, scheduler):
        return {**listed(parts, sync_check, scheduler), "my_controller": counters[id(parts)]}

    monkeypatch.setattr("cohort.trainer.trainer.stateful_parts", with_counter)
    counters[id(trainer.parts)] = trainer.my_controller
    trainer.step()
    path = checkpoint.save_checkpoint(trainer.checkpointed())
    trainer.close()
    other = Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "a", "hf")))
    counters[id(other.parts)] = Counter()
    meta = checkpoint.load_checkpoint(other.checkpointed(), path)
    assert counters[id(other.parts)].value == 41 and meta["step"] == other.state.step == 1
    assert other.parts.sampler.state_dict() == trainer.parts.sampler.state_dict()
    for (name, p), q in zip(trainer.parts.policy.named_parameters(), other.parts.policy.parameters()):
        assert torch.equal(p, q), name
    other.close()


# --------------------------------------------------------------------------- kill -9


def _cohort_env(tmp_path: Path, **extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env.update(OMP_NUM_THREADS="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", **extra)
    return env


def _cohort(*args: str) -> list[str]:
    return [sys.executable, "-m", "cohort.cli", *args]


def kill_during_step(tmp_path, data, model_dir, engine, run_dir: Path) -> None:
    """Start `cohort train` (checkpoint every 3 steps), park it in the reward of step 5, kill -9 it there."""
    marker = tmp_path / f"parked-{engine}"
    env = _cohort_env(tmp_path, COHORT_TEST_BLOCK_AT_CALL="3", COHORT_TEST_MARKER=str(marker))  # generations: steps 1, 3, 5
    proc = subprocess.Popen(_cohort("train", *overrides(model_dir, data, run_dir, engine, "run.save_every=3")), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not marker.exists():
            if proc.poll() is not None:
                pytest.fail(f"cohort train exited early ({proc.returncode}):\n{proc.stdout.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "the run never reached step 5"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000003"  # inside a generation batch
    logged = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert logged == [1, 2, 3, 4]  # step 4 was logged after the checkpoint: the resume must drop it
    assert not (run_dir / "final").exists()


def resume_cli(tmp_path, run_dir: Path) -> str:
    done = subprocess.run(_cohort("train", "--resume", str(run_dir)), env=_cohort_env(tmp_path), capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_kill9_then_resume_is_exact_hf(user_setup, tiny_model_dir):
    tmp_path, data = user_setup
    reference = run_uninterrupted(tmp_path, data, tiny_model_dir, "hf")
    run_dir = tmp_path / "killed-hf"
    kill_during_step(tmp_path, data, tiny_model_dir, "hf", run_dir)
    out = resume_cli(tmp_path, run_dir)
    assert "resumed from" in out and "step-000003" in out and "dropped" in out
    assert_same_run(reference, run_dir, tiny_model_dir)


@pytest.mark.slow
@pytest.mark.vllm
def test_kill9_then_resume_is_exact_vllm(user_setup, tiny_model_dir, vllm_engine):
    """vLLM seeds every request; the fresh engine of the resumed process gets the checkpoint's weights at its first sync."""
    tmp_path, data = user_setup
    reference = run_uninterrupted(tmp_path, data, tiny_model_dir, "vllm", vllm_engine)
    run_dir = tmp_path / "killed-vllm"
    kill_during_step(tmp_path, data, tiny_model_dir, "vllm", run_dir)
    resume_cli(tmp_path, run_dir)
    assert_same_run(reference, run_dir, tiny_model_dir)


# --------------------------------------------------------------------------- atomic writes

KILL_DURING_SAVE = textwrap.dedent('''
    import os, signal, sys
    from cohort.config.resolve import load_config
    from cohort.trainer import checkpoint
    from cohort.trainer.trainer import Trainer

    if __name__ == "__main__":
        trainer = Trainer(load_config(None, sys.argv[1:]))
        trainer.step()
        checkpoint.save_checkpoint(trainer.checkpointed())          # step-000001: complete
        trainer.step()
        real_fsync, calls = os.fsync, [0]

        def fsync_then_die(fd):                      # die half-way through writing step-000002
            calls[0] += 1
            real_fsync(fd)
            if calls[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)

        os.fsync = fsync_then_die
        checkpoint.save_checkpoint(trainer.checkpointed())
''')


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(user_setup, tiny_model_dir):
    """Checkpoints of steps 4 and 6 kept; step 6's weights truncated after the run: `cohort train --resume RUN_DIR` names
    the damage, resumes from step 4 and, resuming being exact, ends with the uninterrupted run's weights."""
    tmp_path, data = user_setup
    run_dir = tmp_path / "damaged"
    trainer = Trainer(load_config(None, overrides(tiny_model_dir, data, run_dir, "hf", "run.save_every=2",
                                                  "run.keep_checkpoints=2")))
    run_training(trainer)
    trainer.close()
    step4, step6 = checkpoint.list_checkpoints(run_dir)
    assert (step4.name, step6.name) == ("step-000004", "step-000006")
    listed = json.loads((step6 / "manifest.json").read_text())["files"]
    assert {"meta.json", "state.pt", "model/model.safetensors", "model/config.json"} <= set(listed)
    uninterrupted = final_weights(run_dir)
    weights = step6 / "model" / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as fh:
        fh.truncate(size // 2)
    out = resume_cli(tmp_path, run_dir)
    aside = run_dir / "checkpoints" / "damaged-step-000006"
    assert (f"skipped damaged checkpoint step-000006 (model/model.safetensors is {size // 2} bytes, the manifest says "
            f"{size} (truncated); kept as {aside}); resuming from the newest intact one, step-000004") in out
    assert f"resumed from {step4} at step 4" in out
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # steps 5 and 6 dropped from the log and trained again
    resumed = final_weights(run_dir)
    assert max(float((resumed[k] - uninterrupted[k]).abs().max()) for k in resumed) <= 1e-6
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step-000004", "step-000006"]  # step 6 saved anew

@pytest.mark.slow
def test_kill_during_save_leaves_the_previous_checkpoint_loadable(user_setup, tiny_model_dir):
    tmp_path, data = user_setup
    script = tmp_path / "kill_during_save.py"
    script.write_text(KILL_DURING_SAVE)
    run_dir = tmp_path / "torn"
    done = subprocess.run([sys.executable, str(script), *overrides(tiny_model_dir, data, run_dir, "hf")],
                          env=_cohort_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    root = run_dir / "checkpoints"
    names = sorted(p.name for p in root.iterdir())
    assert len(names) == 2 and names[0].startswith(".tmp-step-000002-") and names[1] == "step-000001", names
    assert checkpoint.latest_checkpoint(run_dir).name == "step-000001"
    trainer = Trainer(load_config(None, overrides(tiny_model_dir, data, run_dir, "hf")))
    meta = checkpoint.load_checkpoint(trainer.checkpointed(), checkpoint.latest_checkpoint(run_dir))
    assert meta["step"] == trainer.state.step == 1 and trainer.state.policy_version == 1
    trainer.step()  # and it trains on
    checkpoint.save_checkpoint(trainer.checkpointed())
    assert [p.name for p in root.iterdir() if p.name.startswith(".tmp")] == []  # the torn write was swept
    trainer.close()


@pytest.mark.slow
def test_keep_checkpoints_and_write_failures(user_setup, tiny_model_dir, monkeypatch):
    tmp_path, data = user_setup
    run_dir = tmp_path / "keep"
    trainer = Trainer(load_config(None, overrides(tiny_model_dir, data, run_dir, "hf", "run.keep_checkpoints=2")))
    for _ in range(3):
        trainer.step()
        checkpoint.save_checkpoint(trainer.checkpointed())
    assert [p.name for p in checkpoint.list_checkpoints(run_dir)] == ["step-000002", "step-000003"]
    trainer.step()

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(checkpoint.CheckpointError) as err:
        checkpoint.save_checkpoint(trainer.checkpointed())
    assert "No space left on device" in str(err.value) and "step-000003 is intact" in str(err.value)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-000002", "step-000003"]  # no torn dir left
    trainer.close()


def test_too_little_disk_fails_before_training(user_setup, tiny_model_dir, monkeypatch):
    tmp_path, data = user_setup

    class Usage:
        free = 10_000  # bytes

    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: Usage)
    with pytest.raises(checkpoint.CheckpointError) as err:
        Trainer(load_config(None, overrides(tiny_model_dir, data, tmp_path / "full", "hf", "run.save_every=2")))
    # 329,216 float32 parameters: a checkpoint is weights + 2 moments = 3 × 1.26 MiB; keep 2 (+1 being written) + final weights
    assert "has 0.00 GiB free but this run needs about 0.01 GiB (3 checkpoint(s)" in str(err.value)
    assert "run.keep_checkpoints" in str(err.value)


def test_truncate_logs_drops_lines_after_the_checkpoint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "rew')  # torn last line
    (tmp_path / "eval.jsonl").write_text('{"label": "before", "step": 0}\n{"label": "during", "step": 3}\n')
    dropped = checkpoint.truncate_logs(tmp_path, 2)
    assert dropped == {"metrics.jsonl": 2, "eval.jsonl": 1}
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert (tmp_path / "eval.jsonl").read_text() == '{"label": "before", "step": 0}\n'

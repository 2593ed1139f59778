"""Training through OpenEnv environments and TRL's environment_factory shape (tests/tools/envs), 20 steps of G = 4 on
`quick_stop_chat_model` (a random tiny chat model whose turns end after a few tokens) with the transformers engine:
the parsers read every turn as a call (a random model writes none), so every trajectory is multi-turn. In-process,
served by openenv's own app on loopback, the server killed mid-step (the step fails with one message, `cohort train
--resume` continues from the last checkpoint), and TRL's quick-start shape unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

import cohort
from tests.tools.test_openenv import ENVS, free_port, serve_guess

STEPS, G = 20, 4


def _config(tmp_path, model_dir, name, environment, **sections):
    config = {"model": {"path": str(model_dir)}, "data": {"train_files": [str(tmp_path / "train.jsonl")], "max_prompt_length": 48},
              "rollout": {"num_generations": G, "max_completion_length": 96}, "engine": {"name": "hf"},
              "tools": {"environment": environment, "parser": "trl_shape.guess_parse", "max_turns": 4, "timeout_s": 10,
                        "in_prompt": False},  # (a random model of 256 positions: no room for a tools block)
              "train": {"prompts_per_step": 2, "micro_batch_size": 8, "max_steps": STEPS, "learning_rate": 1e-3},
              "rewards": [],  # the environment's get_reward(): the episode's rewards
              "run": {"output_dir": str(tmp_path / name), "progress": False, "loggers": ["jsonl"]}}
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def _data(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": f"Find my number ({k})."}], "target": k % 4} for k in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_trained(run_dir):
    lines = _metrics(run_dir)
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert all(m["tools/calls/step"] > 0 and 1 <= m["tools/turns_mean"] <= 3 for m in lines)  # done ends by turn 3
    rewards = [m["rewards/environment/mean"] for m in lines]
    assert all(0 <= r <= 1 for r in rewards) and any(r > 0 for r in rewards)  # some guesses were right
    assert sum(m["tools/status/ok"] for m in lines) == STEPS  # no episode failed


@pytest.fixture
def envs_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))


@pytest.mark.slow
def test_in_process_openenv_environment_trains(tmp_path, quick_stop_chat_model, envs_on_path):
    _data(tmp_path)
    cohort.train(_config(tmp_path, quick_stop_chat_model, "local", "guess_env.GuessEnv"))
    _check_trained(tmp_path / "local")


@pytest.mark.vllm
def test_a_first_observation_fits_vllm_s_length(tmp_path, quick_stop_chat_model, envs_on_path):
    # GuessEnv's reset appends " Guess a number from 0 to 3." (about 10 tokens) to the prompt after it was encoded.
    # vLLM's max_model_len was sized from the encoded prompts + max_completion_length + 1, so with 8 completion tokens
    # the first request (prompt + observation + 8) was past it and failed step 1 (before 2026-12-06); a
    # tools.environment run now gets the model's positions. 3 steps through vLLM; every episode ends ok or at the
    # 8-token budget (truncated), none in error.
    pytest.importorskip("vllm")
    _data(tmp_path)
    cohort.train(_config(tmp_path, quick_stop_chat_model, "vllm", "guess_env.GuessEnv", engine={"name": "vllm"},
                         rollout={"max_completion_length": 8}, train={"max_steps": 3}))
    lines = _metrics(tmp_path / "vllm")
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all(m["tools/status/ok"] + m["tools/status/truncated"] == 1 and m["tools/calls/step"] > 0 for m in lines)


@pytest.mark.slow
def test_served_openenv_environment_trains_over_websocket_sessions(tmp_path, quick_stop_chat_model, envs_on_path):
    _data(tmp_path)
    port = free_port()
    server = serve_guess(port, sessions=2 * G)
    try:
        cohort.train(_config(tmp_path, quick_stop_chat_model, "served", f"ws://127.0.0.1:{port}"))
    finally:
        server.kill()
        server.wait()
    _check_trained(tmp_path / "served")


@pytest.mark.slow
def test_trl_quick_start_shape_trains_unchanged(tmp_path, quick_stop_chat_model, envs_on_path):
    rows = [{"prompt": [{"role": "user", "content": "Repeat after me."}], "word": w} for w in ("moon", "sun", "star", "sky")]
    config = _config(tmp_path, quick_stop_chat_model, "trl", "trl_shape.EchoEnv", tools={"parser": "trl_shape.parse"},
                     train={"max_steps": 5})
    del config["data"]["train_files"]
    import trl_shape

    cohort.train(config, train_dataset=rows, reward_funcs=[trl_shape.reward_func])
    lines = _metrics(tmp_path / "trl")
    assert len(lines) == 5 and all(m["tools/calls/echo"] > 0 for m in lines)
    assert "rewards/reward_func/mean" in lines[0] and "rewards/environment/mean" not in lines[0]


@pytest.mark.slow
def test_server_killed_mid_step_fails_the_step_and_the_run_resumes(tmp_path, quick_stop_chat_model):
    _data(tmp_path)
    port = free_port()
    url = f"ws://127.0.0.1:{port}"
    config = _config(tmp_path, quick_stop_chat_model, "killed", url, train={"max_steps": 6}, run={"save_every": 1})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    server = serve_guess(port, sessions=2 * G)
    # the parser kills the server at the 40th assistant turn: inside step 3 to 5 (8 trajectories of 1 to 3 turns a step)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]),
               GUESS_SERVER_PID=str(server.pid), GUESS_KILL_AT_TURN="40")
    cli = [sys.executable, "-m", "cohort"]
    try:
        first = subprocess.run(cli + ["train", str(tmp_path / "run.yaml")], env=env, capture_output=True, text=True, timeout=600)
        server.wait(timeout=10)
        assert first.returncode == 4, first.stdout + first.stderr
        done = [m["step"] for m in _metrics(tmp_path / "killed")]
        assert 2 <= len(done) < 6
        message = first.stdout + first.stderr
        assert f"run failed at step {len(done) + 1} (generate)" in message
        assert f"the connection to the OpenEnv server at {url} dropped during 'step'" in message
        assert "episode(s) in flight fail with it" in message and f"Saved the last good state (after step {len(done)})" in message
        server = serve_guess(port, sessions=2 * G)  # back up: resume from the last checkpoint
        del env["GUESS_KILL_AT_TURN"]
        second = subprocess.run(cli + ["train", "--resume", str(tmp_path / "killed")], env=env, capture_output=True, text=True,
                                timeout=600)
        assert second.returncode == 0, second.stdout + second.stderr
        assert [m["step"] for m in _metrics(tmp_path / "killed")] == list(range(1, 7))
    finally:
        server.kill()
        server.wait()

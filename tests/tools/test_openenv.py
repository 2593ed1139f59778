"""OpenEnv environments through the tool loop (cohort/tools/openenv.py) and TRL's environment_factory shape
(tests/tools/envs: a number-guessing OpenEnv environment and TRL's quick-start shape): the adapter in-process and
over a served `/ws` session (openenv's own `create_app` under uvicorn on 127.0.0.1), `done`, failures, capacity,
the observation appended to the prompt, TRL's `{"error": ...}` results, and unknown names."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from cohort.api import build_config
from cohort.config import ConfigError
from cohort.models.pretrained import load_tokenizer
from cohort.rollout.base import Request, SamplingConfig, generate_requests, with_observation
from cohort.tools.loop import ToolEngine
from cohort.tools.openenv import EnvironmentLost, check_capacity
from cohort.tools.parsers import parse_hermes
from cohort.tools.tool_schemas import environment_tools
from cohort.plan.run_environment import RunEnvironment
from cohort.connectors import resolve_environment

ENVS = Path(__file__).parent / "envs"
sys.path.insert(0, str(ENVS))
from guess_env import GuessEnv  # noqa: E402
from trl_shape import EchoEnv  # noqa: E402

from tests.tools.test_tool_loop import Scripted, _call  # noqa: E402  (the scripted request-level engine)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_app(app: str, port: int, environ: dict[str, str]) -> subprocess.Popen:
    """An OpenEnv `app` of tests/tools/envs (`module:app`) under uvicorn on 127.0.0.1:port, ready (GET /health answers)."""
    env = dict(os.environ, PYTHONPATH=str(ENVS), **environ)
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port),
                               "--log-level", "warning"], env=env, cwd=ENVS, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).read()
            return server
        except OSError:
            if server.poll() is not None:
                raise RuntimeError(f"the {app} server exited with {server.returncode}")
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"the {app} server did not start in 60 s")


def serve_guess(port: int, sessions: int = 8) -> subprocess.Popen:
    """tests/tools/envs/guess_env.py's `app` under uvicorn on 127.0.0.1:port, ready."""
    return serve_app("guess_env:app", port, {"GUESS_SESSIONS": str(sessions)})


@pytest.fixture(scope="module")
def guess_server():
    port = free_port()
    server = serve_guess(port)
    yield f"ws://127.0.0.1:{port}"
    server.kill()
    server.wait()


@pytest.fixture(scope="module")
def tok(tiny_chat_model_dir):
    return load_tokenizer(tiny_chat_model_dir)


def test_in_process_adapter_step_tool_done_and_reward():
    cls = resolve_environment(GuessEnv)
    env = cls()
    (tool,) = environment_tools(env)
    assert tool.name == "step" and tool.schema["function"]["parameters"]["properties"]["guess"]["type"] == "integer"
    assert env.reset(target=2, prompt=[{"role": "user", "content": "x"}]) == " Guess a number from 0 to 3."
    assert env.step(1) == "higher" and not env.done  # (positional: the compact parser's "0" key)
    assert env.step(guess=2) == "right" and env.done and env.get_reward() == 1.0
    env.close()


def test_environment_errors_fail_the_episode_with_their_message():
    cls = resolve_environment(GuessEnv)
    env = cls()
    with pytest.raises(RuntimeError, match="reset raised ValueError: no number below 0"):
        env.reset(target=-1)
    assert env.done and env.get_reward() is None
    env = cls()
    env.reset(target=1)
    with pytest.raises(RuntimeError, match="step raised RuntimeError: the oracle is asleep"):
        env.step(guess=99)
    assert env.done and env.get_reward() is None


def _engine(tok, turns, environment, rows, **kwargs):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    inner = Scripted(turns, stop)
    prompt_with = lambda row, observation: [7, 7] + tok(observation, add_special_tokens=False)["input_ids"]  # noqa: E731
    engine = ToolEngine(inner, tok, parser=parse_hermes, environment=environment, rows=rows, max_turns=5,
                        tool_timeout_s=5.0, prompt_with=prompt_with, **kwargs)
    return engine, inner, stop


def test_tool_loop_appends_the_observation_to_the_prompt_and_done_ends_the_trajectory(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    guess = lambda k: _call(tok, "step", f'{{"guess": {k}}}') + [stop]  # noqa: E731
    turns = {"r/0": [guess(0), guess(3), guess(2), [stop]], "r/1": [guess(99), [stop]], "r/2": [guess(1), [stop]]}
    rows = {"r/0": {"target": 2}, "r/1": {"target": 1}, "r/2": {"target": -1}}
    engine, inner, _ = _engine(tok, turns, resolve_environment(GuessEnv), lambda r: dict(rows[r.request_id]))
    right, broken, unreset = generate_requests(engine, [Request(r, (1,), SamplingConfig(400)) for r in sorted(rows)])
    observation = tok(" Guess a number from 0 to 3.", add_special_tokens=False)["input_ids"]
    assert inner.seen_prompts["r/0"][0] == [7, 7] + observation and right.prompt_ids == [7, 7] + observation
    # guesses 0 (higher), 3 (lower), 2 (right: done): three turns, the last observation recorded, not appended
    assert right.episode.turns == 3 and right.episode.environment.done and right.episode.environment.get_reward() == 1.0
    assert [m["content"] for m in right.episode.conversation if m["role"] == "tool"] == ["higher", "lower", "right"]
    assert right.token_ids[-1] == stop and right.loss_mask[-1] == 1 and right.episode.status == "ok"
    # step raised: the episode fails with the environment's message, the run goes on
    assert broken.episode.status == "error" and broken.episode.turns == 1
    assert "the oracle is asleep" in broken.episode.conversation[-1]["content"]
    assert broken.episode.environment.get_reward() is None
    # reset raised: one turn sampled, nothing run, the message recorded
    assert unreset.episode.status == "error" and unreset.episode.turns == 1 and unreset.episode.calls == {}
    assert "no number below 0" in unreset.episode.conversation[0]["content"]


def test_trl_shape_tool_errors_are_results_and_the_observation_ends_the_user_message(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    echo = lambda m: _call(tok, "echo", json.dumps({"message": m})) + [stop]  # noqa: E731
    engine, _, _ = _engine(tok, {"r/0": [echo("crash"), echo("hi"), [stop]]}, resolve_environment(EchoEnv),
                           lambda r: {"word": "moon"})
    (t,) = generate_requests(engine, [Request("r/0", (1,), SamplingConfig(400))])
    tool_messages = [m["content"] for m in t.episode.conversation if m["role"] == "tool"]
    assert tool_messages == [json.dumps({"error": "echo refuses to crash"}), "hi"] and t.episode.status == "error"
    assert t.episode.observation == " Echo the word moon." and t.episode.environment.reward == 1.0  # len("hi") % 3 / 2
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": "Say it."}]
    assert with_observation(prompt, t.episode.observation)[1]["content"] == "Say it. Echo the word moon."
    assert with_observation("Say it.", "!") == "Say it.!" and prompt[1]["content"] == "Say it."


def test_served_environment_over_its_websocket_session(guess_server):
    cls = resolve_environment(guess_server, timeout_s=5.0)
    env = cls()
    assert env.reset(target=3, prompt="ignored by the server") == " Guess a number from 0 to 3."
    assert env.step(guess=0) == "higher" and env.step(guess=3) == "right" and env.done and env.get_reward() == 1.0
    env.close()
    failing = cls()
    failing.reset(target=1)
    with pytest.raises(RuntimeError, match="the oracle is asleep"):
        failing.step(guess=99)
    failing.close()
    check_capacity(guess_server, 8, 5.0, "test")  # the server takes 8 sessions
    frozen = resolve_environment(guess_server, timeout_s=1.0)()
    frozen.reset(target=1)
    start = time.monotonic()
    with pytest.raises(EnvironmentLost, match=r"sent no answer to 'step' in 1 s"):
        frozen.step(guess=42)
    frozen.close()
    assert time.monotonic() - start < 4 and frozen.done  # never waits for the frozen server (5 s)


def test_a_server_with_one_session_is_refused_with_the_fix_and_a_killed_one_fails_fast():
    port = free_port()
    server = serve_guess(port, sessions=1)
    url = f"ws://127.0.0.1:{port}"
    try:
        # a ConfigError (the command line's exit 2, before any weights load), not a run failure (exit 4: issue 60)
        with pytest.raises(ConfigError, match=r"accepted 1 of the 4 .*max_concurrent_envs=4.*SUPPORTS_CONCURRENT_SESSIONS"):
            check_capacity(url, 4, 5.0, "a generation batch of 4 completions")
        env = resolve_environment(url, timeout_s=5.0)()
        env.reset(target=2)
        server.send_signal(signal.SIGKILL)
        server.wait()
        start = time.monotonic()
        with pytest.raises(EnvironmentLost, match="dropped"):
            env.step(guess=1)
        assert time.monotonic() - start < 5 and env.done and env.get_reward() is None
        with pytest.raises(EnvironmentLost, match="cannot open a session"):
            env.__class__().reset(target=1)
    finally:
        server.kill()


def test_bad_environment_specs_are_refused_before_anything_loads(tmp_path, guess_server):
    base = {"model": {"path": "tiny:arith"}, "rewards": [], "rollout": {"max_completion_length": 32},
            "data": {"train_files": [str(tmp_path / "t.jsonl")]}}
    (tmp_path / "t.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n")
    with pytest.raises(ConfigError, match=r"has no attribute 'GuesEnv'; did you mean 'guess_env.GuessEnv'"):
        build_config(base, overrides=["tools.environment=guess_env.GuesEnv"])
    with pytest.raises(ConfigError, match=r"write the server as ws://host:port"):
        build_config(base, overrides=["tools.environment=http://127.0.0.1:8000"])
    port = free_port()  # nothing listens there
    with pytest.raises(ConfigError, match=r"cannot read the OpenEnv server's action schema"):
        build_config(base, overrides=[f"tools.environment=ws://127.0.0.1:{port}"])
    # an environment with get_reward() (every OpenEnv one) is the reward: rewards = [] is fine
    cfg = build_config(base, overrides=[f"tools.environment={guess_server}"])
    assert [s["alias"] for s in RunEnvironment(cfg).tools.reward_specs()] == ["environment"]
    trl = build_config(base | {"rewards": [{"name": "trl_shape.reward_func"}]}, overrides=["tools.environment=trl_shape.EchoEnv"])
    assert RunEnvironment(trl).tools.reward_specs() == []  # no get_reward(): its reward_func is the reward

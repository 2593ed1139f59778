"""A run resolves each environment once per process: `cohort train` (the real command line, in this process) checks
the config, reads the data, renders the prompts' tools block, and wraps the engine in the tool loop or the agent
runs, all from the one resolution the run's plan carries (cohort/plan/run_environment.py).

Spies wrap the real functions (they still run) and count the calls where each connector resolves:
- a verifiers 0.4 environment: `verifiers.v1.load_environment` (verifiers' own loader; cohort calls it through
  `vf.load_environment`);
- a TRL `environment_factory` class: its tools' schemas built from the class (transformers' `get_json_schema` on the
  class's own functions; an instance's bound methods, one set per episode, are not counted);
- an OpenEnv server: its action schema read over HTTP (`GET /schema`, through `urllib.request.urlopen`);
- a `gym:` id: the adapter built (`cohort.tools.gym_text.gym_environment`, which makes one probe environment).

Measured on main's 4f35103 (the same runs): verifiers 2 loads (validation's data, then the agent's), a TRL class 3
(the tools check, the prompts' tools block, the tool loop), an OpenEnv server's schema 3 (the same three), a gym id 3.
"""

from __future__ import annotations

import inspect
import json
import os
import urllib.request
from pathlib import Path

import pytest
import yaml

from cohort import cli
from cohort.tools import gym_text, tool_schemas
from tests.tools.test_openenv import ENVS, free_port, serve_guess

VF_ENVS = Path(__file__).parent / "agents" / "vf_envs"
COMMON = {"engine": {"name": "hf"}, "rollout": {"num_generations": 2, "max_completion_length": 16},
          "train": {"prompts_per_step": 2, "micro_batch_size": 4, "max_steps": 1},
          "run": {"progress": False, "loggers": ["jsonl"], "eval_every": 0, "save_every": 0}}


def _train(tmp_path, model_dir, **sections) -> None:
    """`cohort train CONFIG` in this process, COMMON with `sections` over it; one step."""
    config = {**COMMON, "model": {"path": str(model_dir)}, **sections}
    config["run"] = {**COMMON["run"], "output_dir": str(tmp_path / "run")}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["train", str(tmp_path / "run.yaml")]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()  # (it trained)


def _rows(tmp_path) -> str:
    rows = [{"prompt": [{"role": "user", "content": f"Find my number ({k})."}], "target": k % 4, "seed": k} for k in range(4)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(tmp_path / "train.jsonl")


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """The tiny random chat checkpoint with 1,024 positions: room for a tools block in every prompt."""
    from cohort.models.tiny_chat import build_random_chat_model

    return build_random_chat_model(tmp_path_factory.mktemp("tiny-chat-1024"), max_positions=1024)


@pytest.fixture
def on_path(monkeypatch):
    """The tests' environments importable here and in the subprocesses verifiers starts."""
    monkeypatch.syspath_prepend(str(ENVS))
    monkeypatch.syspath_prepend(str(VF_ENVS))
    root = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", ":".join([str(VF_ENVS), str(ENVS), root] + ([p] if (p := os.environ.get("PYTHONPATH")) else [])))


@pytest.fixture
def verifiers_loads(monkeypatch):
    vf = pytest.importorskip("verifiers.v1")
    loads, real = [], vf.load_environment

    def spy(config, *args, **kwargs):
        loads.append(config.taskset.id)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(vf, "load_environment", spy)
    return loads


@pytest.fixture
def class_schemas(monkeypatch):
    """The qualified names of the plain functions (a class's, not an instance's bound methods) whose schemas were built."""
    built, real = [], tool_schemas.get_json_schema

    def spy(function, *args, **kwargs):
        if inspect.isfunction(function):
            built.append(function.__qualname__)
        return real(function, *args, **kwargs)

    monkeypatch.setattr(tool_schemas, "get_json_schema", spy)
    return built


@pytest.fixture
def schema_reads(monkeypatch):
    reads, real = [], urllib.request.urlopen

    def spy(url, *args, **kwargs):
        if str(url).endswith("/schema"):
            reads.append(str(url))
        return real(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", spy)
    return reads


@pytest.mark.slow
def test_a_verifiers_environment_is_loaded_once(tmp_path, chat_model, on_path, verifiers_loads):
    args = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}, "taskset": {"num_tasks": 2}}
    _train(tmp_path, chat_model, data={"max_prompt_length": 32},
           agent={"environment": "verifiers:cohort_vf_arith", "environment_args": args, "timeout_s": 120})
    assert verifiers_loads == ["cohort_vf_arith"]  # (at 4f35103: 2, validation's rows and the agent's tasks)


@pytest.mark.slow
def test_a_trl_class_is_resolved_once(tmp_path, chat_model, on_path, class_schemas):
    _train(tmp_path, chat_model, data={"train_files": [_rows(tmp_path)]},
           tools={"environment": "increment_env.TargetEnv", "max_turns": 2},  # (its tools block in every prompt)
           rewards=[{"name": "increment_env.target_seen"}])
    # its one tool's schema built once from the class (at 4f35103: 3, the tools check, the prompts, the tool loop)
    assert class_schemas == ["TargetEnv.increment"]


@pytest.mark.slow
def test_an_openenv_server_s_schema_is_read_once(tmp_path, chat_model, on_path, schema_reads):
    port = free_port()
    server = serve_guess(port, sessions=8)
    try:
        _train(tmp_path, chat_model, data={"train_files": [_rows(tmp_path)]},
               tools={"environment": f"ws://127.0.0.1:{port}", "parser": "trl_shape.guess_parse", "max_turns": 2},
               rewards=[])
    finally:
        server.kill()
        server.wait()
    assert schema_reads == [f"http://127.0.0.1:{port}/schema"]  # (at 4f35103: 3)


@pytest.mark.slow
def test_a_gym_id_is_resolved_once(tmp_path, chat_model, on_path, monkeypatch):
    built, real = [], gym_text.gym_environment
    monkeypatch.setattr(gym_text, "gym_environment", lambda spec, *a, **k: built.append(spec) or real(spec, *a, **k))
    _train(tmp_path, chat_model, data={"train_files": [_rows(tmp_path)]},
           tools={"environment": "gym:hangman_env:Hangman-v0", "parser": "game_parse.letter_parse",
                  "max_turns": 2}, rewards=[])
    assert built == ["gym:hangman_env:Hangman-v0"]  # (at 4f35103: 3)

"""verifiers (v1) environments as agent runs (cohort/agents/verifiers.py): the checks before anything loads, then
episodes that verifiers itself runs (its chat harness as a subprocess, its interception server, its eval client)
against the loopback endpoint over a scripted engine, joined to their runs by X-Session-ID; then training
(slow)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from cohort.agents.chat import ChatCompletions, Conversation  # noqa: E402
from cohort.agents.engine import AgentEngine  # noqa: E402
from cohort.agents.verifiers import VerifiersAgent, check_environment, environment_rows, verifiers_reward  # noqa: E402
from cohort.models.loading import load_tokenizer, stop_token_ids  # noqa: E402
from cohort.rollout.base import Request, SamplingConfig  # noqa: E402
from tests.agents.test_engine import ScriptedEngine  # noqa: E402

ENVS = Path(__file__).parent / "vf_envs"
LOCAL = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}, "taskset": {"num_tasks": 2}}


@pytest.fixture(autouse=True)
def test_environments(monkeypatch):
    """The tests' tasksets importable here and in the subprocesses verifiers starts (its tool servers)."""
    monkeypatch.syspath_prepend(str(ENVS))
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", ":".join([str(ENVS), root] + ([p] if (p := __import__("os").environ.get("PYTHONPATH")) else [])))


def test_an_unknown_environment_is_refused_with_the_closest_names():
    [problem] = check_environment("verifiers:textarna", LOCAL)
    assert "no verifiers environment module 'textarna' is installed" in problem and "closest installed: textarena" in problem
    assert "cohort_vf_arith" not in sys.modules  # (nothing was imported to say so)


def test_an_owner_name_version_id_finds_its_module_and_a_remote_runtime_is_named():
    assert check_environment("verifiers:someone/cohort-vf-arith@0.1.0", LOCAL) == []
    [problem] = check_environment("verifiers:cohort_vf_arith", {"agent": {"harness": {"id": "null"}}})
    assert "runs its harness in prime's remote sandboxes" in problem
    assert "agent.environment_args.agent.runtime.type=subprocess" in problem
    assert "write verifiers:" in check_environment("gym:cohort_vf_arith", LOCAL)[0]


def test_rows_are_the_tasks_in_order():
    rows = environment_rows("verifiers:cohort_vf_arith", LOCAL)
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": "3*2="}], [{"role": "user", "content": "10*7="}]]
    assert [r["vf_task"] for r in rows] == [0, 1] and all(r["vf_key"] for r in rows)


@pytest.fixture
def episodes(tiny_chat_model_dir):
    """run(spec, args, script) -> the trajectories of one episode per task, verifiers playing them against the
    loopback endpoint over a scripted engine (each call answered with the script's next text)."""
    tokenizer = load_tokenizer(tiny_chat_model_dir)
    stops = stop_token_ids(tiny_chat_model_dir, tokenizer)
    engines = []

    def run(spec, args, script, max_model_len=512):
        rows = environment_rows(spec, args)
        inner = ScriptedEngine(tokenizer, stops, list(script))
        chat = lambda sample: ChatCompletions(tokenizer, stops, sample, max_model_len=2**31)  # noqa: E731 (as wrap_engine)
        agent = VerifiersAgent(spec, args, "tiny")
        engine = AgentEngine(inner, chat, Conversation, agent, rows=lambda r: rows[int(r.request_id[3:])], timeout_s=60,
                             max_model_len=max_model_len)
        engines.append(engine)
        prompts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True) for row in rows]
        engine.submit([Request(f"run{i}", tuple(p), SamplingConfig(64), i) for i, p in enumerate(prompts)])
        out = []
        while len(out) < len(rows):
            out += engine.poll(1.0)
        return sorted(out, key=lambda t: t.request_id), inner, tokenizer

    yield run
    for engine in engines:
        engine.close()


def test_a_single_turn_episode_is_its_run_tokens_and_reward(episodes):
    trajectories, inner, tokenizer = episodes("verifiers:cohort_vf_arith", LOCAL, ["it is 6"])
    for t in trajectories:
        run = t.episode
        assert run.error is None, run.error
        assert run.turns == 1  # the one call joined its run through X-Session-ID
        assert t.token_ids == tokenizer("it is 6", add_special_tokens=False)["input_ids"] + [inner.stop_token_ids[0]]
    assert [t.episode.outcome for t in trajectories] == [{"reward": 1.0, "exact": 1.0}, {"reward": 0.0, "exact": 0.0}]
    assert verifiers_reward(["a", "b"], agent_runs=[t.episode for t in trajectories]) == [1.0, 0.0]


def test_an_environment_that_raises_fails_its_episode_with_the_message(episodes):
    args = {**LOCAL, "taskset": {"num_tasks": 1, "raise_in_reward": True}}
    [t], _, _ = episodes("verifiers:cohort_vf_arith", args, ["it is 6"])
    assert t.episode.status == "error" and "the scorer broke" in t.episode.error
    assert verifiers_reward(["a"], agent_runs=[t.episode]) == [None]  # no reward; training goes on


def test_an_endpoint_error_fails_the_episode_with_its_reason(episodes):
    # the task's prompt is past the engine's context: the endpoint answers 400, verifiers' client gets it
    [t, _], _, _ = episodes("verifiers:cohort_vf_arith", LOCAL, ["it is 6"], max_model_len=4)
    assert t.episode.status == "error" and "holds 4 (prompt and completion)" in t.episode.error, t.episode.error
    assert t.episode.turns == 0

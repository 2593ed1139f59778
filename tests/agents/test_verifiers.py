"""verifiers (v1) environments as agent runs (cohort/agents/verifiers.py): the checks before anything loads, then
episodes that verifiers itself runs (its chat harness as a subprocess, its interception server, its eval client)
against the loopback endpoint over a scripted engine, joined to their runs by X-Session-ID; then training
(slow)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from cohort.agents.chat import ChatCompletions, Conversation  # noqa: E402
from cohort.agents.engine import AgentEngine  # noqa: E402
from cohort.agents.verifiers import VerifiersAgent, verifiers_reward  # noqa: E402
from cohort.data.verifiers import check_environment, environment_rows  # noqa: E402
from cohort.models.pretrained import load_tokenizer, stop_token_ids  # noqa: E402
from cohort.rollout.base import Request, SamplingConfig  # noqa: E402
from tests.agents.test_engine import ScriptedEngine  # noqa: E402
from tests.tools.conftest import quick_stop_chat_model  # noqa: E402,F401 (the fixture)

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

    def run(spec, args, script, max_model_len=512, num_examples=None):
        rows = environment_rows(spec, args, num_examples)
        inner = ScriptedEngine(tokenizer, stops, list(script))
        chat = lambda sample: ChatCompletions(tokenizer, stops, sample, max_model_len=2**31)  # noqa: E731 (as wrap_engine)
        agent = VerifiersAgent(spec, args, "tiny", num_examples)
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


def test_a_tool_episode_chains_its_calls_into_one_trajectory(episodes):
    # call 0 asks the environment's MCP calculator (verifiers' tool server, a subprocess), call 1 answers with its result
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*2"}}\n</tool_call>'
    args = {**LOCAL, "taskset": {"num_tasks": 1}}
    [t], inner, tokenizer = episodes("verifiers:cohort_vf_calc", args, [call, "6"])
    run = t.episode
    assert run.error is None, run.error
    assert run.turns == 2 and run.samples == [] and run.outcome == {"reward": 1.0, "exact": 1.0}
    assert 0 in t.loss_mask and t.loss_mask[0] == 1 and t.loss_mask[-1] == 1  # the tool turn masked, both calls trained
    tool_turn = tokenizer.decode([i for i, m in zip(t.token_ids, t.loss_mask) if m == 0])
    assert "6" in tool_turn  # the calculator's result, as the chat template rendered it
    first, second = inner.requests
    assert list(second.prompt_ids[: len(first.prompt_ids)]) == list(first.prompt_ids)  # token in, token out


def train_20_steps(tmp_path, model_dir, spec, args, overrides=(), *, steps=20, engine="hf", num_examples=None):
    """20 steps (or `steps`) through the Trainer; each step's episodes, and the metrics.jsonl lines."""
    import json

    import yaml

    from cohort.config.resolve import load_config
    from cohort.trainer.trainer import Trainer
    from cohort.trainer.run import run_training

    cfg = {"model": {"path": str(model_dir)}, "data": {"max_prompt_length": 32}, "engine": {"name": engine},
           "rollout": {"num_generations": 2, "max_completion_length": 48},
           "agent": {"environment": spec, "environment_args": args, "timeout_s": 120, "num_examples": num_examples},
           "train": {"prompts_per_step": 2, "micro_batch_size": 4, "max_steps": steps},
           "run": {"progress": False, "loggers": ["jsonl"], "eval_every": 0, "save_every": 0}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    trainer = Trainer(load_config(tmp_path / "run.yaml", list(overrides)), run_dir=tmp_path / "run", log=lambda *a: None)
    recorded, step = [], trainer.step

    def recorded_step():
        metrics = step()
        b = trainer.state.batch
        recorded.append({"episodes": b.episodes, "completions": b.completion_ids, "masks": b.loss_masks,
                         "rewards": b.rewards.tolist(), "metrics": metrics, "rows": b.row_indices,
                         "advantages": [b.sequence_advantage(i) for i in range(len(b))]})
        return metrics

    trainer.step = recorded_step  # (train() writes metrics.jsonl; each step's batch is kept for the checks)
    try:
        run_training(trainer)
    finally:
        trainer.close()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return recorded, [line for line in lines if "rewards/verifiers_reward/mean" in line]


def check_every_episode_joined(steps, lines, count=20):
    assert len(steps) == count and len(lines) == count
    for step, line in zip(steps, lines):
        runs = step["episodes"]
        assert len(runs) == 4  # 2 tasks x 2 episodes, none lost
        for run, completion in zip(runs, step["completions"]):
            assert run.error is None, run.error
            assert run.turns >= 1 and completion  # its calls joined by X-Session-ID: the tokens it trained on
        rewards = [run.outcome["reward"] for run in runs]
        assert step["rewards"] == rewards
        assert line["rewards/verifiers_reward/mean"] == pytest.approx(sum(rewards) / 4, abs=1e-9)
        assert line["agent/exact"] == pytest.approx(sum(rewards) / 4, abs=1e-9) and line["agent/failed"] == 0.0


@pytest.mark.slow
def test_a_single_turn_taskset_trains_20_steps(tmp_path, quick_stop_chat_model):  # noqa: F811 (the imported fixture)
    steps, lines = train_20_steps(tmp_path, quick_stop_chat_model, "verifiers:cohort_vf_arith",
                                  {**LOCAL, "taskset": {"num_tasks": 4}})
    check_every_episode_joined(steps, lines)
    assert all(run.turns == 1 for step in steps for run in step["episodes"])


def one_point(completions, **_):
    """A reward a user adds beside the environment's: 1.0 for every completion it is asked about."""
    return [1.0] * len(completions)


@pytest.mark.slow
def test_rewards_beside_an_environment_add_to_its_reward_and_skip_its_failed_episodes(tmp_path, quick_stop_chat_model):  # noqa: F811
    # refused at 4f35103 ("the environment's episode reward is the run's reward"). Task 1's scorer raises (verifiers
    # fails that episode: EpisodeFailed), task 0's scores as usual; `one_point` is added at weight 0.5. Every step's
    # 4 rows (2 tasks x G = 2): task 0's total = its episode reward + 0.5 x 1.0; task 1's NaN (scored by nothing:
    # neither the environment's reward nor one_point; advantage 0) and agent/failed counts its 2 episodes.
    steps, lines = train_20_steps(tmp_path, quick_stop_chat_model, "verifiers:cohort_vf_arith",
                                  {**LOCAL, "taskset": {"num_tasks": 2, "broken_tasks": [1]}},
                                  ["rewards=[{name: tests.agents.test_verifiers.one_point, weight: 0.5}]"], steps=2)
    assert len(steps) == 2
    for step in steps:
        for run, row, total, advantage in zip(step["episodes"], step["rows"], step["rewards"], step["advantages"]):
            if row == 1:
                assert run.failed and "the scorer broke" in run.error and math.isnan(total) and advantage == 0.0
            else:
                assert not run.failed and total == run.outcome["reward"] + 0.5
        assert step["metrics"]["agent/failed"] == 2.0


@pytest.mark.slow
def test_a_tool_taskset_trains_8_steps(tmp_path, quick_stop_chat_model):  # noqa: F811 (the imported fixture)
    # 8 steps, not 20: a step of 4 three-turn episodes on subprocess runtimes took ~30 s at load 3 (589 s for 20, against
    # pytest's 900 s limit; past it at load 12); 8 steps show the same joins and masks
    args = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}, "max_turns": 3},
            "taskset": {"num_tasks": 4}}
    steps, lines = train_20_steps(tmp_path, quick_stop_chat_model, "verifiers:cohort_vf_calc", args,
                                  ["tools.parser=cohort_vf_calc.parse", "agent.render_tools=false"], steps=8)
    # (render_tools false: the template's tools block alone is ~430 tokens, past the tiny model's 256 positions; the
    # parser makes the calls)
    check_every_episode_joined(steps, lines, count=8)
    runs = [run for step in steps for run in step["episodes"]]
    assert any(run.turns > 1 for run in runs)  # some episodes called the calculator...
    masks = [m for step in steps for m in step["masks"]]
    assert any(0 in m for m in masks)  # ...whose results are in the trajectories, masked


# ------------------------------------------------------------------ a two-seat game (issue 53, defects 7-10)
# cohort_vf_duel is shaped as verifiers' own kuhn_poker package: an infinite taskset with no size field, prompt-less
# tasks, two seats (player0, player1) on verifiers' default runtime (Prime's remote sandboxes), its own config fields.
DUEL = "verifiers:cohort_vf_duel"
DUEL_LOCAL = {seat: {"runtime": {"type": "subprocess"}} for seat in ("player0", "player1")}


def test_an_unknown_taskset_field_is_one_line_naming_the_field_the_fields_and_the_fix():
    # docs' old `taskset: {num_tasks: N}` is no verifiers 0.4 field (TasksetConfig has id, task, system_prompt; a
    # taskset adds its own): one line, not pydantic's multi-line ValidationError
    [problem] = check_environment(DUEL, {**DUEL_LOCAL, "taskset": {"num_tasks": 4}}, 4)
    assert "\n" not in problem
    assert "agent.environment_args.taskset.num_tasks is not a field (DuelConfig's fields: task, system_prompt, id, stake)" in problem
    assert "agent.num_examples (vf-eval's -n)" in problem
    [problem] = check_environment(DUEL, {**DUEL_LOCAL, "player0": {"runtime": {"type": "subprocess"}, "max_turn": 2}}, 4)
    assert "agent.environment_args.player0.max_turn is not a field (AgentConfig's fields: harness, runtime," in problem
    assert "\n" not in problem


def test_an_infinite_taskset_is_bounded_by_num_examples_and_prompt_less_tasks_are_rows():
    [problem] = check_environment(DUEL, DUEL_LOCAL)
    assert problem == (f"agent.environment = {DUEL!r}: its taskset is infinite; set agent.num_examples (vf-eval's -n) "
                       "to train on its first N tasks")
    assert check_environment(DUEL, DUEL_LOCAL, 3) == []
    rows = environment_rows(DUEL, DUEL_LOCAL, 3)  # (each task has prompt None: its name stands in as the row's prompt)
    assert [r["prompt"] for r in rows] == [[{"role": "user", "content": f"round#{i}"}] for i in range(3)]
    from cohort.data.datasets import rows_dataset

    assert len(rows_dataset(rows, "prompt", "duel")) == 3  # the row check accepts them


def test_every_seat_left_on_remote_sandboxes_is_refused_naming_its_field():
    problems = check_environment(DUEL, {"player1": {"runtime": {"type": "subprocess"}}}, 4)
    assert problems == [f"agent.environment = {DUEL!r}: seat 'player0' runs its harness in prime's remote sandboxes "
                        "(verifiers' default); set agent.environment_args.player0.runtime.type=subprocess to run it here"]


def test_a_two_seat_episode_gives_each_seat_its_trajectory_and_its_own_reward(episodes):
    # stake 1; player0 shows 2, player1 shows 0: 2 + 0 + 1 = 3 is divisible by the modulus 3, so player0 wins: +1 and -1
    args = {**DUEL_LOCAL, "taskset": {"stake": 1}}
    [t], inner, tokenizer = episodes(DUEL, args, ["2", "0"], num_examples=1)
    run = t.episode
    assert run.error is None, run.error
    assert run.turns == 2 and run.outcome["reward"] == 0.0  # the episode's own reward: the seats' mean
    player0, player1 = run.seats
    assert (player0.episode.seat, player1.episode.seat) == ("player0", "player1")
    assert player0.episode.outcome == {"reward": 1.0, "payoff": 1.0}
    assert player1.episode.outcome == {"reward": -1.0, "payoff": -1.0}
    stop = inner.stop_token_ids[0]
    assert player0.token_ids == tokenizer("2", add_special_tokens=False)["input_ids"] + [stop]  # each seat's own call
    assert player1.token_ids == tokenizer("0", add_special_tokens=False)["input_ids"] + [stop]
    assert "You are Player 0" in tokenizer.decode(player0.prompt_ids)  # each seat's own prompt
    assert "You are Player 1" in tokenizer.decode(player1.prompt_ids)


@pytest.mark.vllm
def test_a_two_seat_zero_sum_game_trains_each_seat_on_its_own_reward(tmp_path, quick_stop_chat_model):  # noqa: F811
    # 4 steps through vLLM: 2 rounds x 4 episodes a step, each episode two seats. Before (4db2852) every seat trained on
    # the mean of the seats' zero-sum payoffs: every reward 0, every advantage 0. Now each step's batch has 16 rows
    # (2 rounds x 2 seats x 4 episodes), in groups of 4 of one seat of one round, each row its seat's own payoff.
    pytest.importorskip("vllm")
    steps, lines = train_20_steps(tmp_path, quick_stop_chat_model, DUEL, DUEL_LOCAL,
                                  ["rollout.num_generations=4", "rollout.max_completion_length=8", "train.micro_batch_size=8"],
                                  steps=4, engine="vllm", num_examples=4)
    assert len(steps) == 4 and len(lines) == 4
    for step, line in zip(steps, lines):
        seats = [run.seat for run in step["episodes"]]
        assert seats == (["player0"] * 4 + ["player1"] * 4) * 2  # one group per seat per round
        assert len(set(step["rows"][:8])) == 1 and len(set(step["rows"][8:])) == 1
        rewards = step["rewards"]
        assert set(rewards) <= {1.0, -1.0}  # a seat's own payoff, never the seats' mean (0)
        for k in range(0, 16, 8):  # zero-sum: each player0 row and the player1 row of the same episode sum to 0
            assert [a + b for a, b in zip(rewards[k:k + 4], rewards[k + 4:k + 8])] == [0.0] * 4
        assert line["rewards/verifiers_reward/mean"] == 0.0  # the episodes' own reward is still the seats' mean
        p0, p1 = line["agent/seat/player0/reward"], line["agent/seat/player1/reward"]
        assert p0 == pytest.approx(sum(r for r, s in zip(rewards, seats) if s == "player0") / 8) and p1 == -p0
    for line in lines:  # (the numbers, shown with pytest -s)
        print({key: round(line[key], 4) for key in sorted(line) if key.startswith("agent/seat/")})
    player0 = [line["agent/seat/player0/reward"] for line in lines]
    player1 = [line["agent/seat/player1/reward"] for line in lines]
    assert sum(player0) != 0 and sum(player0) == -sum(player1)  # different, nonzero means over the run
    advantages = [a for step in steps for a in step["advantages"]]
    assert any(abs(a) > 0.5 for a in advantages)  # GRPO sees a signal (every advantage was 0 before)
    assert any(line["agent/seat/player0/advantage_abs"] > 0 for line in lines)

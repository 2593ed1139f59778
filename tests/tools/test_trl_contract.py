"""TRL's `environment_factory` contract, on classes in the shapes of TRL's GRPO docs (tests/tools/envs/increment_env.py):
each rollout's `reset` gets its own row, a dataset-less environment trains on placeholder rows, a class without
`reset` is refused, a failed episode is scored by nothing, and what reset showed the model reaches the reward
functions' `prompts` and the run's records. Training runs use the transformers engine on `quick_stop_chat_model` (a
random tiny chat model whose turns end after a few tokens)."""

from __future__ import annotations

import json

import pytest

import cohort
from cohort.api import build_config
from cohort.config import ConfigError
from cohort.plan.run_environment import run_data
from tests.tools.test_openenv import ENVS

G = 2


@pytest.fixture
def envs(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))
    import increment_env

    increment_env.RESETS.clear()
    increment_env.REWARDED.clear()
    return increment_env


def _config(tmp_path, model_dir, environment, *, steps=1, prompts_per_step=4, **sections):
    config = {"model": {"path": str(model_dir)}, "data": {"max_prompt_length": 64},
              "rollout": {"num_generations": G, "max_completion_length": 32}, "engine": {"name": "hf"},
              "tools": {"in_prompt": False, "environment": environment, "max_turns": 2},
              "train": {"prompts_per_step": prompts_per_step, "micro_batch_size": 8, "max_steps": steps},
              "run": {"output_dir": str(tmp_path / "run"), "progress": False, "loggers": ["jsonl"],
                      "log_completions_every": 1, "num_completions_to_log": 8}}
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


def _metrics(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


SAME_PROMPT = [{"role": "user", "content": "Increment the counter to the target."}]


@pytest.mark.slow
def test_each_reset_gets_its_own_row_as_the_rewards_do(tmp_path, quick_stop_chat_model, envs):
    # 4 train rows and 2 eval rows with one prompt, told apart only by `target` and `seed` (TRL's common pattern)
    train = [{"prompt": SAME_PROMPT, "target": t, "seed": 100 + t} for t in (1, 2, 3, 4)]
    evals = [{"prompt": SAME_PROMPT, "target": t, "seed": 100 + t} for t in (11, 12)]
    config = _config(tmp_path, quick_stop_chat_model, "increment_env.TargetEnv", steps=2)
    summary = cohort.train(config, train_dataset=train, eval_dataset=evals,
                           reward_funcs=["increment_env.target_seen"])
    # every trajectory's environment was reset with the row its reward got: 8 of 8 per step (at 4db2852 the prompt's
    # first row reached every reset: 2 of 8, the target-1 group)
    assert [m["rewards/target_seen/mean"] for m in _metrics(tmp_path)] == [1.0, 1.0]
    # the held-out eval's resets got the eval rows (target 11, 12), not a train row with the same prompt
    assert summary["eval/accuracy_before"] == 1.0 and summary["eval/accuracy_after"] == 1.0
    # each step's 4 groups of G = 2 reset from 4 distinct rows, every column passed (the prompt too, as TRL does)
    train_resets = [r for r in envs.RESETS if r["target"] < 10]
    assert len(train_resets) == 2 * 4 * G
    for step in range(2):
        seen = train_resets[step * 4 * G:(step + 1) * 4 * G]
        assert sorted((r["target"], r["seed"]) for r in seen) == sorted([(t, 100 + t) for t in (1, 2, 3, 4)] * G)
    assert all(r["prompt"] == SAME_PROMPT for r in envs.RESETS)
    # before and after, each eval row resets once for its greedy answer and run.eval_num_samples (4) times for
    # pass@k's samples: 2 × (1 + 4) = 10 resets of each eval row
    assert sorted(r["target"] for r in envs.RESETS if r["target"] > 10) == [11] * 10 + [12] * 10


def _completions(tmp_path):
    return [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]


SMALL = {"data": {"max_prompt_length": 32}, "rollout": {"max_completion_length": 32}}  # (tiny:tool_calc: 128 positions)
# (the tools sections below say "in_prompt": False: these tiny models have no room for a tools block, which
# tests/tools/test_chat_template.py covers)


def test_dataset_less_environment_makes_a_generation_batch_of_empty_placeholder_rows(envs):
    # TRL without a train_dataset: generation_batch_size // num_generations rows, each an empty user message. Here
    # prompts_per_step 3 × G 2 × steps_per_generation 2 = 12 completions a generation batch, so 12 // 2 = 6 rows
    config = build_config({"model": {"path": "tiny:tool_calc"}, **SMALL, "rollout": {"num_generations": 2, "max_completion_length": 32},
                                  "train": {"prompts_per_step": 3, "steps_per_generation": 2, "micro_batch_size": 6},
                                  "tools": {"in_prompt": False, "environment": "increment_env.IncrementEnv"}})
    assert config.data.task is None  # not the default built-in task (arith)
    train, evals, _ = run_data(config)
    assert train.rows == [{"prompt": [{"role": "user", "content": ""}]}] * 6 and evals is None
    # the Python API's environment= alike (the class itself; no demo preset's arith task either)
    assert build_config({"model": {"path": "tiny:tool_calc"}, **SMALL}, environment=envs.IncrementEnv).data.task is None
    # a task named explicitly is still trained on: only an unset data.task gives way to the environment
    named = build_config({"model": {"path": "tiny:tool_calc"}, **SMALL, "data": {"task": "arith", "max_prompt_length": 32},
                                 "tools": {"in_prompt": False, "environment": "increment_env.IncrementEnv"}})
    assert named.data.task == "arith"


@pytest.mark.slow
def test_dataset_less_environment_trains_on_the_prompts_its_reset_returns(tmp_path, quick_stop_chat_model, envs):
    config = _config(tmp_path, quick_stop_chat_model, "increment_env.IncrementEnv", prompts_per_step=2)
    summary = cohort.train(config)  # TRL docs' shape: reset returns the prompt, get_reward scores, no dataset
    # every reset got a placeholder row (an empty user message), none an arithmetic prompt (at 4db2852: arith's)
    assert len(envs.RESETS) == 2 * G and all(r == {"prompt": [{"role": "user", "content": ""}]} for r in envs.RESETS)
    shown = [c["prompt"] for c in _completions(tmp_path)]
    assert len(shown) == 2 * G and all(len(p) == 1 and p[0]["role"] == "user" for p in shown)
    assert all(p[0]["content"].startswith("Increment the counter by ") for p in shown)  # reset's text is the prompt
    assert "eval/accuracy_before" not in summary  # no eval data given: no eval (at 4db2852: arith's held-out set)
    assert "rewards/environment/mean" in _metrics(tmp_path)[0]


def test_a_class_without_reset_is_refused_before_anything_loads(envs):
    with pytest.raises(ConfigError, match=r"tools.environment NoResetEnv has no reset method; add `def reset"):
        build_config({"model": {"path": "tiny:tool_calc"}, **SMALL, "tools": {"in_prompt": False, "environment": "increment_env.NoResetEnv"}})


@pytest.mark.slow
def test_a_failed_episode_is_scored_by_nothing_and_the_run_goes_on(tmp_path, quick_stop_chat_model, envs):
    # FlakyEnv: reset raises for target 1, returns an observation longer than the model's 256 positions for target 3
    # (the prompt passes the engine's context), and resets cleanly for 2 and 4; its get_reward reads state only a
    # clean reset sets, so scoring a failed episode with it fails the run (as it did at 4db2852)
    train = [{"prompt": [{"role": "user", "content": f"Task {t}."}], "target": t} for t in (1, 2, 3, 4)]
    config = _config(tmp_path, quick_stop_chat_model, "increment_env.FlakyEnv")
    cohort.train(config, train_dataset=train, reward_funcs=["increment_env.target_seen"])
    (m,) = _metrics(tmp_path)
    assert m["tools/failed_episodes"] == 2 * G  # targets 1 and 3, G episodes each
    # the failed episodes are left out of every reward: target_seen scored 4 rows, all 1.0 (a failed instance
    # would have scored 0), and get_reward's mean is over targets 2 and 4 only: (2 + 4) / 2 = 3
    assert m["rewards/target_seen/mean"] == 1.0 and m["rewards/environment/mean"] == 3.0
    records = {c["prompt"][0]["content"]: c for c in _completions(tmp_path)}
    assert "no board for target 1" in records["Task 1."]["failure"]
    assert "past the engine's context of 256" in records["Task 3."]["failure"]
    for task in ("Task 1.", "Task 3."):  # every reward None: the total is NaN (written null) and the advantage 0
        assert records[task]["reward"] is None and records[task]["advantage"] == 0.0
    assert "failure" not in records["Task 2."] and records["Task 2."]["reward"] == 1.0 + 2.0


@pytest.mark.slow
def test_what_reset_showed_reaches_the_rewards_the_completions_and_the_report(tmp_path, quick_stop_chat_model, envs):
    train = [{"prompt": [{"role": "user", "content": "Play."}], "board": b} for b in ("x.o.", "oox.")]
    config = _config(tmp_path, quick_stop_chat_model, "increment_env.BoardEnv", prompts_per_step=2)
    cohort.train(config, train_dataset=train, reward_funcs=["increment_env.seen_by_reward"])
    # the step's 2 groups, in the reward calls they were scored in (one per engine poll that completed groups)
    call = {key: [x for c in envs.REWARDED for x in c[key]] for key in ("prompts", "conversations", "board")}
    # TRL passes reward functions the prompt with reset's text appended to the last user message
    assert sorted(p[-1]["content"] for p in call["prompts"]) == ["Play. Board: oox."] * G + ["Play. Board: x.o."] * G
    assert [c[0] for c in call["conversations"]] == [p[-1] for p in call["prompts"]]
    assert call["board"] == [p[-1]["content"][-4:] for p in call["prompts"]]  # each its own row
    for record in _completions(tmp_path):  # completions.jsonl: the prompt as shown, and the observation itself
        assert record["prompt"][-1]["content"] == "Play." + record["observation"]
        assert record["observation"] in (" Board: x.o.", " Board: oox.")
    from cohort.runs.report import write_report

    page = write_report(tmp_path / "run").read_text()
    assert "Play. Board: x.o." in page and "Play. Board: oox." in page


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.builtin_models("tool_calc")
def test_rows_reach_reset_in_a_vllm_run_with_partial_rollouts(tmp_path, envs):
    """End to end on vLLM with tiny:tool_calc (a chat model warm-started to call a calculator through hermes calls):
    3 steps of 4 prompts × G = 2 over 8 rows that share one prompt, with partial rollouts (pipeline.over_provision 2:
    the groups left when a batch is whole go to the continuation buffer, complete or cut off, and are taken or
    resumed next step: measured, step 2's batch was all buffered groups, partial/ratio 1.0), so the rows must travel
    with the groups and their requests, not be looked up again. The model makes real calculator calls (1-4 a step)."""
    pytest.importorskip("vllm")
    train = [{"prompt": [{"role": "user", "content": "12*34="}], "target": t, "seed": 100 + t} for t in range(8)]
    config = {"model": {"path": "tiny:tool_calc"}, "data": {"max_prompt_length": 24},
              "rollout": {"num_generations": G, "max_completion_length": 48}, "engine": {"name": "vllm"},
              "tools": {"in_prompt": False, "environment": "increment_env.TargetEnv", "functions": ["cohort.tools.builtin.calculator"],
                        "parser": "hermes", "max_turns": 2},
              "pipeline": {"over_provision": 2.0},
              "train": {"prompts_per_step": 4, "micro_batch_size": 8, "max_steps": 3},
              "run": {"output_dir": str(tmp_path / "run"), "progress": False, "loggers": ["jsonl"]}}
    cohort.train(config, train_dataset=train, reward_funcs=["increment_env.target_seen"])
    metrics = _metrics(tmp_path)
    assert [m["rewards/target_seen/mean"] for m in metrics] == [1.0, 1.0, 1.0]  # at 4db2852: 1 row of 8 (target 0)
    targets = sorted({r["target"] for r in envs.RESETS})
    assert targets == list(range(8)) and all(r["seed"] == 100 + r["target"] for r in envs.RESETS)


@pytest.mark.slow
def test_a_run_whose_every_episode_fails_stops_with_the_message_and_its_checkpoint(tmp_path, quick_stop_chat_model, envs):
    # issue 60, defect 1: at 74eaa87 a run whose every episode failed (verifiers' glossary on SmolLM2: 8 of 8 at every
    # step) trained on nothing for all its steps and exited 0, warnings.jsonl empty. FlakyEnv's reset raises for
    # target 1: every episode of every step fails; run.max_failed_steps = 2 stops the 5-step run after step 2.
    from cohort.trainer.failure import RunFailed

    train = [{"prompt": [{"role": "user", "content": f"Task {i}."}], "target": 1} for i in range(4)]
    config = _config(tmp_path, quick_stop_chat_model, "increment_env.FlakyEnv", steps=5, run={"max_failed_steps": 2})
    why = "tools.environment FlakyEnv: reset(**row) failed (row columns ['prompt', 'target']): RuntimeError: no board for target 1"
    with pytest.raises(RunFailed) as stopped:
        cohort.train(config, train_dataset=train, reward_funcs=["increment_env.target_seen"])
    run_dir = tmp_path / "run"
    assert str(stopped.value).startswith(
        f"run failed after step 2: every episode failed at steps 1 to 2 (8 of 8 at step 2), so the run trained on nothing: "
        f"{why}. Fix that cause, or set run.max_failed_steps=0 to train on regardless\n"
        f"Saved the last good state (after step 2) to {run_dir / 'checkpoints' / 'step-000002'}")
    assert (run_dir / "logs" / "error.log").is_file() and len(_metrics(tmp_path)) == 2
    warnings = [json.loads(line) for line in (run_dir / "warnings.jsonl").read_text().splitlines()]
    assert [(w["step"], w["value"], w["failures"]) for w in warnings] == [(1, 8.0, {why: 8}), (2, 8.0, {why: 8})]
    completions = [json.loads(line) for line in (run_dir / "completions.jsonl").read_text().splitlines()]
    assert len(completions) == 16 and all(c["failure"] == why for c in completions)

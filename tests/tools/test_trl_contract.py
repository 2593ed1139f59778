"""TRL's `environment_factory` contract, on classes in the shapes of TRL's GRPO docs (tests/tools/envs/increment_env.py):
each rollout's `reset` gets its own row, a dataset-less environment trains on placeholder rows, a class without
`reset` is refused, a failed episode is scored by nothing, and what reset showed the model reaches the reward
functions' `prompts` and the run's records. Training runs use the transformers engine on `quick_stop_chat_model` (a
random tiny chat model whose turns end after a few tokens)."""

from __future__ import annotations

import json

import pytest

import cohort
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
              "tools": {"environment": environment, "max_turns": 2},
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
    assert sorted(r["target"] for r in envs.RESETS if r["target"] > 10) == [11, 11, 12, 12]  # before and after

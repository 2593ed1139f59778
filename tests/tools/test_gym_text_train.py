"""Training through a Gymnasium text environment (tests/tools/envs/hangman_env.py, `tools.environment:
gym:hangman_env:Hangman-v0`) with vLLM: 3 steps of G = 4 on `quick_stop_chat_model` (a random tiny chat model whose
turns end after a few tokens, so episodes are multi-turn), every turn read as a letter (game_parse.letter_parse)."""

from __future__ import annotations

import json

import pytest

import cohort
from tests.tools.test_openenv import ENVS

STEPS, G = 3, 4


@pytest.mark.slow
@pytest.mark.vllm
def test_a_gymnasium_text_game_trains_through_vllm(tmp_path, quick_stop_chat_model, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.syspath_prepend(str(ENVS))
    # rows: a prompt, a seed (the game's draw: a group's G trajectories play the same word) and no word column
    rows = [{"prompt": [{"role": "user", "content": f"Play hangman ({k})."}], "seed": k} for k in range(8)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"model": {"path": str(quick_stop_chat_model)}, "engine": {"name": "vllm"},
              "data": {"train_files": [str(tmp_path / "train.jsonl")], "max_prompt_length": 48},
              "rollout": {"num_generations": G, "max_completion_length": 96},
              "tools": {"in_prompt": False, "environment": "gym:hangman_env:Hangman-v0", "parser": "game_parse.letter_parse", "max_turns": 4},
              "train": {"prompts_per_step": 2, "micro_batch_size": 8, "max_steps": STEPS, "learning_rate": 1e-3},
              "rewards": [],  # the episode's rewards summed (the adapter's get_reward): the `environment` reward
              "run": {"output_dir": str(tmp_path / "run"), "progress": False, "loggers": ["jsonl"]}}
    cohort.train(config)
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, STEPS + 1))
    assert all(m["tools/calls/step"] > 0 for m in lines)  # every turn is a move
    assert all(m["tools/status/error"] == 0 for m in lines)  # no episode failed
    # an episode's sum: the shares of its word a move showed (at most 1) minus 0.1 a wrong move (at most 4 moves)
    rewards = [m["rewards/environment/mean"] for m in lines]
    assert all(-0.4 <= r <= 1 for r in rewards) and any(r != 0 for r in rewards), rewards

"""bench/env_rollouts_engine.py's arithmetic: a run's rollout seconds from its metrics lines, and the overhead per
episode (no benchmark runs here)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import env_rollouts_engine as bench  # noqa: E402


def lines(*steps):
    return [{"step": k, "timing/generate_s": g, "timing/reward_s": r, "tokens/generated": t, "reward": 0.5, **extra}
            for k, (g, r, t, extra) in enumerate(steps, start=1)]


def test_the_first_step_is_left_out_and_generate_plus_reward_is_the_rollout():
    run = bench.summarise(lines((9.0, 1.0, 100, {}), (2.0, 0.5, 40, {"tools/turns_mean": 2.0}),
                                (3.0, 0.25, 60, {"tools/turns_mean": 3.0})), completions_per_step=16)
    # steps 2 and 3: (2.0 + 0.5) + (3.0 + 0.25) = 5.75 s over 2 x 16 = 32 episodes
    assert run["steps"] == [2, 3] and run["episodes"] == 32
    assert run["rollout_s"] == 5.75 and run["generate_s"] == 5.0 and run["reward_s"] == 0.75
    assert run["rollout_s_per_step"] == [2.5, 3.25]
    assert run["sampled_tokens"] == 100 and run["turns_per_episode"] == 2.5  # (2 + 3) / 2


def test_a_run_without_turn_metrics_has_one_turn_and_one_step_alone_is_refused():
    assert bench.summarise(lines((1.0, 0.0, 1, {}), (1.0, 0.0, 1, {})), 4)["turns_per_episode"] == 1.0
    with pytest.raises(ValueError, match="no step after the first 1"):
        bench.summarise(lines((1.0, 0.0, 1, {})), 4)


def test_overhead_per_episode():
    connector, plain = {"episodes": 32, "rollout_s": 5.75}, {"episodes": 32, "rollout_s": 4.15}
    assert bench.overhead_ms_per_episode(connector, plain) == 50.0  # (5.75 - 4.15) s / 32 = 0.05 s
    assert bench.overhead_ms_per_episode(plain, connector) == -50.0  # a connector may come out faster: noise, kept
    with pytest.raises(ValueError, match="differ in episodes"):
        bench.overhead_ms_per_episode({"episodes": 16, "rollout_s": 1.0}, plain)

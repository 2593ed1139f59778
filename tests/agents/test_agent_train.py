"""examples/agent_openai.py (the real `openai` client, its own tool loop) trains tiny:tool_calc through the loopback
endpoint, and trains exactly what the in-process tool loop (examples/tool_calc.yaml) trains for the same seeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cohort.config.resolve import load_config
from cohort.agents.runs import AgentRun
from cohort.trainer.trainer import Trainer

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["train.max_steps=2", "train.prompts_per_step=4", "run.eval_every=0", "run.save_every=0"]


def two_steps(name: str, run_dir: Path, overrides: list[str]) -> list[dict]:
    """The batch each of two optimizer steps trained: prompts, completions, masks, rewards, metrics, episodes."""
    trainer = Trainer(load_config(EXAMPLES / f"{name}.yaml", SMALL + overrides), run_dir=run_dir, log=lambda *a: None)
    try:
        out = []
        for _ in range(2):
            metrics = trainer.step()
            b = trainer.state.batch
            out.append({"prompts": b.prompt_ids, "completions": b.completion_ids, "masks": b.loss_masks,
                        "rewards": b.rewards.tolist(), "metrics": metrics, "episodes": b.episodes})
        return out
    finally:
        trainer.close()


@pytest.mark.slow
@pytest.mark.builtin_models('tool_calc')
def test_the_openai_agent_trains_the_tool_loops_tokens_and_its_rewards(tmp_path):
    tool = two_steps("tool_calc", tmp_path / "tool", [])
    agent = two_steps("agent_openai", tmp_path / "agent", [f"agent.function={EXAMPLES / 'agent_openai.py'}:agent"])
    for step, (t, a) in enumerate(zip(tool, agent)):
        # the same seeds and tool outputs: the same prompt ids, token ids and loss masks, step after step (step 2 is
        # sampled after the first update, so the updates were the same too)
        assert a["prompts"] == t["prompts"], f"step {step + 1}"
        assert a["completions"] == t["completions"], f"step {step + 1}"
        assert a["masks"] == t["masks"], f"step {step + 1}"
        assert any(0 in m for m in a["masks"]) and any(1 in m for m in a["masks"])  # tool turns masked, answers trained
        # the rewards are the agent's: each row's reward is what its run returned, and they reach the metrics
        runs = a["episodes"]
        assert all(isinstance(r, AgentRun) and r.error is None for r in runs)
        assert a["rewards"] == [r.outcome["reward"] for r in runs]
        assert a["metrics"]["rewards/agent_reward/mean"] == pytest.approx(sum(a["rewards"]) / len(runs), abs=1e-12)
        assert a["metrics"]["reward"] == pytest.approx(sum(a["rewards"]) / len(runs), abs=1e-12)
        assert a["metrics"]["agent/model_calls"] == pytest.approx(sum(r.turns for r in runs) / len(runs), abs=1e-12)
        assert a["metrics"]["agent/samples_mean"] == 1.0  # every run was one chain: one trajectory each
        # the agent's reward (the final answer's last number) and numeric_match (the whole completion's) agree on
        # every run whose last turn holds a number, the tool loop's reward on the same tokens
        agree = sum(x == y for x, y in zip(a["rewards"], t["rewards"]))
        assert agree >= len(runs) - 2, (a["rewards"], t["rewards"])
        assert 0 < sum(a["rewards"]) < len(runs)


async def forgetful_agent(client, row):
    """Asks, then asks again with only the question (it drops its first reply): a history rewrite."""
    messages = list(row["prompt"])
    await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    again = await client.chat.completions.create(model="m", messages=messages + [{"role": "user", "content": "again"}],
                                                 max_tokens=8)
    return float(len(again.choices[0].message.content or "") % 2)  # (any reward that differs within a group)


@pytest.mark.slow
@pytest.mark.builtin_models('tool_calc')
def test_a_rewriting_agent_trains_one_sample_per_call(tmp_path):
    cfg = load_config(EXAMPLES / "agent_openai.yaml", ["train.max_steps=1", "train.prompts_per_step=2", "run.eval_every=0",
                                                       "algorithm.beta=0.04"])  # (a reference: its log-probs must cover every sample)
    cfg.agent.function = forgetful_agent
    trainer = Trainer(cfg, run_dir=tmp_path, log=lambda *a: None)
    try:
        metrics = trainer.step()
        b = trainer.state.batch
    finally:
        trainer.close()
    # 2 prompts x G = 8 runs, two calls each, never a chain: 32 samples, each run's first call just before its row
    assert metrics["agent/samples_mean"] == 2.0 and metrics["agent/calls_mean"] == 2.0
    assert len(b) == 32 and b.row_indices[0::2] == b.row_indices[1::2]
    assert all(len(c) <= 8 for c in b.completion_ids) and all(set(m) == {1} for m in b.loss_masks)
    assert all(len(b.prompt_ids[2 * i]) < len(b.prompt_ids[2 * i + 1]) for i in range(16))  # "again" made the second longer
    assert b.rewards[0::2].tolist() == b.rewards[1::2].tolist()
    for i in range(16):  # each first call carries its run's advantage on every one of its tokens
        run_advantage = b.sequence_advantage(2 * i + 1)
        first = b.advantages[2 * i, : len(b.completion_ids[2 * i])]
        assert torch.allclose(first, torch.full_like(first, run_advantage), atol=1e-6)
    assert len({round(b.sequence_advantage(i), 6) for i in range(32)}) > 1  # (not all zero: the group's rewards differ)
    assert metrics["loss"] == metrics["loss"]  # (finite: the step ran over all 32)
    # the reference scored the widened batch: one row of log-probs per sample, as long as its completion
    assert b.ref_logp is not None and [len(r) for r in b.ref_logp] == [len(c) for c in b.completion_ids]


async def summarising_agent(client, row):
    """Asks; then starts a fresh conversation holding only a summary of its first reply and asks again: every run's
    second call extends no earlier call (a history rewrite, as context-compressing agents do)."""
    question = row["prompt"][-1]["content"]
    first = await client.chat.completions.create(model="m", messages=list(row["prompt"]), max_tokens=6)
    summary = (first.choices[0].message.content or "")[:12]
    again = await client.chat.completions.create(model="m", max_tokens=6, messages=[
        {"role": "user", "content": f"{question} (your notes so far: {summary!r})"}])
    return float(len(again.choices[0].message.content or "") % 2)  # (any reward that differs within a group)


@pytest.mark.slow
@pytest.mark.builtin_models('tool_calc')
def test_a_summarising_agent_trains_with_ppo_two_steps_per_generation(tmp_path):
    # refused at 4f35103 (a critic, and more than one optimizer step per generation batch, with an agent). One
    # generation batch of 4 prompts x G = 4 runs, each two calls that do not chain: 32 rows, trained in 2 steps of 2
    # prompts; lam = gamma = 1, beta = 0, so each trained token's return is its run's reward (GAE's telescoping sum:
    # A_t = R - V_t, returns = A_t + V_t).
    cfg = load_config(EXAMPLES / "agent_openai.yaml", [
        "train.max_steps=2", "train.prompts_per_step=2", "train.steps_per_generation=2", "rollout.num_generations=4",
        "algorithm.name=ppo", "algorithm.lam=1.0", "run.eval_every=0", "run.save_every=0"])
    cfg.agent.function = summarising_agent
    trainer = Trainer(cfg, run_dir=tmp_path, log=lambda *a: None)
    try:
        first = trainer.step()
        b, rows_first = trainer.state.batch, list(trainer.state.step_indices)
        second = trainer.step()
        rows_second = list(trainer.state.step_indices)
        assert trainer.state.batch is b  # (the same generation batch served both steps)
    finally:
        trainer.close()
    assert first["agent/samples_mean"] == 2.0 and len(b) == 32
    assert b.runs == [k // 2 for k in range(32)] and b.num_runs == 16
    # step 1 trained runs 0-7 (the first 2 prompts' groups, both calls of each), step 2 runs 8-15
    assert rows_first == list(range(16)) and rows_second == list(range(16, 32))
    # the critic valued every row's own tokens, and every trained token's return is its run's reward
    assert [len(v) for v in b.values] == [len(c) for c in b.completion_ids]
    for i in range(32):
        n = len(b.completion_ids[i])
        trained = b.token_mask([i], n)[0].bool()
        assert torch.allclose(b.returns[i, :n][trained], torch.full((int(trained.sum()),), float(b.rewards[i])), atol=1e-5)
    assert b.rewards[0::2].tolist() == b.rewards[1::2].tolist()  # a run's two rows: one reward
    assert any(not torch.equal(b.advantages[2 * k], b.advantages[2 * k + 1]) for k in range(16))  # each row its own GAE
    # metrics count runs: reward is the mean over the 16 runs
    assert first["reward"] == pytest.approx(float(b.rewards[1::2].mean()), abs=1e-12)
    for metrics in (first, second):
        assert np.isfinite(metrics["loss"]) and np.isfinite(metrics["critic/loss"])


@pytest.mark.slow
@pytest.mark.builtin_models('tool_calc')
def test_the_openai_agent_trains_under_partial_rollouts_its_cut_runs_starting_over(tmp_path):
    # refused at 4f35103 ("an interrupted agent run cannot be resumed"). pipeline.over_provision = 2 with 2 prompts a
    # step: ceil(2 x 2) = 4 groups of G = 8 runs in flight, the first 2 whole groups are trained and the other 2 are
    # buffered (finished members kept, cut-off runs to start over: AgentRun.resumable), so every step ends with 2
    # groups buffered. Whether a run is cut depends on timing (tests/trainer/test_partial.py fixes the rule by hand);
    # what must hold every step: 16 trained rows, each a finished run (status ok, never "aborted"), none continued
    # from its tokens (partial/resumed 0: agent runs start over).
    cfg = load_config(EXAMPLES / "agent_openai.yaml", ["train.max_steps=3", "train.prompts_per_step=2", "run.eval_every=0",
                                                       "run.save_every=0", "pipeline.over_provision=2"])
    trainer = Trainer(cfg, run_dir=tmp_path, log=lambda *a: None)
    try:
        for _ in range(3):
            metrics = trainer.step()
            b = trainer.state.batch
            assert len(b) == 16 and {e.status for e in b.episodes} == {"ok"}
            assert all(len(c) > 0 for c in b.completion_ids) and np.isfinite(metrics["loss"])
            assert metrics["partial/buffered_groups"] == 2.0 and metrics["partial/resumed"] == 0.0
    finally:
        trainer.close()

"""A run's reward specs come from one composer (cohort/plan/run_rewards.py): the agent's reward, then `rewards` (or
the built-in task's), then a tools environment's `get_reward()`; validation, the trainer's setup and `cohort eval`
read the same list. Rewards beside agent.function are added to the agent's (they were refused before 2026-12-07).
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from cohort import cli
from cohort.agents.agent_checks import agent_problems
from cohort.agents.reward import agent_reward
from cohort.agents.verifiers import verifiers_reward
from cohort.config import CohortConfig
from cohort.config.resolve import load_config
from cohort.plan.run_environment import RunEnvironment
from cohort.plan.run_rewards import reward_specs
from cohort.plan.validate import validate_config
from cohort.rewards import RewardSet
from cohort.tools.tool_schemas import environment_reward
from cohort.trainer.trainer import Trainer
from tests.tools.test_openenv import ENVS

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def an_agent(client, row):
    return 1.0


def ends_with_period(completions, **kwargs) -> list[float]:
    return [float(str(c).endswith(".")) for c in completions]


def compose(**sections):
    cfg = CohortConfig.model_validate(sections)
    return reward_specs(cfg, RunEnvironment(cfg), [{"name": "task_reward", "weight": 1.0}])


def test_the_order_and_which_specs_apply(monkeypatch):
    monkeypatch.syspath_prepend(str(ENVS))
    task = [{"name": "task_reward", "weight": 1.0}]
    assert compose() == task  # rewards unset: the built-in task's
    assert compose(rewards=[{"name": "accuracy"}]) == [{"name": "accuracy", "weight": 1.0}]  # configured: those alone
    # a tools environment with get_reward(): one more spec of weight 1, after the configured ones
    tail = {"name": environment_reward, "weight": 1.0, "alias": "environment"}
    assert compose(rewards=[], tools={"environment": "increment_env.IncrementEnv"}) == [tail]
    assert compose(tools={"environment": "trl_shape.EchoEnv"}) == task  # no get_reward(): nothing added
    # an agent's reward first; the task's specs never (the agent's return value replaces them)
    assert compose(agent={"function": an_agent}) == [{"name": agent_reward, "weight": 1.0}]
    assert compose(agent={"function": an_agent}, rewards=[{"name": "accuracy", "weight": 0.5}]) == \
        [{"name": agent_reward, "weight": 1.0}, {"name": "accuracy", "weight": 0.5}]
    assert compose(agent={"environment": "verifiers:anything"}) == [{"name": verifiers_reward, "weight": 1.0}]


def test_rewards_beside_an_agent_add_to_its_reward_hand_computed():
    cfg = CohortConfig.model_validate({"agent": {"function": an_agent},
                                       "rewards": [{"name": ends_with_period, "weight": 0.5}]})
    rewards = RewardSet.from_specs(reward_specs(cfg, RunEnvironment(cfg), None))
    try:
        runs = [SimpleNamespace(outcome={"reward": r}, error=None, status="ok") for r in (1.0, 0.0, 0.5)]
        scored = rewards.score(prompts=["a", "b", "c"], completions=["6.", "7", "x."], completion_ids=[[1], [2], [3]],
                               optional={"agent_runs": runs})
    finally:
        rewards.close()
    # agent 1.0, 0.0, 0.5 (weight 1) + 0.5 × ends_with_period 1, 0, 1 = 1.5, 0.0, 1.0
    assert scored.total.tolist() == [1.5, 0.0, 1.0]
    assert scored.per_function.tolist() == [[1.0, 1.0], [0.0, 0.0], [0.5, 1.0]]


def test_validation_accepts_rewards_beside_an_agent_and_beside_a_verifiers_environment():
    validate_config(CohortConfig.model_validate({"agent": {"function": an_agent}, "rewards": [{"name": "accuracy"}]}),
                    check_files=False)  # (no ConfigError: at 4f35103 "agent.function ... with rewards: ... remove rewards")
    # beside an environment's reward too (refused at 4f35103 and until a failed episode was scored by nothing:
    # AgentRun.failed); an id of another kind is refused for its own reason only
    cfg = CohortConfig.model_validate({"agent": {"environment": "vf:arith"}, "rewards": [{"name": "accuracy"}]})
    assert not any("with rewards" in p for p in agent_problems(cfg))


@pytest.mark.slow
@pytest.mark.builtin_models("tool_calc")
def test_an_agent_trains_on_its_reward_plus_the_configured_ones(tmp_path):
    # examples/agent_openai.yaml (the `openai` client's own tool loop, its reward 1.0 for a right answer) with
    # numeric_match at weight 0.5 beside it: every completion's total is the agent's reward + 0.5 × numeric_match
    overrides = ["train.max_steps=1", "train.prompts_per_step=2", "train.micro_batch_size=16", "run.eval_every=0",
                 "run.save_every=0", f"agent.function={EXAMPLES / 'agent_openai.py'}:agent",
                 "rewards=[{name: numeric_match, weight: 0.5}]"]
    trainer = Trainer(load_config(EXAMPLES / "agent_openai.yaml", overrides), run_dir=tmp_path, log=lambda *a: None)
    try:
        metrics = trainer.step()
        b = trainer.state.batch
    finally:
        trainer.close()
    outcomes = [run.outcome["reward"] for run in b.episodes]
    assert len(outcomes) == 16 and all(run.error is None for run in b.episodes)
    assert b.per_function[:, 0].tolist() == outcomes  # the agent's reward, weight 1
    matched = b.per_function[:, 1].tolist()
    assert set(matched) <= {0.0, 1.0}
    assert 0 < sum(outcomes) < 16  # (some runs right, some not: the sums below are not all 0 + 0)
    assert b.rewards.tolist() == pytest.approx([a + 0.5 * m for a, m in zip(outcomes, matched)], abs=1e-12)
    assert metrics["rewards/agent_reward/mean"] == pytest.approx(sum(outcomes) / 16, abs=1e-12)
    assert metrics["rewards/numeric_match/mean"] == pytest.approx(sum(matched) / 16, abs=1e-12)


@pytest.mark.slow
def test_cohort_eval_scores_with_the_environment_s_reward_as_training_does(tmp_path, tiny_chat_model_dir, monkeypatch,
                                                                            capsys):
    # a TRL class whose get_reward() is the whole reward (rewards: []): `cohort eval` composes the trainer's reward set
    # (at 4f35103 it left the environment's reward out and stopped with an IndexError on the empty set)
    monkeypatch.syspath_prepend(str(ENVS))
    rows = [{"prompt": [{"role": "user", "content": f"Count to the target ({k})."}], "target": t} for k, t in enumerate((0, 0, 5))]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {"model": {"path": str(tiny_chat_model_dir)}, "engine": {"name": "hf"},
              "data": {"task": None, "eval_files": [str(tmp_path / "eval.jsonl")]},
              "rollout": {"num_generations": 2, "max_completion_length": 8},
              "tools": {"environment": "increment_env.TargetEnv", "max_turns": 1, "in_prompt": False}, "rewards": [],
              "train": {"prompts_per_step": 2, "micro_batch_size": 4}, "run": {"output_dir": str(tmp_path / "run")}}
    (tmp_path / "eval.yaml").write_text(yaml.safe_dump(config))
    assert cli.main(["eval", str(tmp_path / "eval.yaml"), "--num-samples", "0"]) == 0
    result = json.loads(capsys.readouterr().out)
    # no increment call is parsed from a random model's 8 tokens: the counter stays 0, so get_reward() is 1.0 for
    # the two target-0 rows and 0.0 for the target-5 row: a mean of 2/3
    assert result["reward"] == pytest.approx(2 / 3, abs=1e-12) and result["num_prompts"] == 3

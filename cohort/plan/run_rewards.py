"""A run's reward specs, composed in one place (`reward_specs`), and the config's reward checks that read the same
composition (`reward_problems`).

The run's rewards, in order:
1. the episode's reward, as the run's environment brings it (`RunEnvironment.episode_reward_specs`): an agent
   environment's connector's (verifiers' `verifiers_reward`, TextArena's game reward), or agent.function's returned
   reward (cohort/agents/reward.py's `agent_reward`); weight 1;
2. `rewards` as configured; when it is unset (None) and the run has no agent, the built-in task's specs (what
   `load_data` returns beside the rows);
3. the tools environment's `get_reward()` (TRL's `environment_factory`: one more reward of weight 1, alias
   `environment`), from the resolved class (cohort/tools/tool_schemas.py's `ToolResolution.reward_specs`).

This module names no hub: it asks the run's environment. So `rewards` beside agent.function or an agent environment are added to the agent's (or the episode's) reward (TRL and
verifiers both sum several weighted reward functions): each completion's total is that reward + Σ weight × the user's
functions' scores; an environment's failed episode is scored by none of them. Beside a multi-seat environment each
seat's row keeps the episode's scores of the user's functions beside its own reward from the environment, so they are
added to every seat's reward (cohort/trainer/agent_samples.py's `with_seats`); the agent's spec comes first, where
`with_seats` finds it.

The trainer's setup (cohort/trainer/build_parts.py), validation (cohort/plan/validate.py, whose `RunInputs` carries
the composed specs to the setup) and `cohort eval` (cohort/trainer/evaluate.py) all call `reward_specs`.
"""

from __future__ import annotations

from typing import Any

from cohort import rewards as reward_registry
from cohort.config import CohortConfig
from cohort.connectors import routed
from cohort.data.datasets import own_data
from cohort.plan.run_environment import RunEnvironment


def reward_specs(cfg: CohortConfig, environment: RunEnvironment, task_specs: list[dict] | None) -> list[dict[str, Any]]:
    """The run's reward specs (module docstring's order); `task_specs`: the built-in task's (`load_data`'s third
    value), used when `rewards` is unset and no agent brings the reward."""
    cfg = routed(cfg)[0]  # (`environment` read into its hub's field; a no-op on a plan's config, already routed)
    if cfg.rewards is not None:
        configured = [spec.model_dump() for spec in cfg.rewards]
    else:
        configured = [] if cfg.agent.enabled else list(task_specs or [])
    return environment.episode_reward_specs() + configured + environment.tools.reward_specs()


def reward_problems(cfg: CohortConfig, environment: RunEnvironment) -> list[str]:
    """A reward set that would be empty (`reward_specs` before the data is read: a built-in data.task always brings
    its own), and every configured spec that does not resolve ([] when fine). An environment that does not resolve is
    the tools check's line alone."""
    cfg = routed(cfg)[0]
    try:
        composed: list | None = reward_specs(cfg, environment, None)
    except ValueError:
        composed = None  # whether tools.environment has get_reward() is unknown: its own line gives the real cause
    if cfg.rewards is None:
        if composed == [] and not own_data(cfg.data) and cfg.data.task is None:
            return ["rewards is empty and data.task is None: set rewards (e.g. rewards=[{name: accuracy}]) or data.task"]
        return []
    if not cfg.rewards:
        if (cfg.algorithm.name == "distill" and cfg.teacher.reward_weight == 0) or composed != []:
            return []  # distilling alone (the teacher is the signal), or the environment's get_reward() is the reward
        return ["rewards = []: at least one reward function is needed; e.g. rewards=[{name: accuracy}] (`cohort rewards list` "
                "shows the built-ins)" + ("; or teacher.reward_weight=0 to distil alone" if cfg.algorithm.name == "distill" else "")]
    problems = []
    for i, spec in enumerate(cfg.rewards):
        try:
            reward_registry.validate_spec({"name": spec.name, "weight": spec.weight, **spec.options()})
        except (ValueError, ImportError, TypeError) as exc:
            problems.append(f"rewards[{i}] (name = {spec.name!r}): {exc}")
    return problems

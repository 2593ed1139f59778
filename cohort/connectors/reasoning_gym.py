"""reasoning-gym's procedural tasks as a connector: `environment: reasoning_gym:<name>` (or `data.task`).

The task is built once per run and carried by the run's environment (cohort/plan/run_environment.py): its train and
held-out rows (cohort/data/reasoning_gym.py: disjoint questions, deterministic for the config and seed) and its reward
spec (the task's own `score_answer`, cohort/rewards/reasoning_gym.py). Its config is data.task_config and the fields
beside it (`environment_args` is read as data.task_config). One turn: no episode wrapper.
"""

from __future__ import annotations

from typing import ClassVar

from cohort.connectors.base import Connector
from cohort.data import reasoning_gym
from cohort.data.datasets import DataError
from cohort.data.run_data import HubRows


class ReasoningGym(Connector):
    """`reasoning_gym:<name>`: the task's rows and its reward spec (module docstring)."""

    name: ClassVar[str] = "reasoning-gym"
    prefixes: ClassVar[tuple[str, ...]] = (reasoning_gym.PREFIX,)

    def problems(self) -> list[str]:
        data = self.cfg.data
        return reasoning_gym.check_configs(self.spec, data.task_config, data.task_train_config)

    def rows(self) -> HubRows:
        data = self.cfg.data
        problems = self.problems()
        if problems:  # (worded as the data checks word them, so a plan lists each once)
            raise DataError("; ".join(problems))
        try:
            task = reasoning_gym.build_task(self.spec, data.task_config, seed=data.task_seed, size=data.task_size,
                                            eval_size=data.task_eval_size, answer_format=data.answer_format,
                                            credit=data.task_credit, train_config=data.task_train_config)
        except (ValueError, TypeError, AssertionError) as exc:  # a value the task's config rejects (min_terms=0)
            train = f" and data.task_train_config {data.task_train_config}" if data.task_train_config is not None else ""
            raise DataError(f"{self.named_by} {self.spec!r} with data.task_config {data.task_config}{train}: {exc}") from exc
        note = None
        if data.task_train_config is not None and "train_config" in task.reward_specs[0]:
            note = (f"data.task_train_config: {len(task.train_rows)} train rows from {data.task_train_config} "
                    f"({task.metadata['dropped_train_rows']} dropped: they ask held-out questions), "
                    f"{len(task.eval_rows)} held-out rows from data.task_config {data.task_config}")
        return HubRows(task.train_rows, f"task {task.name}", task.eval_rows, task.reward_specs, note)

"""The datasets a config names, loaded (no tokenizer, no model), with the reward specs the data itself brings.

`load_data(cfg)` reads agent.environment's tasks (cohort/data/verifiers.py: the run's loaded tasks when its caller
passes them, `environment_tasks`), or `data.dataset_name` (its train split, and its test split or
`data.eval_files` as eval data), or `data.train_files` / `data.eval_files`, or for a tools.environment that owns its
data (`environment_owns_data`: no data named) placeholder rows as TRL makes them without a `train_dataset`: one
generation batch's prompts (rollout.generation_batch_size / G), each an empty user message to which `reset` appends
the prompt, cycled for train.max_steps, and no eval data unless data.eval_files gives some; or the built-in
`data.task` (a built-in or `reasoning_gym:<name>`, cohort/data/reasoning_gym.py; whose reward specs it returns), and caps the
eval set at `data.eval_max_samples`; `data.max_answer_share` caps each answer's share of the train rows
(cohort/data/balance.py). The trainer, `cohort eval` and the planner
all start from it, so they see the same rows.

Left out: tokenizing (cohort/prompts.py), checking the files (check_data_config), and the run's reward set, which
cohort/plan/run_rewards.py composes from the config, the task's specs returned here and the resolved environment.
"""

from __future__ import annotations

import logging
from typing import Callable, Sequence

from cohort.data.verifiers import load_tasks, task_rows
from cohort.config import CohortConfig
from cohort.data.datasets import DataError, PromptDataset, load_prompt_dataset, rows_dataset
from cohort.data.named import load_named_split
from cohort.data import balance, reasoning_gym
from cohort.data.tasks import Task, get_task

logger = logging.getLogger(__name__)
_said: set[str] = set()  # the lines about the rows already printed (_say_once)


def configured_task(data, seed: int) -> Task:
    """The task `data.task` names: a built-in (from `seed`) or `reasoning_gym:<name>` (from data.task_config,
    data.task_seed, data.task_size, data.task_eval_size, data.answer_format; `seed` is not used: the trainer's
    sampler orders the rows)."""
    if reasoning_gym.is_rg_task(data.task):
        problems = reasoning_gym.check_configs(data.task, data.task_config, data.task_train_config)
        if problems:  # (worded as the data checks word them, so a plan lists each once)
            raise DataError("; ".join(problems))
        try:
            return reasoning_gym.build_task(data.task, data.task_config, seed=data.task_seed, size=data.task_size,
                                            eval_size=data.task_eval_size, answer_format=data.answer_format,
                                            credit=data.task_credit, train_config=data.task_train_config)
        except (ValueError, TypeError, AssertionError) as exc:  # a value the task's config rejects (min_terms=0)
            train = f" and data.task_train_config {data.task_train_config}" if data.task_train_config is not None else ""
            raise DataError(f"data.task {data.task!r} with data.task_config {data.task_config}{train}: {exc}") from exc
    return get_task(data.task, seed=seed)


def placeholder_rows(cfg: CohortConfig) -> list[dict]:
    """TRL's rows for an environment without a dataset: one generation batch's prompts (generation batch size // G),
    each an empty user message (its `reset` returns the prompt)."""
    g = cfg.rollout.num_generations
    generation = cfg.rollout.generation_batch_size or cfg.train.prompts_per_step * g * cfg.train.steps_per_generation
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(max(1, generation // g))]


def load_data(cfg: CohortConfig, environment_tasks: Callable[[], Sequence] | None = None
              ) -> tuple[PromptDataset, PromptDataset | None, list[dict] | None]:
    """(train dataset, eval dataset or None, the built-in task's reward specs or None) from files or the built-in task.
    `environment_tasks`: agent.environment's tasks as the run loaded them (default: loaded here)."""
    specs = None
    if cfg.agent.environment is not None:  # the environment's tasks, one row each (cohort/data/verifiers.py)
        a = cfg.agent
        tasks = environment_tasks() if environment_tasks is not None else load_tasks(a.environment, a.environment_args,
                                                                                      a.num_examples)[1]
        train = rows_dataset(task_rows(tasks), "prompt", f"environment {a.environment}")
        evals = load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files else None
    elif cfg.data.dataset_name:
        train = load_named_split(cfg.data, cfg.data.dataset_train_split, "data.dataset_train_split")
        evals = (load_named_split(cfg.data, cfg.data.dataset_test_split, "data.dataset_test_split") if cfg.data.dataset_test_split
                 else load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files else None)
    elif cfg.data.train_files:
        train = load_prompt_dataset(cfg.data.train_files, cfg.data.prompt_key)
        evals = load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files else None
    elif cfg.tools.environment is not None and cfg.data.task is None:  # the environment owns the data (TRL's rule)
        train = rows_dataset(placeholder_rows(cfg), "prompt", "placeholder rows (tools.environment owns the data)")
        evals = load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files else None
    else:
        task = configured_task(cfg.data, cfg.train.seed)
        train = rows_dataset(task.train_rows, "prompt", f"task {task.name} (train)")
        evals = (load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files
                 else rows_dataset(task.eval_rows, "prompt", f"task {task.name} (eval)"))
        specs = task.reward_specs
        if cfg.data.task_train_config is not None and "train_config" in specs[0]:
            _say_once(f"data.task_train_config: {len(task.train_rows)} train rows from {cfg.data.task_train_config} "
                      f"({task.metadata['dropped_train_rows']} dropped: they ask held-out questions), "
                      f"{len(task.eval_rows)} held-out rows from data.task_config {cfg.data.task_config}")
    if cfg.data.max_answer_share is not None:
        balance_rows(train, cfg.data.max_answer_share)
    if evals is not None and cfg.data.eval_max_samples:
        evals.rows, evals.sources = evals.rows[: cfg.data.eval_max_samples], evals.sources[: cfg.data.eval_max_samples]
    return train, evals, specs


def balance_rows(train: PromptDataset, share: float) -> None:
    """Cap each answer's share of the train rows in place (cohort/data/balance.py), saying once what it kept."""
    try:
        kept, note = balance.cap_answer_share(train.rows, share)
    except balance.BalanceError as exc:
        raise DataError(str(exc)) from exc
    keep = {id(row) for row in kept}
    train.sources = [src for row, src in zip(train.rows, train.sources) if id(row) in keep]
    train.rows = kept
    _say_once(balance.describe(note))


def _say_once(line: str) -> None:
    """Print a line about the rows once a process (the planner, the trainer and eval each load the data)."""
    if line not in _said:
        _said.add(line)
        logger.warning(line)

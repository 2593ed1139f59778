"""The datasets a config names, loaded (no tokenizer, no model), with the reward specs the data itself brings.

`load_data(cfg, hub_rows)` reads the rows the run's environment brings (`HubRows`, from its connector:
cohort/connectors; a reasoning-gym task's train and held-out rows and its reward spec, a verifiers environment's tasks,
a tools environment's placeholder rows when it owns the data), or `data.dataset_name` (its train split, and its test
split or `data.eval_files` as eval data), or `data.train_files` / `data.eval_files`, or the built-in `data.task`
(whose reward specs it returns); `data.eval_files`, when set, are the eval data whatever brought the train rows. It caps
the eval set at `data.eval_max_samples`; `data.max_answer_share` caps each answer's share of the train rows
(cohort/data/balance.py). The trainer, `cohort eval` and the planner all start from it (through
cohort/plan/run_environment.py's `run_data`, which passes the run's connector's rows), so they see the same rows.

`placeholder_rows` are TRL's rows for an environment that owns its data (no data named): one generation batch's
prompts (rollout.generation_batch_size / G), each an empty user message to which `reset` appends the prompt, cycled for
train.max_steps, and no eval data unless data.eval_files gives some.

Left out: tokenizing (cohort/prompts.py), checking the files (check_data_config), which hub brings rows (the
connectors decide; this module names none), and the run's reward set, which cohort/plan/run_rewards.py composes from the
config, the specs returned here and the resolved environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from cohort.config import CohortConfig
from cohort.data.datasets import DataError, PromptDataset, load_prompt_dataset, rows_dataset
from cohort.data.named import load_named_split
from cohort.data import balance
from cohort.data.tasks import Task, get_task

logger = logging.getLogger(__name__)
_said: set[str] = set()  # the lines about the rows already printed (_say_once)


@dataclass(frozen=True)
class HubRows:
    """The rows an environment's connector brings: `train` (each with a `prompt`), named `source` in messages; `eval`
    (None: data.eval_files, or no eval data); `reward_specs` (None: the hub brings no reward with its rows); `note`: a
    line said once about how they were made."""

    train: list[dict]
    source: str
    eval: list[dict] | None = None
    reward_specs: list[dict] | None = None
    note: str | None = None


def configured_task(data, seed: int) -> Task:
    """The built-in task `data.task` names, from `seed` (a hub's task, `reasoning_gym:<name>`, is its connector's)."""
    return get_task(data.task, seed=seed)


def placeholder_rows(cfg: CohortConfig) -> list[dict]:
    """TRL's rows for an environment without a dataset: one generation batch's prompts (generation batch size // G),
    each an empty user message (its `reset` returns the prompt)."""
    g = cfg.rollout.num_generations
    generation = cfg.rollout.generation_batch_size or cfg.train.prompts_per_step * g * cfg.train.steps_per_generation
    return [{"prompt": [{"role": "user", "content": ""}]} for _ in range(max(1, generation // g))]


def load_data(cfg: CohortConfig, hub_rows: Callable[[], HubRows | None] | None = None
              ) -> tuple[PromptDataset, PromptDataset | None, list[dict] | None]:
    """(train dataset, eval dataset or None, the rows' reward specs or None) from the environment's rows, files or the
    built-in task. `hub_rows`: the run's environment's rows (None, or returning None: the data section's own)."""
    specs = None
    hub = hub_rows() if hub_rows is not None else None
    eval_files = load_prompt_dataset(cfg.data.eval_files, cfg.data.prompt_key) if cfg.data.eval_files else None
    if hub is not None:  # the environment's rows (its connector's)
        train = rows_dataset(hub.train, "prompt", f"{hub.source} (train)" if hub.eval is not None else hub.source)
        evals = eval_files if eval_files is not None or hub.eval is None else rows_dataset(hub.eval, "prompt", f"{hub.source} (eval)")
        specs = hub.reward_specs
        if hub.note:
            _say_once(hub.note)
    elif cfg.data.dataset_name:
        train = load_named_split(cfg.data, cfg.data.dataset_train_split, "data.dataset_train_split")
        evals = (load_named_split(cfg.data, cfg.data.dataset_test_split, "data.dataset_test_split") if cfg.data.dataset_test_split
                 else eval_files)
    elif cfg.data.train_files:
        train, evals = load_prompt_dataset(cfg.data.train_files, cfg.data.prompt_key), eval_files
    else:
        task = configured_task(cfg.data, cfg.train.seed)
        train = rows_dataset(task.train_rows, "prompt", f"task {task.name} (train)")
        evals = eval_files if eval_files is not None else rows_dataset(task.eval_rows, "prompt", f"task {task.name} (eval)")
        specs = task.reward_specs
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

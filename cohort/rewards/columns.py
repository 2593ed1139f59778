"""The dataset columns the reward functions read, checked against the data before any model loads.

A built-in declares what it reads (``register(name, needs=[Needs(...)])``): ``accuracy``
the gold answer from ``solution``, ``answer`` or ``ground_truth`` (or the column its
option ``gold_column`` names), ``verl_default`` ``data_source`` and ``ground_truth``,
and so on. A function with verl's contract reads ``ground_truth``. Your own TRL-contract
functions declare nothing: their ``**columns`` are theirs to read.

``reward_column_problems(cfg, hub)`` compares those needs with the data's columns and
returns one problem per reward and data source that lacks all of a need's candidates,
naming the columns that exist. The data is read cheaply: the first ``SAMPLE_ROWS``
rows of each file (verl's parquet layout read as training reads it), the rows the run's
environment brings (``hub``: its connector's, with the reward specs they come with), or the
built-in task's rows. Only when the sample lacks a column are the files read to the end, so a
column that first appears late in a JSONL file is found, and a config that can work
is never refused. Unreadable data and unknown rewards are skipped here: the data and
reward checks report them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cohort.data.datasets import SAMPLE_ROWS, file_columns, normalise_row, own_data
from cohort.data.named import split_label, split_rows
from cohort.data.run_data import HubRows, configured_task
from cohort.rewards import verl
from cohort.rewards.reward_registry import SPEC_KEYS, ColumnNeed, needed_columns
from cohort.rewards.reward_set import validate_spec

VERL_NEEDS = [ColumnNeed("the ground truth", None, ("ground_truth",))]


def _specs(cfg: Any, hub: HubRows | None) -> list[tuple[str, dict[str, Any]]]:
    """(label, spec dict) for each reward the run will use."""
    if cfg.rewards is not None:
        return [(f"rewards[{i}] (name = {s.name!r})", {"name": s.name, **s.options()}) for i, s in enumerate(cfg.rewards)]
    if hub is not None:
        return [(f"the task's reward {s['name']!r}", dict(s)) for s in hub.reward_specs or []]
    if cfg.data.task and not own_data(cfg.data):
        return [(f"the task's reward {s['name']!r}", dict(s)) for s in configured_task(cfg.data, cfg.train.seed).reward_specs]
    return []


def _needs(spec: dict[str, Any]) -> list[ColumnNeed]:
    try:
        resolved = validate_spec(spec)
        if verl.contract_of(resolved, spec.get("contract")) == "verl":
            return VERL_NEEDS
    except (ValueError, ImportError, TypeError):
        return []  # reported by the reward checks
    return needed_columns(spec["name"], {k: v for k, v in spec.items() if k not in SPEC_KEYS})


def _sources(cfg: Any, hub: HubRows | None) -> list[tuple[str, Callable[[int | None], list[str]]]]:
    """(what the data is, columns(max_rows)) for the training data and the eval data."""
    data = cfg.data
    sources = []
    if hub is not None:
        sources.append((hub.source, lambda rows: _row_columns(hub.train + (hub.eval or []))))
    elif data.dataset_name:
        for field, split in (("data.dataset_train_split", data.dataset_train_split), ("data.dataset_test_split", data.dataset_test_split)):
            if split:
                sources.append((split_label(data, split), lambda rows, s=split, f=field: _split_columns(data, s, f)))
    elif data.train_files:
        sources.append((f"data.train_files ({', '.join(data.train_files)})",
                        lambda rows: file_columns(data.train_files, data.prompt_key, rows)))
    elif data.task:
        task = configured_task(data, cfg.train.seed)
        sources.append((f"the task {data.task!r}", lambda rows: _row_columns(task.train_rows + task.eval_rows)))
    if data.eval_files:
        sources.append((f"data.eval_files ({', '.join(data.eval_files)})",
                        lambda rows: file_columns(data.eval_files, data.prompt_key, rows)))
    return sources


def _split_columns(data: Any, split: str, field: str) -> list[str]:
    """A named dataset's columns (its schema: every row has them all), verl's layout read as training reads it; a
    missing split or prompt column raises DataError (the data checks report it; reward_column_problems skips it)."""
    first = next(split_rows(data, split, field), None)
    return [c for c in (normalise_row(first[1], first[0]) if first else {}) if c != data.prompt_key]


def _row_columns(rows: list[dict]) -> list[str]:
    return [c for c in dict.fromkeys(k for row in rows for k in row) if c != "prompt"]


def _message(label: str, need: ColumnNeed, source: str, columns: list[str]) -> str:
    wanted = " or ".join(repr(c) for c in need.columns)
    fix = (f"set its option {need.option} to the column that holds it, or add a column {wanted}" if need.option
           else f"add the column {wanted} (a verl parquet's reward_model.ground_truth is read as 'ground_truth')")
    return f"{label} reads {need.what} from the column {wanted}, but {source} has only the columns {columns}; {fix}"


def reward_column_problems(cfg: Any, hub: HubRows | None = None) -> list[str]:
    """One message per reward need that no column of the training or eval data meets; [] when all are met. `hub`: the
    rows the run's environment brings (cohort/plan/run_environment.py), read instead of the data section."""
    try:
        needs = [(label, need) for label, spec in _specs(cfg, hub) for need in _needs(spec)]
        sources = _sources(cfg, hub) if needs else []
    except ValueError:  # an unknown task: reported by the data checks
        return []
    problems = []
    for source, columns_of in sources:
        try:
            sample = columns_of(SAMPLE_ROWS)
        except Exception:  # noqa: BLE001 - missing or unreadable data is reported by the data checks
            continue
        everything = None
        for label, need in needs:
            if any(c in sample for c in need.columns):
                continue
            everything = everything if everything is not None else columns_of(None)  # read to the end only now
            if not any(c in everything for c in need.columns):
                problems.append(_message(label, need, source, everything))
    return problems

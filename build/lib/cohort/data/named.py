"""Datasets by name (`data.dataset_name`): a Hugging Face Hub dataset or a local dataset directory, as TRL names them.

`datasets.load_dataset(dataset_name, dataset_config)` reads every split once per process (the Hub's files are
downloaded into the Hugging Face cache on first use and read from datasets' own cache afterwards, also with
HF_HUB_OFFLINE=1); `data.dataset_train_split` is the training data and `data.dataset_test_split`, when set, the eval
data. Each row then goes through the same checks as a row of a file (`cohort.data.datasets`), named
"dataset NAME (split S) row i".

The failures a user meets become one `DataError` naming the field and the fix: a dataset that does not exist or is
gated, an offline cache miss, a missing configuration, a split the dataset does not have (the splits it has are
named), a prompt column it does not have (its columns and data.prompt_key are named).

Left out: streaming (RL prompt sets fit in memory), `data_files` / `data_dir` selections, and dataset revisions.
"""

from __future__ import annotations

import os
from typing import Any

from cohort.data.datasets import DataError, PromptDataset, prompt_dataset

_LOADED: dict[tuple, Any] = {}  # (datasets cache, name, config) -> DatasetDict, once per process (validation, then training)


def named_splits(name: str, config: str | None):
    """The DatasetDict of `name` (configuration `config`), loaded with datasets.load_dataset; raises DataError."""
    import datasets  # here, not at the top: it loads pyarrow and pandas, for runs that name a dataset only

    key = (datasets.config.HF_DATASETS_CACHE, name, config)
    if key not in _LOADED:
        try:
            loaded = datasets.load_dataset(name, config)
        except Exception as exc:  # datasets raises ValueError, ConnectionError, FileNotFoundError, DatasetNotFoundError...
            raise DataError(_explain(name, config, exc, offline=datasets.config.HF_HUB_OFFLINE)) from exc
        _LOADED[key] = loaded if isinstance(loaded, datasets.DatasetDict) else datasets.DatasetDict(train=loaded)
    return _LOADED[key]


def named_split(data, split: str, field: str):
    """One split of data.dataset_name; `field` (data.dataset_train_split or data.dataset_test_split) is named in the
    error when the dataset has no such split."""
    splits = named_splits(data.dataset_name, data.dataset_config)
    if split not in splits:
        raise DataError(f"{field} = {split!r}: dataset {data.dataset_name} has no such split; it has "
                        f"{', '.join(splits)}; set {field} to one of them")
    return splits[split]


def split_label(data, split: str) -> str:
    return f"dataset {data.dataset_name}" + (f" ({data.dataset_config})" if data.dataset_config else "") + f" split {split}"


def split_rows(data, split: str, field: str):
    """(where, row) pairs of one split, each row as a dict; the prompt column checked once for the whole split."""
    ds = named_split(data, split, field)
    label = split_label(data, split)
    if data.prompt_key not in ds.column_names:
        raise DataError(f"data.prompt_key = {data.prompt_key!r}: {label} has no such column (columns: "
                        f"{', '.join(ds.column_names)}); set data.prompt_key to the one that holds the prompt "
                        "(TRL's dataset_prompt_column)")
    return ((f"{label} row {i}", row) for i, row in enumerate(ds))


def load_named_split(data, split: str, field: str) -> PromptDataset:
    """One split of data.dataset_name as a checked prompt dataset."""
    return prompt_dataset(split_rows(data, split, field), data.prompt_key, split_label(data, split))


def named_data_problems(data) -> list[str]:
    """The named dataset loads (downloading it when allowed), has the splits asked for and the prompt column."""
    problems = []
    if data.train_files:
        problems.append(f"data.dataset_name = {data.dataset_name!r} and data.train_files are both set: give one source of "
                        "training data (empty data.train_files, or unset data.dataset_name)")
    if data.dataset_test_split and data.eval_files:
        problems.append(f"data.dataset_test_split = {data.dataset_test_split!r} and data.eval_files are both set: give one source "
                        "of eval data")
    splits = [("data.dataset_train_split", data.dataset_train_split)]
    splits += [("data.dataset_test_split", data.dataset_test_split)] if data.dataset_test_split else []
    for field, split in splits:
        try:
            next(split_rows(data, split, field), None)
        except DataError as exc:
            return problems + [str(exc)]
    return problems


def _explain(name: str, config: str | None, exc: BaseException, *, offline: bool) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    kind = type(exc).__name__
    if "config name is missing" in text.lower() or (config and "builderconfig" in text.lower().replace(" ", "")):
        return f"data.dataset_config = {config!r}: {text}"
    if offline and isinstance(exc, ConnectionError):
        return (f"data.dataset_name = {name!r}: not a local directory and not in the datasets cache, and "
                f"{_offline_variable()} forbids downloading it: unset it to download it once, or give a local dataset "
                "directory or data.train_files")
    if kind in ("DatasetNotFoundError", "FileNotFoundError", "DataFilesNotFoundError"):
        return (f"data.dataset_name = {name!r}: {text}; check the name (a Hub dataset is org/name, a local one a "
                "directory); a private or gated dataset needs `hf auth login` or HF_TOKEN")
    if isinstance(exc, ConnectionError):
        return f"data.dataset_name = {name!r}: the Hugging Face Hub could not be reached and it is not cached ({text})"
    return f"data.dataset_name = {name!r}: datasets.load_dataset failed: {kind}: {text}"


def _offline_variable() -> str:
    for variable in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(variable):
            return f"{variable}={os.environ[variable]}"
    return "HF_HUB_OFFLINE=1"

"""Reading prompt datasets, and the sampler that turns them into generation batches.

Formats: JSON Lines (`.jsonl`), JSON (a list of rows, or `{"data": [...]}`),
Parquet, and directories written by `datasets.Dataset.save_to_disk`. verl's
parquet layout reads as is: `reward_model.ground_truth` becomes the column
`ground_truth` (and `reward_model.style` becomes `reward_style`), `extra_info`
and `data_source` pass through as columns.

Every row is checked when it is read; a bad row fails with its file and its line
(JSONL) or row number (other formats). Every column other than the prompt
reaches the reward functions as a keyword argument.

Left out on purpose: streaming datasets larger than memory (RL prompt sets are
small: tens of thousands of rows).
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from cohort.data.reasoning_gym import PREFIX as RG_PREFIX
from cohort.data.reasoning_gym import check_configs as check_rg_configs
from cohort.data.reasoning_gym import is_rg_task
from cohort.data.tasks import list_tasks

PromptType = str | list[dict[str, str]]


class DataError(ValueError):
    """A dataset problem, naming the file and the line or row."""


@dataclass
class PromptDataset:
    """Rows with a validated prompt; `source` names where each row came from (for errors)."""

    rows: list[dict[str, Any]]
    prompt_key: str
    sources: list[str]

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def columns(self) -> list[str]:
        names: dict[str, None] = {}
        for row in self.rows:
            names.update(dict.fromkeys(row))
        return [n for n in names if n != self.prompt_key]


def normalise_row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: expected a JSON object (a mapping of column to value), got {type(row).__name__}")
    row = dict(row)
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and "ground_truth" in reward_model:  # verl layout
        row.setdefault("ground_truth", reward_model["ground_truth"])
        if "style" in reward_model:
            row.setdefault("reward_style", reward_model["style"])
    return row


def check_prompt(value: Any, where: str, prompt_key: str) -> PromptType:
    """A prompt is a non-empty string or a non-empty list of {role, content} messages."""
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: column {prompt_key!r} is empty")
        return value
    if hasattr(value, "tolist"):  # numpy arrays from parquet
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value:
        for i, msg in enumerate(value):
            if not isinstance(msg, dict) or "role" not in msg or "content" not in msg:
                raise DataError(
                    f"{where}: column {prompt_key!r} message {i} must be a mapping with 'role' and 'content', got {msg!r:.80}"
                )
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise DataError(
        f"{where}: column {prompt_key!r} must be a non-empty string or a list of chat messages, got {type(value).__name__} {value!r:.80}"
    )


def _iter_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None


def _iter_json(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise DataError(f"{path}: a .json dataset must hold a list of rows (or {{\"data\": [...]}})")
    for i, row in enumerate(data):
        yield f"{path} row {i}", row


def _iter_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow.parquet as pq

    i = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):  # the first rows without reading the rest
        for row in batch.to_pylist():
            yield f"{path} row {i}", row
            i += 1


def _iter_saved_dataset(path: Path) -> Iterator[tuple[str, Any]]:
    from datasets import load_from_disk

    ds = load_from_disk(str(path))
    if hasattr(ds, "keys") and not hasattr(ds, "column_names"):  # a DatasetDict
        split = "train" if "train" in ds else next(iter(ds.keys()))
        ds = ds[split]
    for i, row in enumerate(ds):
        yield f"{path} row {i}", row


def iter_rows(path: str | Path) -> Iterator[tuple[str, dict]]:
    """(where, row) pairs from one file or saved dataset; `where` is "file:line" or "file row i"."""
    p = Path(path)
    if p.is_dir():
        reader = _iter_saved_dataset
    elif p.suffix == ".jsonl":
        reader = _iter_jsonl
    elif p.suffix == ".json":
        reader = _iter_json
    elif p.suffix == ".parquet":
        reader = _iter_parquet
    else:
        raise DataError(f"{p}: unsupported data format {p.suffix!r}; use .jsonl, .json, .parquet or a datasets.save_to_disk directory")
    for where, row in reader(p):
        yield where, normalise_row(row, where)


def load_prompt_dataset(files: list[str], prompt_key: str = "prompt") -> PromptDataset:
    for f in files:
        if not Path(f).exists():
            raise DataError(f"{f}: file not found")
    pairs = ((where, row) for f in files for where, row in iter_rows(f))
    return prompt_dataset(pairs, prompt_key, ", ".join(files))


def prompt_dataset(pairs: Iterator[tuple[str, dict]], prompt_key: str, name: str) -> PromptDataset:
    """A dataset from (where, row) pairs (verl's layout read), each row's prompt checked; `name` says what had no rows."""
    rows, sources = [], []
    for where, row in pairs:
        row = normalise_row(row, where)
        if prompt_key not in row:
            raise DataError(f"{where}: no column {prompt_key!r} (columns: {', '.join(row)}); set data.prompt_key")
        row[prompt_key] = check_prompt(row[prompt_key], where, prompt_key)
        rows.append(row)
        sources.append(where)
    if not rows:
        raise DataError(f"{name}: no rows")
    return PromptDataset(rows=rows, prompt_key=prompt_key, sources=sources)


def rows_dataset(rows: list[dict], prompt_key: str, name: str) -> PromptDataset:
    """A dataset from in-memory rows (built-in tasks), validated (and verl's layout read) like a file."""
    rows = [normalise_row(row, f"{name} row {i}") for i, row in enumerate(rows)]
    for i, row in enumerate(rows):
        check_prompt(row.get(prompt_key), f"{name} row {i}", prompt_key)
    return PromptDataset(rows=rows, prompt_key=prompt_key, sources=[f"{name} row {i}" for i in range(len(rows))])


SAMPLE_ROWS = 16


def file_columns(files: list[str], prompt_key: str, max_rows: int | None = SAMPLE_ROWS) -> list[str]:
    """The columns the reward functions get from ``files``: every key of their first ``max_rows`` rows
    (None: all rows), verl's layout read as ``load_prompt_dataset`` reads it, the prompt left out."""
    names: dict[str, None] = {}
    for f in files:
        for where, row in itertools.islice(iter_rows(f), max_rows):
            names.update(dict.fromkeys(row))
    names.pop(prompt_key, None)
    return list(names)


def own_data(data) -> bool:
    """The run trains on data of its own (files or a dataset by name), not on the built-in data.task."""
    return bool(data.train_files or data.dataset_name)


def check_data_config(data, environment: Any = None) -> list[str]:
    """Cheap checks before anything loads: files exist, formats known, the first row has the prompt (a dataset given by
    name: cohort.data.named.named_data_problems). With tools.environment (`environment`) no data is needed: the
    environment owns it (placeholder rows, cohort/data/run_data.py)."""
    problems = []
    if not data.train_files and not data.task and not data.dataset_name and environment is None:
        problems.append("data.train_files is empty, data.dataset_name and data.task are None: give training files, a dataset by "
                        "name (data.dataset_name) or a built-in task (`cohort tasks`)")
    if not own_data(data) and data.task:
        if is_rg_task(data.task):
            problems += check_rg_configs(data.task, data.task_config, data.task_train_config)
        elif data.task not in list_tasks():
            problems.append(f"data.task = {data.task!r} is not a built-in task; choose one of {', '.join(list_tasks())}, "
                            f"or a reasoning-gym task, {RG_PREFIX}<name> (`cohort tasks reasoning_gym`)")
        else:
            problems += _rg_fields_set(data)
    for key in ("train_files", "eval_files"):
        for f in getattr(data, key):
            problems += _check_file(key, f, data.prompt_key)
    return problems


RG_FIELDS = ("task_config", "task_train_config", "task_size", "task_eval_size", "task_seed", "answer_format", "task_credit")  # read by reasoning_gym:<name> only


def _rg_fields_set(data) -> list[str]:
    """data.task_config and its siblings set away from their defaults with a built-in task, which never reads them."""
    fields = type(data).model_fields
    changed = [f"data.{k}" for k in RG_FIELDS if getattr(data, k) != fields[k].get_default(call_default_factory=True)]
    return [f"{', '.join(changed)}: for reasoning_gym:<name> tasks; the built-in task {data.task!r} does not read "
            f"{'it' if len(changed) == 1 else 'them'}: remove {'it' if len(changed) == 1 else 'them'}"] if changed else []


def _check_file(key: str, f: str, prompt_key: str) -> list[str]:
    p = Path(f)
    if not p.exists():
        return [f"data.{key}: {f!r} does not exist; fix the path (relative paths are from the working directory)"]
    try:
        first = next(iter_rows(p), None)
    except DataError as exc:
        return [f"data.{key}: {exc}"]
    except Exception as exc:  # unreadable parquet, broken saved dataset
        return [f"data.{key}: {f!r} cannot be read: {exc}"]
    if first is None:
        return [f"data.{key}: {f!r} has no rows"]
    where, row = first
    if prompt_key not in row:
        return [f"data.prompt_key = {prompt_key!r}: {where} has no such column (columns: {', '.join(row)}); set data.prompt_key to one of them"]
    return []


class RepeatSampler:
    """Yields generation batches of prompt indices, each index `num_generations` times in a row.

    TRL's RepeatSampler semantics: a generation batch holds `prompts_per_generation`
    distinct prompts, each repeated G times consecutively (a group); the trainer
    reuses the batch for `steps_per_generation × num_iterations` optimizer steps.
    Prompts are drawn without replacement within an epoch; an epoch that runs out
    mid-batch continues into a freshly shuffled next epoch, so no batch is short
    and no run stops at an epoch boundary. The state (epoch, position) is small and
    saved with checkpoints.
    """

    def __init__(self, num_rows: int, prompts_per_generation: int, num_generations: int, *, shuffle: bool = True, seed: int = 0):
        if num_rows < 1:
            raise ValueError("RepeatSampler needs at least one row")
        self.num_rows = num_rows
        self.prompts_per_generation = prompts_per_generation
        self.num_generations = num_generations
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.position = 0
        self._order = self._order_for(0)

    def _order_for(self, epoch: int) -> list[int]:
        order = list(range(self.num_rows))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def next_prompts(self, count: int | None = None) -> list[int]:
        """The next `count` prompt indices (default: a generation batch's, prompts_per_generation), in the stream's order."""
        out = []
        while len(out) < (self.prompts_per_generation if count is None else count):
            if self.position >= self.num_rows:
                self.epoch += 1
                self.position = 0
                self._order = self._order_for(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    def next_batch(self) -> list[int]:
        """Prompt indices with each repeated G times in a row."""
        return [i for i in self.next_prompts() for _ in range(self.num_generations)]

    def next_group(self) -> list[int]:
        """One more prompt, repeated G times: a refill group (pipeline.dynamic_sampling). It is the prompt the next
        batch would have started with, so the state (epoch, position) stays all there is to checkpoint."""
        return [i for i in self.next_prompts(1) for _ in range(self.num_generations)]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = state["seed"]
        self.epoch = state["epoch"]
        self.position = state["position"]
        self._order = self._order_for(self.epoch)

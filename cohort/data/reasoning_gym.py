"""reasoning-gym's procedural tasks by name: ``data.task: reasoning_gym:<name>`` (``cohort tasks reasoning_gym`` lists
the 105 names and their config fields).

A reasoning-gym dataset is a function of (name, config, seed, size): entry ``i`` is ``{question, answer, metadata}``,
the same on every machine, and ``dataset.score_answer(answer_text, entry)`` scores a reply in [0, 1]. Choices:
- Spelling: ``reasoning_gym:<name>``, the prefix style of ``tiny:arith`` and ``gguf:smollm2-135m-instruct`` (a source,
  then the name in it), with the package's own module name; the task's config fields go in ``data.task_config``
  (``{min_terms: 2, max_digits: 1}``), checked against the task's dataclass before anything loads.
- A mix of tasks is reasoning-gym's own ``composite``: ``reasoning_gym:composite`` with ``data.task_config:
  {datasets: [{name: leg_counting, weight: 2, config: {...}}, ...]}``; its ``score_answer`` hands each entry to the
  task that made it.
- Held-out split: ONE dataset of ``task_eval_size + task_size`` entries from ``data.task_seed``; eval is indices
  ``[0, task_eval_size)`` with repeated questions dropped, train the indices after it minus every entry whose question
  is an eval question (two seeds, or two index ranges, can still produce the same question: small tasks repeat). So
  no train prompt is ever a held-out prompt, and train has at most ``task_size`` rows (fewer where questions repeat).
- Training on an easier stage than the one evaluated (``data.task_train_config``, a curriculum's first stage): the
  train entries come from the same task with that config instead (same seed, the same indices after
  ``task_eval_size``), the held-out ones from ``data.task_config``, and every train entry whose question is a held-out
  question is dropped as above (an easier config can ask a held-out question: gcd up to 15 is part of gcd up to 30).
  The reward spec then holds both configs and ``eval_size``: an index below it is a held-out entry, the rest train
  entries. Only ``data.task_config`` sets the eval; resume keeps both (config.yaml).
- Rows are small: ``prompt`` (chat messages), ``answer`` (the answer text; empty for the five tasks with no answer key,
  boxnet, graph_color, propositional_logic, rubiks_cube, rush_hour, whose scorers check a proposed solution) and
  ``rg_index``; the entry's metadata
  stays out of the rows. The task's reward spec (``reasoning_gym``, cohort/rewards/reasoning_gym.py) holds
  (name, config, seed, size) once, and the reward rebuilds entry ``rg_index`` from the dataset this module caches
  per process (``rg_dataset``).
- Prompts: with ``data.answer_format: tags`` (the default, reasoning-gym's own way) a system message with
  reasoning-gym's ``SYSTEM_PROMPTS["default"]`` (think, then ``<answer>...</answer>``) and the question as the user
  turn. With ``last_line`` or ``last_number`` (models that answer without tags) only the user turn, so the model's
  chat template keeps its own system prompt; the reward reads the answer as that format says (the reward module).

Left out: reasoning-gym's own curricula (difficulty raised by a schedule as the reward grows: their first levels start
above what small models answer, measured in docs/environments.md) and its async/remote scorers.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import textwrap
from typing import Any

from cohort.data.tasks import Task

PREFIX = "reasoning_gym:"
ROW_INDEX = "rg_index"  # the column that refers a row to its entry
ANSWER_FORMATS = ("tags", "last_line", "last_number")


def is_rg_task(task: str | None) -> bool:
    return bool(task) and task.startswith(PREFIX)


def _registry() -> dict[str, tuple[type, type]]:
    import reasoning_gym.factory  # heavy optional dependency (imports every task module): only when a task is named

    return reasoning_gym.factory.DATASETS


def task_names() -> list[str]:
    """Every reasoning-gym dataset name, ``composite`` included, sorted."""
    return sorted(_registry())


def task_fields(name: str) -> dict[str, Any]:
    """The config fields of task ``name`` with their defaults (``size`` and ``seed`` left out: cohort sets them)."""
    config_cls = _registry()[name][1]
    fields = {}
    for f in dataclasses.fields(config_cls):
        if f.name in ("size", "seed"):
            continue
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else "<required>")
        fields[f.name] = default
    return fields


def check_task(task: str, config: dict[str, Any], field: str = "data.task_config") -> list[str]:
    """Problems with ``reasoning_gym:<name>`` and its ``data.task_config`` (or the config in `field`), found without
    building anything."""
    name = task[len(PREFIX):]
    names = task_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(PREFIX + c for c in close)}" if close else "`cohort tasks reasoning_gym` lists them"
        return [f"data.task = {task!r}: reasoning-gym has no task {name!r}; {hint}"]
    fields = task_fields(name)
    unknown = sorted(set(config) - set(fields))
    if unknown:
        return [f"{field}: {task} has no field(s) {unknown}; its fields (with defaults): "
                + ", ".join(f"{k}={v!r}" for k, v in fields.items())]
    if name == "composite":
        problems = []
        for spec in config.get("datasets") or []:
            problems += check_task(PREFIX + str(spec.get("name")), spec.get("config") or {}, field)
        return problems or ([] if config.get("datasets") else
                            [f"{field}: reasoning_gym:composite needs datasets: [{{name, weight, config}}, ...]"])
    return []


def check_configs(task: str, config: dict[str, Any], train_config: dict[str, Any] | None) -> list[str]:
    """``check_task`` on ``data.task_config`` and, when set, ``data.task_train_config`` (the same task's fields)."""
    return check_task(task, config) + (check_task(task, train_config, "data.task_train_config")
                                       if train_config is not None else [])


def config_key(config: dict[str, Any]) -> str:
    """The config as canonical JSON: the cache key, and what a reward spec records."""
    return json.dumps(config, sort_keys=True)


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config_json: str, seed: int, size: int):
    import reasoning_gym  # heavy optional dependency, as above
    from reasoning_gym.composite import DatasetSpec

    config = json.loads(config_json)
    if name == "composite":
        config["datasets"] = [DatasetSpec(name=s["name"], weight=s.get("weight", 1.0), config=s.get("config") or {})
                              for s in config["datasets"]]
    return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


def rg_dataset(name: str, config: dict[str, Any], seed: int, size: int):
    """The reasoning-gym dataset object for (name, config, seed, size), built once per process."""
    return _dataset(name, config_key(config), seed, size)


def split_indices(questions: list[str], eval_size: int) -> tuple[list[int], list[int]]:
    """(train, eval) indices into ``questions``: eval the first ``eval_size`` indices whose question is new, train the
    rest whose question is not an eval question (train may repeat a question of its own; the held-out set never)."""
    held_out: dict[str, int] = {}
    for i, q in enumerate(questions[:eval_size]):
        held_out.setdefault(q, i)
    train = [i for i in range(eval_size, len(questions)) if questions[i] not in held_out]
    return train, list(held_out.values())


def prompt_messages(question: str, answer_format: str) -> list[dict]:
    from reasoning_gym.utils import SYSTEM_PROMPTS  # as above

    user = [{"role": "user", "content": question}]
    return [{"role": "system", "content": SYSTEM_PROMPTS["default"]}] + user if answer_format == "tags" else user


def _build(task: str, config_json: str, seed: int, size: int, eval_size: int, answer_format: str, credit: str,
           train_config_json: str | None = None) -> Task:
    name = task[len(PREFIX):]
    dataset = _dataset(name, config_json, seed, eval_size + size)
    entries = [dataset[i] for i in range(eval_size + size)]
    if train_config_json is not None:  # train entries from the easier config, at the same indices (module docstring)
        train_dataset = _dataset(name, train_config_json, seed, eval_size + size)
        entries[eval_size:] = [train_dataset[i] for i in range(eval_size, eval_size + size)]
    train_idx, eval_idx = split_indices([e["question"] for e in entries], eval_size)

    def row(i: int) -> dict:
        answer = entries[i]["answer"]  # None for the tasks that check a proposed solution instead (graph_color, ...)
        return {"prompt": prompt_messages(entries[i]["question"], answer_format), "answer": "" if answer is None else str(answer),
                ROW_INDEX: i}

    spec = {"name": "reasoning_gym", "weight": 1.0, "task": name, "config": json.loads(config_json), "seed": seed,
            "size": eval_size + size, "answer_format": answer_format, **({"credit": credit} if credit != "partial" else {})}
    trained_on = ""
    if train_config_json is not None:
        spec.update(train_config=json.loads(train_config_json), eval_size=eval_size)
        trained_on = f", trained on config {train_config_json}"
    return Task(
        name=task, train_rows=[row(i) for i in train_idx], eval_rows=[row(i) for i in eval_idx], reward_specs=[spec],
        description=f"reasoning-gym's {name} (config {config_json}{trained_on}, seed {seed}), scored by its own score_answer",
        metadata={"dropped_train_rows": size - len(train_idx), "dropped_eval_rows": eval_size - len(eval_idx)},
    )


def build_task(task: str, config: dict[str, Any], *, seed: int, size: int, eval_size: int, answer_format: str,
               credit: str = "partial", train_config: dict[str, Any] | None = None) -> Task:
    """The Task for ``reasoning_gym:<name>``: disjoint train/eval rows and the reward spec (module docstring);
    the same arguments give the same rows (a run builds it once and carries it: cohort/connectors/reasoning_gym.py). `train_config`: the train entries' config when it
    differs from `config` (which then sets the held-out entries only)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format {answer_format!r}: choose one of {', '.join(ANSWER_FORMATS)}")
    problems = check_configs(task, config, train_config)
    if problems:
        raise ValueError("; ".join(problems))
    return _build(task, config_key(config), seed, size, eval_size, answer_format, credit,
                  None if train_config is None or train_config == config else config_key(train_config))


def format_tasks(only: str | None = None, width: int = 110) -> str:
    """What ``cohort tasks reasoning_gym`` prints: one ``reasoning_gym:<name>`` per task with its config fields and
    their defaults (``only``: that task alone; an unknown name fails with the closest ones)."""
    names = task_names()
    if only is not None:
        problems = check_task(PREFIX + only, {})
        if problems and only not in names:
            raise ValueError(problems[0])
        names = [only]
    lines = []
    for name in names:
        fields = ", ".join(f"{k}={_short(v)}" for k, v in task_fields(name).items()) or "(no fields)"
        if name == "composite":
            fields = "datasets=[{name: <task>, weight: <float>, config: {<its fields>}}, ...] (a weighted mix)"
        lines += textwrap.wrap(f"{PREFIX}{name}: {fields}", width=width, subsequent_indent="    ")
    return "\n".join(lines) + "\n"


def _short(value: Any, limit: int = 48) -> str:
    """A default as the listing shows it: its repr, cut at ``limit`` characters (long word lists, format objects)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."

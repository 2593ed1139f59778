"""`cohort.train`: the Python API, for notebooks and scripts (TRL's `GRPOTrainer(...).train()` in one call).

    import cohort
    summary = cohort.train({"model": {"path": "my/model"}, "train": {"max_steps": 50}},
                           reward_funcs=[lambda prompts, completions, **kw: [float("7" in c) for c in completions],
                                         {"name": "think_format", "weight": 0.2}],
                           train_dataset=[{"prompt": "3+4=", "answer": "7"}, ...])
    summary["run_dir"]  # what summary.json holds, with the run directory

It is `cohort train` without the command line, on the same path:

- the config is built by `load_config` (so `config=None` means what `cohort train` with
  no file means) from a dict, a YAML path or a `CohortConfig`, plus dotted `overrides`;
- reward functions given as Python objects become the config's reward specs (a spec's
  `name` may be the callable itself; `cohort.rewards.reward_registry` resolves it as it
  resolves an import path, so every contract the registry knows applies to it);
- in-memory datasets (a `datasets.Dataset`, or a list of dicts) are written into the
  run directory (`RUN_DIR/data/train.jsonl` or a saved dataset) and named in
  `data.train_files` / `data.eval_files`, so the data checks, the saved config.yaml and
  `cohort train --resume RUN_DIR` see ordinary files;
- `validate_config` runs once, before anything is written to the run directory or loaded
  (a `ConfigError` lists every problem); it returns the run's plan (the resolved config, the
  batch plan, the tokenizer and prompts it read), and `cohort.launch.launch.run_config`, the
  function `cmd_train` calls, runs that: torchrun children or Ray actors when asked, else a
  Trainer in this process handed the plan, the engine's output in RUN_DIR/logs/engine.log and
  a setup failure raised as `RunFailed` (its traceback in RUN_DIR/logs/error.log).

Left out: returning the trained model object (it is saved under RUN_DIR/final, which
`transformers.AutoModelForCausalLM.from_pretrained` loads); streaming datasets. A reward
given as an object without an import path (a lambda, a notebook function) works in this
process only: with `train.num_processes > 1` or `distributed.backend=ray` it is refused
before anything loads, since those processes read the config from a file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cohort.config import CohortConfig, ConfigError, default_output_dir
from cohort.config.resolve import environment_owns_data, resolve_config
from cohort.launch.launch import run_config
from cohort.config.references import IN_PROCESS_MARK
from cohort.plan.run_plan import RunPlan
from cohort.plan.validate import validate_config

RewardLike = str | Mapping[str, Any] | Callable[..., Any]
DATA_DIR = "data"  # under the run directory: the in-memory datasets, as files


def train(config: Mapping[str, Any] | str | os.PathLike | CohortConfig | None = None, *, overrides: Sequence[str] = (),
          reward_funcs: RewardLike | Sequence[RewardLike] | None = None, train_dataset: Any = None,
          eval_dataset: Any = None, tools: Sequence[Callable[..., Any] | str] | None = None,
          environment: type | str | None = None) -> dict[str, Any]:
    """Train as `cohort train` would and return the run's summary (summary.json's content; `run_dir` names the directory).

    config: a dict shaped like the YAML file, a YAML path, a `CohortConfig`, or None (what `cohort train` with no file
        uses). overrides: dotted `section.field=value` strings applied on top.
    reward_funcs: replaces the config's `rewards`; each item a callable (TRL's contract,
        `fn(prompts, completions, **columns) -> list[float | None]`, `def` or `async def`), a reward name (a built-in or
        an import path), or a spec dict (`{"name": ..., "weight": ...}`, where `name` may also be a callable).
    train_dataset / eval_dataset: a `datasets.Dataset`, a list of dicts, or one or more file paths; they replace
        `data.train_files` / `data.eval_files`.
    tools / environment: replace `tools.functions` / `tools.environment` (multi-turn tool calling, docs/tools.md):
        tool functions (TRL's: typed, with a docstring) or import paths; an environment class or its import path.
    Raises ConfigError (every problem, before any model loads) for a config that cannot work.
    """
    return run(_build(config, overrides=overrides, reward_funcs=reward_funcs, train_dataset=train_dataset,
                      eval_dataset=eval_dataset, tools=tools, environment=environment))


def build_config(config: Any = None, *, overrides: Sequence[str] = (), reward_funcs: Any = None, train_dataset: Any = None,
                 eval_dataset: Any = None, tools: Sequence[Any] | None = None, environment: Any = None) -> CohortConfig:
    """The validated (resolved) config of a `train` call, with its in-memory datasets written under RUN_DIR/data/."""
    return _build(config, overrides=overrides, reward_funcs=reward_funcs, train_dataset=train_dataset,
                  eval_dataset=eval_dataset, tools=tools, environment=environment).config


def _build(config: Any = None, *, overrides: Sequence[str] = (), reward_funcs: Any = None, train_dataset: Any = None,
           eval_dataset: Any = None, tools: Sequence[Any] | None = None, environment: Any = None) -> RunPlan:
    """The plan validating `build_config`'s config returned (handed to the Trainer: validated once), its run directory
    named and its in-memory datasets moved there."""
    staging = Path(tempfile.mkdtemp(prefix="cohort-data-"))
    try:
        extra = _data_overrides(train_dataset, "train", staging) + _data_overrides(eval_dataset, "eval", staging)
        cfg = _load(config, [*overrides, *extra], own_data=environment is not None)
        if reward_funcs is not None:
            _set_rewards(cfg, reward_funcs)
        if tools is not None:
            cfg.tools.functions = [tools] if callable(tools) or isinstance(tools, str) else list(tools)
        if environment is not None:
            cfg.tools.environment = environment
            environment_owns_data(cfg)  # (no data named: the environment's placeholder rows)
        cfg.run.output_dir = cfg.run.output_dir or default_output_dir()  # (this call's own config, named before validating)
        plan = validate_config(cfg)
        _check_single_process(plan.config)
        plan = dataclasses.replace(plan, config=_move_staged(plan.config, staging, Path(cfg.run.output_dir) / DATA_DIR))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return plan


def run(plan: RunPlan) -> dict[str, Any]:
    """Train a validated run (what `validate_config` returned, its run.output_dir set) on `cmd_train`'s path: torchrun
    children or Ray actors when asked, else here."""
    cfg = plan.config
    run_dir = Path(cfg.run.output_dir)
    config_file = run_dir / "config.yaml"  # what torchrun's children read; the run rewrites it with the same content
    run_dir.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    outcome = run_config(plan, ["train", str(config_file)])  # (cmd_train's orchestration, cohort/launch/launch.py)
    if isinstance(outcome, int):  # train.num_processes > 1: the torchrun children did the work
        if outcome != 0:
            raise RuntimeError(f"the {cfg.train.num_processes} training processes exited with status {outcome}; their "
                               f"output is above and under {run_dir}/ranks/")
        return json.loads((run_dir / "summary.json").read_text())
    return outcome  # rank 0's summary: Ray's, or this process's


def _load(config: Any, overrides: list[str], own_data: bool = False) -> CohortConfig:
    if isinstance(config, CohortConfig):
        config = config.model_dump()  # python mode: reward callables stay objects
    if config is not None and not isinstance(config, (Mapping, str, os.PathLike)):
        raise ConfigError([f"config: expected a dict, a YAML path or a CohortConfig, got {type(config).__name__}"])
    resolved = resolve_config(config, list(overrides), own_data=own_data)
    for note in resolved.notes:  # an old field name, read as its new one (cohort.config.renames)
        warnings.warn(note, FutureWarning, stacklevel=4)
    return resolved.config


def _set_rewards(cfg: CohortConfig, reward_funcs: Any) -> None:
    items = [reward_funcs] if isinstance(reward_funcs, (str, Mapping)) or callable(reward_funcs) else list(reward_funcs)
    specs = []
    for i, item in enumerate(items):
        if isinstance(item, Mapping):
            specs.append(dict(item))
        elif isinstance(item, str) or callable(item):
            specs.append({"name": item})
        else:
            raise ConfigError([f"reward_funcs[{i}]: expected a callable, a reward name or a spec dict, got {type(item).__name__}"])
    try:
        cfg.rewards = specs
    except ValidationError as exc:
        raise ConfigError([_describe_reward_error(e) for e in exc.errors()]) from None


def _describe_reward_error(error: dict) -> str:
    """A pydantic error at ("rewards", i, "weight") as `reward_funcs[i].weight: ...`."""
    index = next((p for p in error["loc"] if isinstance(p, int)), "?")
    field = ".".join(str(p) for p in error["loc"] if isinstance(p, str) and p != "rewards")
    return f"reward_funcs[{index}]{'.' + field if field else ''}: {error['msg']} (got {error.get('input')!r:.80})"


def _check_single_process(cfg: CohortConfig) -> None:
    """Rewards without an import path exist only in this process; other processes read the config from a file."""
    if cfg.train.num_processes == 1 and cfg.distributed.backend == "none":
        return
    local = [spec["name"] for spec in cfg.to_dict()["rewards"] or [] if spec["name"].startswith(IN_PROCESS_MARK)]
    if local:
        raise ConfigError([f"reward_funcs {', '.join(local)}: a function with no import path (a lambda, or one defined in a "
                           f"notebook or __main__) can only run in this process, but train.num_processes = "
                           f"{cfg.train.num_processes} and distributed.backend = {cfg.distributed.backend}; define it in an "
                           "importable module, or train with train.num_processes=1 and distributed.backend=none"])


# --------------------------------------------------------------------------- in-memory datasets as files


def _data_overrides(data: Any, split: str, staging: Path) -> list[str]:
    """`data.<split>_files=[...]` for a dataset argument: paths as given, in-memory data written under `staging`."""
    if data is None:
        return []
    paths = _as_paths(data)
    if paths is None:
        paths = [str(_write_dataset(data, split, staging))]
    return [f"data.{split}_files={json.dumps(paths)}"]  # JSON is YAML: any path survives the override parser


def _as_paths(data: Any) -> list[str] | None:
    if isinstance(data, (str, os.PathLike)):
        return [os.fspath(data)]
    if isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data):
        return [os.fspath(d) for d in data]
    return None


def _write_dataset(data: Any, split: str, staging: Path) -> Path:
    name = f"{split}_dataset"
    if hasattr(data, "save_to_disk"):  # datasets.Dataset / DatasetDict: saved as is (types kept)
        path = staging / split
        data.save_to_disk(str(path))
        return path
    if not isinstance(data, (list, tuple)):
        raise ConfigError([f"{name}: expected a datasets.Dataset, a list of dicts or file paths, got {type(data).__name__}"])
    if not data:
        raise ConfigError([f"{name} is empty: give at least one row ({{'prompt': ...}})"])
    path = staging / f"{split}.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, row in enumerate(data):
            if not isinstance(row, Mapping):
                raise ConfigError([f"{name}[{i}]: expected a dict (column -> value), got {type(row).__name__}"])
            try:
                fh.write(json.dumps(dict(row), default=_plain) + "\n")
            except (TypeError, ValueError) as exc:
                raise ConfigError([f"{name}[{i}]: {exc}; columns must hold strings, numbers, lists or dicts"]) from None
    return path


def _plain(value: Any) -> Any:
    """numpy scalars and arrays (common in rows built from pandas or parquet) as plain Python."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} ({value!r:.60}) cannot be written to a JSON Lines file")


def _move_staged(cfg: CohortConfig, staging: Path, target: Path) -> CohortConfig:
    """Move what was written under `staging` into RUN_DIR/data; returns the config with its file lists pointing there
    (a copy: the validated files moved, their content unchanged)."""
    files = {}
    for key in ("train_files", "eval_files"):
        paths = getattr(cfg.data, key)
        if not any(Path(p).parent == staging for p in paths):
            continue
        target.mkdir(parents=True, exist_ok=True)
        moved = []
        for p in map(Path, paths):
            if p.parent == staging:
                destination = target / p.name
                if destination.is_dir():
                    shutil.rmtree(destination)
                shutil.move(str(p), str(destination))
                p = destination
            moved.append(str(p))
        files[key] = moved
    return cfg.model_copy(update={"data": cfg.data.model_copy(update=files)}) if files else cfg

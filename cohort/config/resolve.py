"""Loading a config: YAML or a dict, dotted overrides, old names, the demo preset, pydantic's errors as fix-its.

`resolve_config` is the one place that decides whether the embedded demo's preset applies (only to the embedded
model on a built-in task, with no config file); the CLI and the Python API both call it, and it returns the one
line `cohort train` prints about where the values came from, and one note per old field name it read
(cohort.config.renames: a config written before a rename still works, a checkpoint's saved config.yaml too).

Left out: every check across fields (cohort.plan.validate). Imports the typed config, the rename table, the preset
and the mapping tables of `cohort convert` (`cohort.mapping.hints`, pure data: an unknown key that is verl's or
TRL's name is refused with cohort's spelling); none of them loads torch.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cohort.config.schema import SECTIONS, CohortConfig, ConfigError
from cohort.config.fields import fields_of
from cohort.config.renames import RENAMED_FIELDS, renamed_override, renamed_tree
from cohort.config.demo import DEMO_PRESET, DEMO_PRESET_FILE, is_embedded_demo
from cohort.mapping.hints import foreign_key_hint  # (pure tables: imports nothing else of cohort)


def parse_override(item: str) -> tuple[list[str], Any]:
    """`rollout.num_generations=8` -> (["rollout", "num_generations"], 8). Values parse as YAML."""
    if "=" not in item:
        raise ConfigError([f"override {item!r} is not of the form section.field=value (e.g. train.max_steps=50)"])
    key, _, raw = item.partition("=")
    path = [p for p in key.strip().split(".") if p]
    if not path or path[0] not in SECTIONS:
        hint = foreign_key_hint(key.strip().lstrip("+"))
        if hint:
            raise ConfigError([hint])
        raise ConfigError([f"override {item!r}: {key!r} does not start with a section; sections are {', '.join(SECTIONS)}"])
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError([f"override {item!r}: value is not valid YAML ({exc})"]) from None
    return path, value


def _set_path(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[path[-1]] = value


def _copy_tree(node: Any) -> Any:
    """A copy of nested dicts and lists; leaves (numbers, strings, reward callables) are shared, not deep-copied."""
    if isinstance(node, Mapping):
        return {key: _copy_tree(value) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_copy_tree(value) for value in node]
    return node


def merge(base: dict, extra: dict) -> dict:
    """`base` with `extra` laid over it, section by section (a copy; neither is changed)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class ResolvedConfig:
    """A validated-shape config, the one line that says where its values came from, and one note per old name read."""

    config: CohortConfig
    source: str  # e.g. "the embedded arith demo preset (examples/arith.yaml) + 1 override"
    demo_preset: bool
    notes: tuple[str, ...] = ()  # e.g. "rollout.max_staleness is now pipeline.max_staleness (read as that; ...)"


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError([f"config file {str(p)!r} does not exist"])
    try:
        loaded = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"config file {str(p)!r} is not valid YAML: {exc}"]) from None
    if not isinstance(loaded, dict):
        raise ConfigError([f"config file {str(p)!r} must hold a mapping of sections ({', '.join(SECTIONS)})"])
    return loaded


def _apply_overrides(tree: dict, overrides: list[str] | tuple[str, ...], notes: list[str]) -> list[str]:
    """Lay the dotted overrides over `tree`, old names read as their new ones; returns the conflicts (an old and a
    new name of one field both given)."""
    given: dict[tuple[str, ...], str] = {}  # new path -> the name an override gave it by
    conflicts = []
    for item in overrides:
        key_path, value = parse_override(item)
        named = ".".join(key_path)
        key_path, value, note = renamed_override(key_path, value)
        if note:
            notes.append(note)
        if not key_path:
            continue
        earlier = given.get(tuple(key_path))
        if earlier is not None and (earlier in RENAMED_FIELDS) != (named in RENAMED_FIELDS):
            conflicts.append(f"{earlier} and {named} are both given ({'.'.join(key_path)} is the new name): keep only "
                             f"{'.'.join(key_path)}")
        given[tuple(key_path)] = named
        _set_path(tree, key_path, value)
    return conflicts


def resolve_config(source: str | os.PathLike | Mapping[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                   own_data: bool = False) -> ResolvedConfig:
    """The one place that decides whether the demo preset applies, for the CLI and the Python API alike.

    Layers: field defaults < the demo preset < a YAML file or a dict < dotted overrides. The preset applies only
    when no YAML file is given and nothing names a model or data of one's own (model.path unset or `tiny:*`,
    data.train_files and data.dataset_name empty, and `own_data` False: the Python API passes True for a dataset given as
    an object).
    A YAML file is complete on its own over the field defaults; `examples/arith.yaml` is the preset written out,
    and a resumed run's config.yaml is never re-preset. Old field names are read as their new ones, layer by layer.
    """
    if isinstance(source, Mapping):
        tree, named = _copy_tree(source), "a dict"  # overrides must not write into the caller's dict
    elif source is not None:
        tree, named = read_yaml(source), str(source)
    else:
        tree, named = {}, None
    tree, notes, conflicts = renamed_tree(tree)
    conflicts += _apply_overrides(tree, overrides, notes)
    if conflicts:
        raise ConfigError(conflicts)
    demo = not isinstance(source, (str, os.PathLike)) and not own_data and is_embedded_demo(tree)
    if demo:
        tree = merge(copy.deepcopy(DEMO_PRESET), tree)
    try:
        config = CohortConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError([_describe_pydantic_error(e) for e in exc.errors()]) from None
    environment_owns_data(config)
    parts = [f"the embedded arith demo preset ({DEMO_PRESET_FILE})" if demo else "the field defaults"]
    parts += [named] if named else []
    parts += [f"{len(overrides)} override{'s' * (len(overrides) != 1)}"] if overrides else []
    if not demo and not isinstance(source, (str, os.PathLike)):
        parts[0] += " (a model or data of your own: the demo preset is only for the embedded model on a built-in task)"
    return ResolvedConfig(config=config, source=" + ".join(parts), demo_preset=demo, notes=tuple(dict.fromkeys(notes)))


def environment_owns_data(config: CohortConfig) -> None:
    """With tools.environment and no data named (data.train_files, data.dataset_name and data.task all left unset),
    the environment owns the data, as TRL's `environment_factory` without a `train_dataset`: data.task becomes None (not
    its default, the built-in arith task), so the run trains on placeholder rows (cohort/data/run_data.py) whose
    prompt `reset` returns. Saved with the run's config, so a resumed run keeps it."""
    data = config.data
    if config.tools.environment is not None and not (data.train_files or data.dataset_name) \
            and "task" not in data.model_fields_set:
        data.task = None


def load_config(path: str | os.PathLike | Mapping[str, Any] | None = None, overrides: list[str] | tuple[str, ...] = ()) -> CohortConfig:
    """Build the config (see `resolve_config` for the layers and when the demo preset applies)."""
    return resolve_config(path, overrides).config


def _describe_pydantic_error(err: dict) -> str:
    where = ".".join(str(p) for p in err["loc"])
    if err["type"] == "extra_forbidden":
        hint = foreign_key_hint(where)
        if hint:
            return hint
        section = err["loc"][0] if err["loc"] else ""
        known = fields_of(section)
        hint = f"; valid fields in {section}: {', '.join(known)}" if known else ""
        return f"{where}: unknown field{hint}"
    return f"{where}: {err['msg']} (got {err.get('input')!r})"

"""The shape of a mapping table: `Rule`s that turn one source option into cohort fields, and plain converters.

A `Rule` names the source's key, the cohort fields it can set (for the docs and
the hints), a converter `fn(value, options) -> list[Entry]` and a note. The
converter sees every option of the source (`Options`, with the source's own
defaults for those not given), so unit conversions read the keys they need and
write the arithmetic into the entry's comment. A value with no cohort
counterpart raises `Unmappable(reason)`; a rule with no targets is always
unmappable, its note being the reason.

`default` on a rule is the source's own default, given only where it differs
from cohort's and changes the run: the rule is then applied even when the key is
absent, so the converted run keeps the source's behaviour (and says so).

This module imports nothing of cohort: cohort.config reads the tables (through
`cohort.mapping.hints`) to name the cohort spelling of a foreign key.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

import yaml

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()


class Unmappable(Exception):
    """This option (or this value of it) has no cohort counterpart; the message says why and what to do."""

    @property
    def reason(self) -> str:
        return str(self.args[0])


class PartlyUnmappable(Unmappable):
    """Some of a value maps (`entries`) and some does not (the message, naming each part and why)."""

    def __init__(self, entries: list[Entry], reason: str):
        super().__init__(reason)
        self.entries = entries


@dataclasses.dataclass(frozen=True)
class Unresolved:
    """A value that holds a variable the script sets nowhere (or a `$(...)` never run here): cohort.convert.sources
    makes it; a rule that reads it is unmappable, naming the variable."""

    text: str  # as written, e.g. ${NNODES}
    names: tuple[str, ...]

    @property
    def reason(self) -> str:
        which = ", ".join(n if n.startswith(("$", "`")) else "$" + n for n in self.names)
        first = self.names[0]
        fix = "run it yourself and write its output into the script" if first.startswith(("$", "`")) else \
            f"set it (export {first}=...) and convert again, or write the value into the script"
        return f"holds {which}, which the script sets nowhere and this environment does not have: {fix}"




@dataclasses.dataclass(frozen=True)
class Entry:
    """One line of the converted YAML: a cohort field, its value, and the comment naming where it came from."""

    field: str  # "rollout.num_generations", or "rewards"
    value: Any
    comment: str
    source: str = ""  # the source key whose rule made it (filled in by cohort.convert.core)


@dataclasses.dataclass(frozen=True)
class Options:
    """The source's options as given, with the source's defaults (`Rule.default`, `extra_defaults`) for the rest."""

    given: Mapping[str, Any]
    defaults: Mapping[str, Any]
    source_name: str  # "verl" or "TRL", for comments
    rows: int | None = None  # training prompts, when knowable (a local file, or --rows)
    rows_from: str = ""  # where `rows` came from, for comments
    num_processes: int = 1  # TRL: accelerate's --num_processes (not in the config)

    def has(self, key: str) -> bool:
        return key in self.given

    def get(self, key: str, fallback: Any = None) -> Any:
        value = self.given[key] if key in self.given else self.defaults.get(key, fallback)
        if isinstance(value, Unresolved):
            raise Unmappable(f"it reads {key} = {value.text}, which {value.reason}")
        return value

    def show(self, key: str) -> str:
        """`key=value`, marked when the value is the source's default rather than the user's."""
        text = f"{key}={flow(self.get(key))}"
        return text if key in self.given else f"{text} ({self.source_name}'s default)"


@dataclasses.dataclass(frozen=True)
class Rule:
    source: str
    targets: tuple[str, ...]
    convert: Callable[[Any, Options], list[Entry]] | None = None  # None: copy the value into targets[0]
    note: str = ""
    default: Any = MISSING

    def apply(self, value: Any, options: Options) -> list[Entry]:
        if not self.targets:
            raise Unmappable(self.note or "no cohort counterpart")
        if self.convert is None:
            return [Entry(self.targets[0], value, options.show(self.source))]
        return self.convert(value, options)


def flow(value: Any) -> str:
    """A value as one line of YAML (flow style): `5`, `grpo`, `[console, wandb]`, `{name: verl_default}`."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False).strip()
    text = text[:-4].strip() if text.endswith("\n...") else text
    if "\n" in text:  # a multi-line string: JSON (valid YAML) keeps it on one line, escaped
        text = json.dumps(value, ensure_ascii=False, default=str)
    return text


def mapped(source: str, target: str, table: Mapping[Any, Any], note: str = "", *, default: Any = MISSING) -> Rule:
    """A rule whose values are renamed by `table`; a value outside it is unmappable, naming the ones that map."""

    usable = {k: v for k, v in table.items() if v is not MISSING}
    if all(flow(k) == flow(v) for k, v in usable.items()):
        values = f"the same values: {', '.join(flow(k) for k in usable)}"
    else:
        values = ", ".join(f"{flow(k)} → {flow(v)}" for k, v in usable.items())
    missing = [flow(k) for k, v in table.items() if v is MISSING]
    values += f"; {', '.join(missing)}: no counterpart" if missing else ""

    def convert(value: Any, options: Options) -> list[Entry]:
        key = value.lower() if isinstance(value, str) else value
        if key not in usable:
            raise Unmappable(f"{flow(value)} has no cohort counterpart ({target}: {values})")
        return [Entry(target, usable[key], options.show(source))]

    return Rule(source, (target,), convert, f"{values}{'; ' + note if note else ''}", default)


def model_path(field: str, key: str) -> Callable[[Any, Options], list[Entry]]:
    """A checkpoint path or a Hub name (`org/name`), kept as it is: cohort resolves a Hub name through the Hugging
    Face cache (downloading it once, at the revision model.revision names)."""

    def convert(value: str, options: Options) -> list[Entry]:
        local = value.startswith(("/", ".", "~", "$")) or value.count("/") != 1
        hint = "" if local else "; a Hub name, resolved through the Hugging Face cache"
        return [Entry(field, value, options.show(key) + hint)]

    return convert


def none_of(source: str, note: str) -> Rule:
    """A source option with no cohort counterpart; `note` is the reason and what to do instead."""
    return Rule(source, (), None, note)


def whole(value: Any, what: str) -> int:
    """`value` as an int, or Unmappable when it is not a whole number (a ratio of two batch sizes that does not divide)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise Unmappable(f"{what} = {value:g} is not a whole number: cohort needs whole batches; adjust the sizes")
    return value


def steps_for_epochs(epochs_key: str, options: Options, prompts_per_generation: int, steps_per_generation: int,
                     steps_text: str) -> list[Entry]:
    """train.max_steps for `epochs` passes over the data: ceil(epochs × floor(rows / prompts per generation batch)
    × optimizer steps per generation batch), the last partial generation batch of each epoch dropped (verl's and
    TRL's loaders both drop it). Unmappable, with the formula, when the number of rows is not knowable."""
    epochs = options.get(epochs_key)
    batches = None if options.rows is None else options.rows // prompts_per_generation
    formula = (f"{options.show(epochs_key)} × floor(rows / {prompts_per_generation} prompts per generation batch) × "
               f"{steps_text}")
    if batches is None:
        raise Unmappable(f"the number of training prompts is not knowable here (a file not on this machine, or a Hub "
                         f"dataset): set train.max_steps = {formula}, or rerun `cohort convert` with --rows N")
    if batches == 0:
        raise Unmappable(f"{options.rows} rows ({options.rows_from}) make no whole generation batch of "
                         f"{prompts_per_generation} prompts: set train.max_steps yourself")
    steps = -(-epochs * batches * steps_per_generation // 1)
    arithmetic = (f"{options.show(epochs_key)} × floor({options.rows} rows ({options.rows_from}) / "
                  f"{prompts_per_generation} prompts per generation batch) = {epochs * batches:g} generation batches × "
                  f"{steps_text} = {int(steps)}")
    return [Entry("train.max_steps", int(steps), arithmetic)]

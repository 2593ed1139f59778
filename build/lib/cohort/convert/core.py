"""Apply a mapping table to a source's options, check the result against cohort's config, write the YAML.

`convert(kind, options, ...)` runs every rule of the source's table on the options
given (and on the source's own defaults that differ from cohort's, `Rule.default`),
then makes sure nothing is silently lost:
- an option no rule knows, or whose rule raised `Unmappable`, is listed with the reason;
- an option whose rule set nothing must be named in another line's comment (it was
  folded into that line's arithmetic), else it is listed;
- two options that set one field: the first is kept, the second listed as a conflict;
- a field this version of cohort does not have (a newer name) and a value cohort's
  config refuses (checked with `CohortConfig`) are moved to the list, with the reason;
- an option only part of which maps (a list of rewards, some without a counterpart) is
  both converted and listed, the listed part named;
- a value holding a variable the script sets nowhere (`Unresolved`) is listed naming it,
  and so is every option whose conversion reads it; a rule that fails on a value of an
  unexpected shape lists the option too (never a traceback);
- finally the result is checked as `cohort plan` checks a config's own fields
  (`validate_config(check_files=False)`); what it refuses is kept in `refusals` and
  written at the end of the YAML.
`render(conversion)` writes the YAML: one line per field, the source key and the
arithmetic in its comment, then the list of what was not mapped as a comment block
(every comment on one line, so a multi-line value never becomes YAML).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from cohort.config import SECTIONS, CohortConfig, ConfigError
from cohort.config.fields import describe_fields
from cohort.convert.sources import SourceError, count_rows, detect, read_trl, read_trl_command, read_verl
from cohort.mapping.rules import (MISSING, Entry, Options, PartlyUnmappable, Rule, Unmappable, Unresolved,
                                  flow)
from cohort.plan.validate import validate_config
from cohort.mapping.trl_rules import TRL_RULES
from cohort.mapping.verl_rules import VERL_RULES

TABLES: dict[str, tuple[str, tuple[Rule, ...]]] = {"verl": ("verl", VERL_RULES), "trl": ("TRL", TRL_RULES),
                                                   "trl_command": ("TRL", TRL_RULES)}
# The source's defaults that conversions read but need not apply (equal to cohort's, or only part of a product).
READ_DEFAULTS: dict[str, dict[str, Any]] = {
    "verl": {"actor_rollout_ref.actor.ppo_epochs": 1, "trainer.nnodes": 1, "algorithm.use_kl_in_reward": False,
             "actor_rollout_ref.actor.use_kl_loss": False, "actor_rollout_ref.actor.use_dynamic_bsz": False,
             "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384, "data.filter_overlong_prompts": False,
             "actor_rollout_ref.actor.optim.lr_warmup_steps": -1, "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
             "critic.optim.lr_warmup_steps": -1, "critic.optim.lr_warmup_steps_ratio": 0.0,
             "actor_rollout_ref.actor.loss_agg_mode": "token-mean", "actor_rollout_ref.actor.tau_pos": 1.0,
             "actor_rollout_ref.actor.tau_neg": 1.05, "reward_model.enable": False,
             "algorithm.filter_groups.enable": False, "algorithm.filter_groups.metric": "acc",
             "algorithm.filter_groups.max_num_gen_batches": 0},
    "trl": {"num_generations": 8, "num_iterations": 1, "max_steps": -1, "logging_steps": 10, "save_steps": 500,
            "save_strategy": "steps", "eval_strategy": "no", "eval_steps": None, "vllm_server_host": "0.0.0.0",
            "vllm_server_port": 8000, "vllm_tensor_parallel_size": 1, "vllm_importance_sampling_mode": "sequence_mask",
            "epsilon_high": None, "generation_batch_size": None, "steps_per_generation": None, "loss_type": "dapo",
            "use_adaptive_entropy": False, "use_peft": False, "dataset_name": None},
}
READ_DEFAULTS["trl_command"] = READ_DEFAULTS["trl"]


@dataclasses.dataclass(frozen=True)
class Unmapped:
    key: str
    value: Any
    reason: str
    from_default: bool = False  # the source's default, not the user's value

    def line(self, source_name: str) -> str:
        where = f" ({source_name}'s default)" if self.from_default else ""
        return f"{self.key}={flow(self.value)}{where}: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Conversion:
    source_name: str  # "verl" / "TRL"
    origin: str  # the file, or "the command line"
    entries: tuple[Entry, ...]
    unmapped: tuple[Unmapped, ...]
    notes: tuple[str, ...] = ()
    refusals: tuple[str, ...] = ()  # what `cohort plan` (config checks, no files) says of the output, if it refuses it

    def tree(self) -> dict[str, Any]:
        return _tree(self.entries)


def find_rule(rules: tuple[Rule, ...], key: str) -> Rule | None:
    """The rule for `key`: its own, else the longest `prefix.*` rule that covers it."""
    exact = {r.source: r for r in rules}
    if key in exact:
        return exact[key]
    covering = [r for r in rules if r.source.endswith(".*") and key.startswith(r.source[:-1])]
    return max(covering, key=lambda r: len(r.source), default=None)


def convert(kind: str, given: dict[str, Any], *, origin: str, rows: int | None = None, rows_from: str = "",
            num_processes: int = 1, notes: list[str] | tuple[str, ...] = ()) -> Conversion:
    name, rules = TABLES[kind]
    defaults = {r.source: r.default for r in rules if r.default is not MISSING} | READ_DEFAULTS[kind]
    options = Options(given, defaults, name, rows, rows_from, num_processes)
    entries, unmapped, folded = [], [], []
    keys = list(given) + [r.source for r in rules if r.default is not MISSING and r.source not in given]
    for key in keys:
        rule, value = find_rule(rules, key), given[key] if key in given else defaults.get(key)
        if isinstance(value, Unresolved):
            unmapped.append(Unmapped(key, value.text, value.reason))
            continue
        if rule is None:
            unmapped.append(Unmapped(key, value, f"not among the {name} options cohort's table knows; no counterpart known"))
            continue
        try:
            made = rule.apply(value, options)
        except PartlyUnmappable as exc:
            entries += [dataclasses.replace(e, source=key) for e in exc.entries]
            unmapped.append(Unmapped(key, value, "partly: " + exc.reason, key not in given))
            continue
        except Unmappable as exc:
            unmapped.append(Unmapped(key, value, exc.reason, key not in given))
            continue
        except (TypeError, ValueError, KeyError, ZeroDivisionError, AttributeError) as exc:  # a value of a shape the rule
            unmapped.append(Unmapped(key, value, f"cohort convert could not read this value ({type(exc).__name__}: "
                                     f"{exc}); set the cohort field yourself: {', '.join(rule.targets) or '-'}"))
            continue
        entries += [dataclasses.replace(e, source=key) for e in made]
        folded += [key] if not made and key in given else []
    entries = _check(_known_fields(_merge(entries, unmapped), unmapped), unmapped)
    for key in folded:  # (after the checks: a line that was dropped names nothing)
        if not any(_names(e.comment, key) for e in entries):
            rule = find_rule(rules, key)
            unmapped.append(Unmapped(key, given[key], "no effect beside the other options given" +
                                     (f" ({rule.note})" if rule and rule.note else "")))
    return Conversion(name, origin, tuple(entries), tuple(unmapped), tuple(notes), _refusals(entries))


def _names(comment: str, key: str) -> bool:
    """Whether a comment names `key` as `key=value` (the way every line names the options it came from)."""
    return re.search(rf"(^|[ ,(;]){re.escape(key)}=", comment) is not None


def _merge(entries: list[Entry], unmapped: list[Unmapped]) -> list[Entry]:
    """One entry per field: a repeat with the same value joins the first's comment; another value is a conflict."""
    out: dict[str, Entry] = {}
    for e in entries:
        first = out.get(e.field)
        if first is None:
            out[e.field] = e
        elif first.value == e.value:
            out[e.field] = dataclasses.replace(first, comment=f"{first.comment}; {e.comment}")
        else:
            unmapped.append(Unmapped(e.source, e.value, f"would set {e.field} = {flow(e.value)}, but {first.source} "
                                     f"already set it to {flow(first.value)}; the first is kept"))
    return list(out.values())


def _known_fields(entries: list[Entry], unmapped: list[Unmapped]) -> list[Entry]:
    known = {key for key, *_ in describe_fields()}
    for e in entries:
        if e.field not in known:
            unmapped.append(Unmapped(e.source, e.value, f"its cohort name is {e.field}, which this version of cohort "
                                     "does not have yet"))
    return [e for e in entries if e.field in known]


def _check(entries: list[Entry], unmapped: list[Unmapped]) -> list[Entry]:
    """Drop (and list) the entries whose values cohort's config refuses, until the rest validates."""
    for _ in range(len(entries) + 1):
        try:
            CohortConfig.model_validate(_tree(entries))
            return entries
        except ValidationError as exc:
            bad = {}
            for err in exc.errors():
                loc = [str(p) for p in err["loc"]]
                bad[loc[0] if loc[0] == "rewards" else ".".join(loc[:2])] = err["msg"]
        for e in entries:
            if e.field in bad:
                unmapped.append(Unmapped(e.source, e.value, f"cohort's {e.field} refuses {flow(e.value)}: {bad[e.field]}"))
        entries = [e for e in entries if e.field not in bad]
    return entries


def _refusals(entries: list[Entry]) -> tuple[str, ...]:
    """The problems `cohort plan` finds in the converted config's own fields (no model or data read), or none."""
    try:
        validate_config(CohortConfig.model_validate(_tree(entries)),
                        check_files=False)
    except ConfigError as exc:
        return tuple(exc.problems)
    return ()


def _tree(entries) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for e in entries:
        if e.field == "rewards":
            tree["rewards"] = e.value
        else:
            section, field = e.field.split(".", 1)
            tree.setdefault(section, {})[field] = e.value
    return tree


def render(conversion: Conversion) -> str:
    """The cohort YAML: sections in cohort's order, fields in their declared order, each with its comment."""
    order = {key: i for i, (key, *_) in enumerate(describe_fields())}
    by_field = sorted(conversion.entries, key=lambda e: order.get(e.field, len(order)))
    lines = [f"# cohort config converted by `cohort convert` from {conversion.source_name}'s options in {conversion.origin}.",
             "# Each line names the option(s) it came from; what cohort cannot take is listed at the end.",
             "# Check it without loading anything: cohort plan THIS_FILE"]
    for section in SECTIONS:
        mine = [e for e in by_field if e.field.split(".", 1)[0] == section]
        if section == "rewards":
            lines += [f"rewards: {flow(e.value)}  # {e.comment}" for e in mine]
        elif mine:
            lines.append(f"{section}:")
            lines += [f"  {e.field.split('.', 1)[1]}: {flow(e.value)}  # {e.comment}" for e in mine]
    if conversion.unmapped:
        lines += ["", f"# Not mapped ({len(conversion.unmapped)}): what the {conversion.source_name} option did, and what "
                  "to do in cohort instead"]
        lines += [f"#   {u.line(conversion.source_name)}" for u in conversion.unmapped]
    if conversion.notes:
        lines += ["", "# Notes on reading the input:"] + [f"#   {n}" for n in conversion.notes]
    if conversion.refusals:
        lines += ["", f"# `cohort plan` refuses this config as converted ({len(conversion.refusals)} problem(s)); fix "
                  "these before training:"] + [f"#   {p}" for p in conversion.refusals]
    return "\n".join(_one_line(line) for line in lines) + "\n"


def _one_line(line: str) -> str:
    """A comment (or a field line's comment) never spills onto the next line, where it would be YAML."""
    if "\n" not in line:
        return line
    head, comment = (line.split("  # ", 1) + [""])[:2] if not line.startswith("#") else ("", line)
    flat = comment.replace("\n", " \u21b5 ")
    return f"{head}  # {flat}" if head else flat


def convert_input(args: list[str], *, kind: str | None = None, rows: int | None = None, num_processes: int = 1,
                  environ: dict[str, str] | None = None) -> Conversion:
    """Read `args` (a verl script, verl's arguments, a TRL YAML/JSON file, or a script running TRL) and convert it.
    The training data's size (for epochs) is `rows`, else counted from a local training file the options name.
    `environ`: where a script's variables it does not set itself are looked up (default: this process's)."""
    if len(args) == 1 and "=" not in args[0] and not Path(args[0]).is_file():
        raise SourceError(f"{args[0]}: no such file (give a launch script, a TRL config, or key=value arguments)")
    kind = kind or detect(args)
    origin = args[0] if len(args) == 1 else "the command line"
    if kind in ("trl", "trl_command"):
        given, notes = (read_trl(args[0]), []) if kind == "trl" else read_trl_command(args, environ)
        files = [given["dataset_name"]] if isinstance(given.get("dataset_name"), str) else []
        if isinstance(given.get("num_processes"), int):
            num_processes = given["num_processes"]
        elif num_processes > 1:  # accelerate's processes, given on cohort convert's command line
            given = {**given, "num_processes": num_processes}
            notes = [*notes, f"num_processes={num_processes}: from --num-processes (accelerate's, not in the input)"]
    else:
        given, notes = read_verl(args, environ)
        if not given:
            raise SourceError("no key=value option of verl's trainer was found: " + ("; ".join(notes) or "nothing to read"))
        files = given.get("data.train_files") or []
        files = [files] if isinstance(files, str) else list(files) if isinstance(files, list) else []
    rows_from = "--rows" if rows is not None else ", ".join(map(str, files))
    if rows is None and files:
        rows = count_rows(files)
    return convert(kind, given, origin=origin, rows=rows, rows_from=rows_from, num_processes=num_processes, notes=notes)

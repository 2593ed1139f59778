"""Reading what users bring: a verl launch script or its arguments, a TRL YAML/JSON config or `trl grpo` /
`accelerate launch` command; and data sizes.

A script is read as bash would read what it sets (cohort.convert.shell: continuations, quotes,
`${A:-default}` nested, `$((...))`, word splitting, exported variables); a variable set nowhere, in the
script or this environment, stays in the value as `Unresolved`, so the option that holds it is listed
naming the variable. verl's command is the one that runs `verl.trainer.main_ppo` or a verl recipe's own
entry point (`recipe.dapo.main_dapo`, `recipe.dapo.src.main_dapo`, ...: they read main_ppo's options and
their own), after `python3 -m`, `nohup`, env-var prefixes, `ray job submit --`...; its `key=value`
arguments are the options, values read as YAML as Hydra reads them, a leading `+`/`++` dropped. TRL's
command is `trl grpo ...` or `accelerate launch [its flags] SCRIPT.py --key value ...`: accelerate's
`--num_processes` is an option too (TRL's batch arithmetic needs it). What follows a `|`, `>`, `&&` or `;`
is not part of the command.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from cohort.convert.shell import UNSET, Shell, ShellError, display, unresolved_names
from cohort.mapping.rules import Unresolved

VERL_ENTRY = ("verl.trainer.main_ppo", "main_ppo.py")
_RECIPE_ENTRY = re.compile(r"^recipe\.[\w.]+\.main_\w+$|^recipe/[\w/]+/main_\w+\.py$")
STOP_TOKENS = ("|", "||", "&&", ";", "&")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")
TRL_SUBCOMMANDS = ("grpo", "rloo")


class SourceError(ValueError):
    """The input cannot be read as a verl command line or a TRL config; the message says what was expected."""


def detect(args: list[str]) -> str:
    """`verl`, `trl` (a config file) or `trl_command` (a shell script or arguments running TRL)."""
    if len(args) == 1 and Path(args[0]).suffix.lower() in (".yaml", ".yml", ".json"):
        return "trl"
    text = Path(args[0]).read_text() if len(args) == 1 and Path(args[0]).is_file() else " ".join(args)
    if re.search(r"main_ppo|\brecipe[./][\w./]*main_\w+", text):
        return "verl"
    if re.search(r"\btrl\s+(grpo|rloo)\b|accelerate\s+launch|\.py\s+(\\\s*)?--\w", text):
        return "trl_command"
    return "verl"


def read_trl(path: str) -> dict[str, Any]:
    """The options of a TRL config file: the YAML `trl grpo --config` takes, or GRPOConfig's keyword arguments as JSON."""
    p = Path(path)
    if not p.is_file():
        raise SourceError(f"{path}: no such file")
    try:
        loaded = json.loads(p.read_text()) if p.suffix.lower() == ".json" else yaml.safe_load(p.read_text())
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SourceError(f"{path}: not valid {'JSON' if p.suffix.lower() == '.json' else 'YAML'} ({exc})") from None
    if not isinstance(loaded, dict):
        raise SourceError(f"{path}: expected a mapping of TRL options (GRPOConfig's fields), got {type(loaded).__name__}")
    return loaded


def read_verl(args: list[str], environ: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(options, notes) from a verl launch script (one path) or the command line's own arguments."""
    environ = dict(os.environ if environ is None else environ)
    if len(args) == 1 and Path(args[0]).is_file():
        return _read_script(Path(args[0]).read_text(), environ, _is_verl_entry, "verl's trainer (python3 -m "
                            "verl.trainer.main_ppo ..., or a recipe's main such as recipe.dapo.main_dapo)", _options)
    return _options(list(args), [])


def read_trl_command(args: list[str], environ: dict[str, str] | None = None) -> tuple[dict[str, Any], list[str]]:
    """(options, notes) from a script or arguments running `trl grpo ...` or `accelerate launch ... SCRIPT.py ...`."""
    environ = dict(os.environ if environ is None else environ)
    text = Path(args[0]).read_text() if len(args) == 1 and Path(args[0]).is_file() else " ".join(args)
    return _read_script(text, environ, _is_trl_entry, "TRL (trl grpo ..., or accelerate launch ... SCRIPT.py ...)",
                        _trl_options)


def _is_verl_entry(word: str, before: list[str]) -> bool:
    return word.endswith(VERL_ENTRY) or bool(_RECIPE_ENTRY.match(word))


def _is_trl_entry(word: str, before: list[str]) -> bool:
    if before[-1:] == ["trl"] and word in TRL_SUBCOMMANDS:
        return True
    return word.endswith(".py") and "launch" in before or (word.endswith(".py") and before[-1:] in (["python"], ["python3"]))


def _read_script(text: str, environ: dict[str, str], is_entry, what: str, parse) -> tuple[dict[str, Any], list[str]]:
    shell = Shell(environ)
    try:
        for words in shell.commands(text):
            for i, word in enumerate(words):
                if is_entry(word, words[:i]):
                    return parse(words, shell.notes)
            if words[0] == "export" and len(words) > 1:
                shell.notes.append(f"exported {' '.join(display(w) for w in words[1:])}: environment, not an option (set "
                                   "it for `cohort train` where it still applies)")
    except ShellError as exc:
        raise SourceError(f"cannot read the script as bash would: {exc}") from None
    raise SourceError(f"no line of the script runs {what}")


def _environment_note(prefix: list[str], notes: list[str]) -> None:
    env = [display(t) for t in prefix if _ASSIGNMENT.match(t)]
    if env:
        notes.append(f"environment for the command: {' '.join(env)} (set it the same way for `cohort train` where it "
                     "still applies, e.g. CUDA_VISIBLE_DEVICES)")


def _options(tokens: list[str], notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """key=value tokens after the trainer's entry point (all of them when it is not named) as options."""
    starts = [i for i, t in enumerate(tokens) if _is_verl_entry(t, tokens[:i])]
    _environment_note(tokens[:starts[0]] if starts else [], notes)
    if starts and not tokens[starts[0]].endswith(VERL_ENTRY):
        notes.append(f"{tokens[starts[0]]}: a verl recipe's own entry point; it reads main_ppo's options and the "
                     "recipe's own (each mapped or listed below)")
    options: dict[str, Any] = {}
    for token in tokens[starts[0] + 1:] if starts else tokens:
        if token in STOP_TOKENS or token.startswith((">", "2>", "1>", "&>")):
            break
        if "=" not in token or token.startswith("-"):
            notes.append(f"{display(token)}: not a key=value option of verl's trainer (Hydra's --config-name and the "
                         "like are not read); nothing converted from it")
            continue
        key, _, raw = token.lstrip("+").partition("=")
        options[key] = _value(raw)
    return options, notes


def _trl_options(tokens: list[str], notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """`--key value...` after TRL's script or subcommand; accelerate's own flags before it (`--num_processes`)."""
    start = next(i for i, t in enumerate(tokens) if i and _is_trl_entry(t, tokens[:i]))
    _environment_note(tokens[:start], notes)
    launcher = _flags(tokens[:start])
    options = _flags(tokens[start + 1:])
    for key, value in launcher.items():
        if key == "num_processes":
            options.setdefault("num_processes", value)
        else:
            notes.append(f"accelerate launch --{key} {display(str(value))}: the launcher's setting, not TRL's; "
                         "cohort runs train.num_processes processes itself (FSDP2)")
    if tokens[start].endswith(".py") and not tokens[start].endswith(("grpo.py", "gspo.py", "rloo.py")):
        notes.append(f"{tokens[start]}: the options are read as TRL's GRPO script reads them (its model, dataset and "
                     "GRPOConfig arguments); what the script itself builds in Python is not seen here")
    return options, notes


def _flags(tokens: list[str]) -> dict[str, Any]:
    """`--key v`, `--key=v`, `--key v1 v2` (a list), `--flag` (true), up to the first operator."""
    options: dict[str, Any] = {}
    key = None
    for token in tokens:
        if token in STOP_TOKENS or token.startswith((">", "2>", "1>", "&>")):
            break
        if token.startswith("--"):
            key, eq, raw = token[2:].partition("=")
            options[key] = _value(raw) if eq else True
            key = None if eq else key
        elif key is not None:
            value = _value(token)
            current = options[key]
            options[key] = value if current is True else (current + [value] if isinstance(current, list) else [current, value])
    return {k: v for k, v in options.items() if k}


def _value(raw: str) -> Any:
    """A Hydra value: YAML, with `1e-6` a float as Hydra reads it (YAML 1.1 would keep it a string); a value that
    holds an unexpanded variable is `Unresolved`."""
    if UNSET in raw:
        return Unresolved(display(raw), tuple(dict.fromkeys(unresolved_names(raw))))
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return raw
    if isinstance(value, str):
        try:
            return float(value) if re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value) else value
        except ValueError:
            return value
    return value


def count_rows(files: list[str]) -> int | None:
    """Rows in local data files (parquet from its footer, JSONL by lines); None when any is missing or unreadable."""
    total = 0
    for name in files:
        path = Path(str(name)).expanduser()
        if not path.is_file():
            return None
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq  # (heavy: only for a parquet file that is here)

            total += pq.ParquetFile(path).metadata.num_rows
        elif path.suffix == ".jsonl":
            with path.open() as f:
                total += sum(1 for line in f if line.strip())
        else:
            return None
    return total

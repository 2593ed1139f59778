"""Reading what users bring: a verl launch script or its arguments, a TRL YAML or JSON config; and data sizes.

A verl script is read as a shell would, within reason: backslash continuations are
joined, comments dropped, `VAR=value` and `export VAR=value` lines remembered, and
`$VAR`, `${VAR}` and `${VAR:-default}` expanded outside single quotes from the script's
own assignments, else from this process's environment (each use named in the notes;
one set nowhere is left as written, and noted). The command is the line that runs
`verl.trainer.main_ppo` (after `python3 -m`, `nohup`, env-var prefixes, `ray job submit
--`...); its `key=value` arguments are the options, values read as YAML as Hydra
reads them, a leading `+`/`++` dropped. What follows a `|`, `>`, `&&` or `;` is not
part of the command. Left out: command substitution `$(...)`, loops, functions.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path
from typing import Any

import yaml

VERL_ENTRY = ("verl.trainer.main_ppo", "main_ppo.py")
STOP_TOKENS = ("|", "||", "&&", ";", "&")
_VAR = re.compile(r"\$(?:\{(\w+)(?::?-([^}]*))?\}|(\w+))")
_ASSIGNMENT = re.compile(r"^[A-Za-z_]\w*=")


class SourceError(ValueError):
    """The input cannot be read as a verl command line or a TRL config; the message says what was expected."""


def detect(args: list[str]) -> str:
    """`verl` or `trl`: a .yaml/.yml/.json file is a TRL config; anything else (a script, arguments) is verl's."""
    if len(args) == 1 and Path(args[0]).suffix.lower() in (".yaml", ".yml", ".json"):
        return "trl"
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
        return _read_script(Path(args[0]).read_text(), environ)
    return _options(list(args), [])


def _read_script(text: str, environ: dict[str, str]) -> tuple[dict[str, Any], list[str]]:
    variables: dict[str, str] = {}
    notes: list[str] = []
    joined = re.sub(r"\\\r?\n", " ", text)
    for line in joined.splitlines():
        expanded = _expand(line, variables, environ, notes)
        try:
            tokens = shlex.split(expanded, comments=True)
        except ValueError as exc:
            raise SourceError(f"cannot split this line as a shell would ({exc}): {line.strip()[:120]}") from None
        if not tokens:
            continue
        if any(t.endswith(VERL_ENTRY) for t in tokens):
            return _options(tokens, notes)
        words = tokens[1:] if tokens[0] in ("export", "local", "declare") else tokens
        if words and all(_ASSIGNMENT.match(w) for w in words):
            if tokens[0] == "export":
                notes.append(f"exported {' '.join(words)}: environment, not an option (set it for `cohort train` "
                             "where it still applies)")
            for word in words:
                name, _, value = word.partition("=")
                variables[name] = value
    raise SourceError("no line of the script runs verl's trainer (python3 -m verl.trainer.main_ppo ...)")


def _expand(line: str, variables: dict[str, str], environ: dict[str, str], notes: list[str]) -> str:
    """`$VAR`, `${VAR}`, `${VAR:-default}` replaced outside single quotes (script first, then the environment)."""
    parts = re.split(r"('[^']*')", line)  # odd parts: single-quoted, taken literally
    return "".join(part if i % 2 else _VAR.sub(lambda m: _lookup(m, variables, environ, notes), part)
                   for i, part in enumerate(parts))


def _lookup(match: re.Match, variables: dict[str, str], environ: dict[str, str], notes: list[str]) -> str:
    name = match.group(1) or match.group(3)
    if name in variables:
        return variables[name]
    if name in environ:
        note = f"${name} = {environ[name]} (from this shell's environment)"
        notes += [] if note in notes else [note]
        return environ[name]
    if match.group(2) is not None:
        return _expand(match.group(2), variables, environ, notes)
    note = f"${name} is set neither in the script nor in this environment: left as written; edit the lines that hold it"
    notes += [] if note in notes else [note]
    return match.group(0)


def _options(tokens: list[str], notes: list[str]) -> tuple[dict[str, Any], list[str]]:
    """key=value tokens after the trainer's entry point (all of them when it is not named) as options."""
    starts = [i for i, t in enumerate(tokens) if t.endswith(VERL_ENTRY)]
    prefix = tokens[:starts[0]] if starts else []
    env = [t for t in prefix if _ASSIGNMENT.match(t)]
    if env:
        notes.append(f"environment for the command: {' '.join(env)} (set it the same way for `cohort train` where it "
                     "still applies, e.g. CUDA_VISIBLE_DEVICES)")
    options: dict[str, Any] = {}
    for token in tokens[starts[0] + 1:] if starts else tokens:
        if token in STOP_TOKENS or token.startswith((">", "2>", "1>", "&>")):
            break
        if token in ("$@", "$*"):
            notes.append(f"{token}: the script passes on its own arguments, unknown here; convert them too")
            continue
        if "=" not in token or token.startswith("-"):
            notes.append(f"{token}: not a key=value option of verl's trainer (Hydra's --config-name and the like "
                         "are not read); nothing converted from it")
            continue
        key, _, raw = token.lstrip("+").partition("=")
        options[key] = _value(raw)
    return options, notes


def _value(raw: str) -> Any:
    """A Hydra value: YAML, with `1e-6` a float as Hydra reads it (YAML 1.1 would keep it a string)."""
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

"""Reading the JSON Lines files a run writes (metrics.jsonl, eval.jsonl, completions.jsonl, warnings.jsonl): one
reader for every reader of a run directory (`cohort report`, `cohort compare`, the end of a run, a resume).

What a damaged file gets:
- a torn last line — the process was killed while writing it (the writer flushes one whole line at a time, so only
  the last one can be cut) — is skipped with a `RuntimeWarning` naming the file and line: the run's records up to
  there are all there;
- a line that is not a JSON object anywhere before the last is an error (`RunFileError`) naming the file and the
  line: something other than cohort wrote into the file, and quietly skipping it would hide it.
Blank lines are skipped; a missing file reads as no records.

Left out: writing (cohort/runs/loggers.py `JsonlWriter`), and cutting a file back to a checkpoint's step
(cohort/trainer/checkpoint.py keeps the raw lines it rewrites).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path


class RunFileError(ValueError):
    """A run directory's file that cohort cannot read: names the file and the line."""


def read_jsonl(path: str | Path) -> list[dict]:
    """Every record of a run's JSON Lines file, in order (module docstring: what a torn or bad line gets)."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                warnings.warn(f"{path} line {i + 1}: a torn last line (the run was stopped while writing it) is skipped",
                              RuntimeWarning, stacklevel=2)
                break
            raise RunFileError(f"{path} line {i + 1}: not JSON ({exc.msg}); every line of a run's .jsonl is one JSON "
                               "object, written by cohort: remove or repair that line") from None
        if not isinstance(record, dict):
            raise RunFileError(f"{path} line {i + 1}: a JSON {type(record).__name__}, not an object; every line of a "
                               "run's .jsonl is one JSON object, written by cohort: remove or repair that line")
        records.append(record)
    return records

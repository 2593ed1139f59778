"""RUN_DIR/logs/error.log: where a failure's full traceback goes while the console shows its message in a few lines
(`describe`).

A run's failure (cohort/trainer/failure.py) and a config problem found while validation read the data
(cohort/plan/validate.py: an environment's module that raises on import, a loader's own error) both write here and
name the file in their one line.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

ERROR_LOG = Path("logs") / "error.log"
MAX_MESSAGE_LINES = 4
MAX_LINE_CHARS = 2000  # a line of a failure's message kept whole up to here (`describe`)
KEPT_LINE_END = 600  # of a longer one, this many characters of its start and of its end


def write_error_log(run_dir: Path | str, error: BaseException) -> Path:
    """Append the full traceback (with its causes) to RUN_DIR/logs/error.log; returns the path."""
    path = Path(run_dir) / ERROR_LOG
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.write("".join(traceback.format_exception(error)))
    return path


def describe(error: BaseException) -> str:
    """The error in at most MAX_MESSAGE_LINES lines; cohort's own errors as worded, others with their type. A line is
    kept whole up to MAX_LINE_CHARS (a refusal's fix comes at its end: one cut at 300 characters lost the OpenEnv
    capacity refusal's `max_concurrent_envs`); a longer one (a library's dump) keeps its start and its end."""
    text = str(error).strip() or "(no message)"
    if not type(error).__module__.startswith("cohort."):
        text = f"{type(error).__name__}: {text}"
    lines = [_shortened(line) for line in text.splitlines()]
    return "\n".join(lines[:MAX_MESSAGE_LINES] + (["  ..."] if len(lines) > MAX_MESSAGE_LINES else []))


def _shortened(line: str) -> str:
    """`line` whole when it has at most MAX_LINE_CHARS characters, else its first and last KEPT_LINE_END characters
    around a note of what was left out (the whole text is in the error log)."""
    if len(line) <= MAX_LINE_CHARS:
        return line
    left_out = len(line) - 2 * KEPT_LINE_END
    return f"{line[:KEPT_LINE_END]} ... ({left_out:,} characters left out) ... {line[-KEPT_LINE_END:]}"

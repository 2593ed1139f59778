"""The terminal is for cohort's own lines; what engines and libraries print goes to RUN_DIR/logs/engine.log.

During `cohort train` the console shows the progress bar, the periodic step line,
diagnostics warnings, errors and the final summary. Everything else the process
prints — vLLM's logging, transformers' and tqdm's load bars, Python and torch
warnings, and what C++ code writes straight to file descriptors 1 and 2 (NUMA and
c10 notices) — goes to the engine log. The redirection therefore works on the file
descriptors (dup2), which also catches child processes that inherit them (the
`cohort serve` child of engine.mode=local_server).

- `capture_output(log_path, verbose=False)`: the context that moves fds 1 and 2 into
  the log; with `verbose` a thread copies the same bytes to the terminal as well (a tee).
- `terminal()`: the stream for cohort's own lines: stdout as it was before the
  capture (sys.stdout when no capture is active).

Choices: `sys.stdout`/`sys.stderr` are not replaced. In a normal process they write to
fds 1 and 2 and so land in the log with the rest, and a logging handler that kept a
reference to them (vLLM's does) keeps working after the capture ends. When they are
something else (pytest's capture), cohort's lines go to them and only fd-level output
is moved.
Left out: Ray actors' output (Ray forwards it to the driver itself) and a shared
terminal for torchrun ranks (each rank captures into its own log).
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import threading
from pathlib import Path
from typing import Iterator, TextIO

_terminal: TextIO | None = None  # set while a capture is active: the stream that still reaches the terminal


def terminal() -> TextIO:
    """Where cohort's own console lines go: the pre-capture stdout during a capture, else sys.stdout."""
    return _terminal if _terminal is not None else sys.stdout


def _writes_to_fd(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class _Tee:
    """A pipe whose bytes a daemon thread copies to the log and to the terminal (run.verbose)."""

    def __init__(self, log_fd: int, terminal_fd: int):
        self.read_fd, self.write_fd = os.pipe()
        self.thread = threading.Thread(target=self._copy, args=(log_fd, terminal_fd), name="cohort-tee", daemon=True)
        self.thread.start()

    def _copy(self, log_fd: int, terminal_fd: int) -> None:
        while chunk := os.read(self.read_fd, 65536):
            _write_all(log_fd, chunk)
            with contextlib.suppress(OSError):  # a closed terminal must not stop the log
                _write_all(terminal_fd, chunk)

    def close(self) -> None:
        os.close(self.write_fd)
        self.thread.join(timeout=5)  # EOF once every writer (fds 1 and 2, children) has closed its end
        if not self.thread.is_alive():
            os.close(self.read_fd)


@contextlib.contextmanager
def capture_output(log_path: Path, *, verbose: bool = False) -> Iterator[TextIO]:
    """Send fds 1 and 2 to `log_path` (appending) for the duration; yields `terminal()`.
    Nested captures, and a log that cannot be opened, move nothing."""
    global _terminal
    if _terminal is not None:
        yield _terminal
        return
    try:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:  # an unwritable run directory: nothing is moved, and the trainer's own check reports it
        yield sys.stdout
        return
    _flush_std()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    term = (open(saved[1], "w", buffering=1, encoding=getattr(sys.stdout, "encoding", None) or "utf-8", closefd=False)
            if _writes_to_fd(sys.stdout, 1) else sys.stdout)
    tee = _Tee(log_fd, saved[2]) if verbose else None
    target = tee.write_fd if tee is not None else log_fd
    os.dup2(target, 1)
    os.dup2(target, 2)
    _terminal = term
    try:
        yield term
    finally:
        _flush_std()
        with contextlib.suppress(Exception):
            term.flush()
        os.dup2(saved[1], 1)
        os.dup2(saved[2], 2)
        _terminal = None
        if tee is not None:
            tee.close()
        if term is not sys.stdout:
            with contextlib.suppress(Exception):
                term.close()  # closefd=False: the descriptor is closed below
        for fd in (*saved.values(), log_fd):
            os.close(fd)

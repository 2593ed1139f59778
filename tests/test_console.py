"""The console capture: cohort's lines reach the terminal, everything else printed in the process lands in the log.

Each case runs in a child process, since the capture moves the process's file descriptors 1
and 2. What is printed covers every route third-party output takes: Python's sys.stdout and
sys.stderr, raw writes to the descriptors (as C++ code does), a child process that inherits
them (like the `cohort serve` child), and the warnings module.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent('''
    import os, subprocess, sys, warnings
    from pathlib import Path
    from cohort.console import capture_output, terminal

    print("before", flush=True)
    with capture_output(Path(sys.argv[1]), verbose=sys.argv[2] == "1"):
        print("cohort line", file=terminal(), flush=True)
        print("python stdout", flush=True)
        sys.stderr.write("python stderr\\n")
        os.write(1, b"fd1 raw\\n")
        os.write(2, b"fd2 raw\\n")
        subprocess.run([sys.executable, "-c", "import sys; print('child stdout', flush=True); sys.stderr.write('child stderr')"])
        warnings.warn("a library warning")
    assert terminal() is sys.stdout
    print("after", flush=True)
''')
THIRD_PARTY = ["python stdout", "python stderr", "fd1 raw", "fd2 raw", "child stdout", "child stderr", "UserWarning: a library warning"]


@pytest.mark.parametrize("verbose", [False, True])
def test_only_cohort_lines_reach_the_terminal_and_the_log_gets_the_rest(tmp_path, verbose):
    log = tmp_path / "logs" / "engine.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), "1" if verbose else "0"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "before\ncohort line\nafter\n"
    written = log.read_text()
    assert "cohort line" not in written
    for text in THIRD_PARTY:
        assert text in written
        assert (text in proc.stderr) == verbose  # run.verbose: copied to the terminal (stderr) as well
    if not verbose:
        assert proc.stderr == ""


def test_a_log_that_cannot_be_opened_moves_nothing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(blocker / "logs" / "engine.log"), "0"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("before\ncohort line\npython stdout\nfd1 raw\nchild stdout\n")

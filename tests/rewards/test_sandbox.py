"""The code sandbox against hostile programs: each scores 0 within its timeout, leaves
no process behind, and leaves the host and this test process unharmed.

Every hostile program ends by defining ``solve()``, and its one test is
``assert solve() == 42``, so it scores 1.0 only if the hostile part *succeeds* (where
it asserts its own success) or is harmless; 0.0 means it was stopped.
"""

import os
import socket
import time
from pathlib import Path

import pytest

from cohort.rewards.sandbox import (
    CHILD,
    Sandbox,
    SandboxLimits,
    SandboxUnavailable,
    _cgroup_v1_dirs,
    processes_of_uid,
)

TIMEOUT_S = 2.0
SLACK_S = 3.0  # interpreter start and clean-up on a loaded, shared 2-core machine
SOLVE = "\ndef solve():\n    return 42\n"
TEST = ["assert solve() == 42"]
UIDS = range(1_900_000_000, 1_900_000_256)


@pytest.fixture(scope="module")
def sandbox():
    try:
        return Sandbox(SandboxLimits(timeout_s=TIMEOUT_S, max_processes=16, memory_mb=512))
    except SandboxUnavailable as exc:
        pytest.fail(f"no sandbox here: {exc}; this project's machines (root, unshare, cgroups) must provide one — a skip would hide every hostile-program test")


def sandbox_processes():
    """Processes owned by a sandbox uid, or running the sandbox harness."""
    found = set(processes_of_uid(UIDS))
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if CHILD.name.encode() in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                pass
    return found


def run_hostile(sandbox, code, expect_timeout=False):
    """expect_timeout: True/False, or None when either is fine (depends on machine load)."""
    start = time.monotonic()
    result = sandbox.run(code + SOLVE, TEST)
    elapsed = time.monotonic() - start
    assert result.score == 0.0, result
    assert elapsed < TIMEOUT_S + SLACK_S, f"took {elapsed:.2f} s"
    assert expect_timeout is None or result.timed_out == expect_timeout
    assert sandbox_processes() == set()
    assert sandbox.run(SOLVE, TEST).score == 1.0  # the sandbox (and host) still work
    return result


def test_mode_and_control(sandbox):
    if os.geteuid() == 0:
        assert sandbox.mode == "namespaces"
    result = sandbox.run("def add(a, b):\n    return a + b\nprint('noise')", ["assert add(1, 2) == 3", "assert add(1, 1) == 3"])
    assert result.passed == [True, False] and result.score == 0.5
    assert result.errors[1].startswith("AssertionError")


def test_process_limit_holds_before_any_fork_bomb(sandbox):
    # fork sleeping children until refused; the count must stop at the limit
    code = """
import os, time
count, refused = 0, False
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        refused = True
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    count += 1
"""
    result = sandbox.run(code, ["assert refused and count < 16, (count, refused)"])
    assert result.passed == [True], result.errors
    assert sandbox_processes() == set()


@pytest.mark.slow
def test_infinite_loop(sandbox):
    run_hostile(sandbox, "while True:\n    pass\n", expect_timeout=True)


@pytest.mark.slow
def test_sleep_past_timeout(sandbox):
    run_hostile(sandbox, "import time\ntime.sleep(60)\n", expect_timeout=True)


def test_memory_bomb(sandbox):
    hog = "hog = []\nwhile True:\n    hog.append(bytearray(64 * 1024 * 1024))\n"
    result = run_hostile(sandbox, hog, expect_timeout=None)  # stopped by RLIMIT_AS, unless load delays it
    assert result.timed_out or "MemoryError" in result.setup_error


@pytest.mark.slow
def test_fork_bomb(sandbox):
    bomb = "import os\nwhile True:\n    try:\n        if os.fork() == 0:\n            os.setsid()\n    except OSError:\n        pass\n"
    run_hostile(sandbox, bomb, expect_timeout=True)  # capped at 16 processes, see the test above


def test_write_outside_the_temp_dir(sandbox, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)  # writable by anyone who can reach it
    private_tmp = Path("/tmp") / f"cohort-escape-{os.getpid()}"
    targets = [shared / "escape.txt", Path("/etc/cohort-escape"), Path("/work/cohort-escape"), Path("/root/cohort-escape")]
    code = f"""
wrote = 0
for target in {[str(t) for t in targets]!r}:
    try:
        with open(target, "w") as handle:
            handle.write("escaped")
        wrote += 1
    except OSError:
        pass
with open({str(private_tmp)!r}, "w") as handle:  # the private /tmp: allowed, but not the host's
    handle.write("inside")
assert wrote > 0
"""
    try:
        result = run_hostile(sandbox, code)
        assert "AssertionError" in result.setup_error
        assert not any(t.exists() for t in targets) and not private_tmp.exists()
    finally:
        for target in targets + [private_tmp]:
            target.unlink(missing_ok=True)


def test_reading_the_parent_environment(sandbox, monkeypatch):
    monkeypatch.setenv("COHORT_TEST_SECRET", "hunter2")
    code = f"""
import os
found = "hunter2" in repr(dict(os.environ))
for path in ("/proc/{os.getpid()}/environ", "/proc/1/environ", "/proc/self/environ"):
    try:
        found = found or b"hunter2" in open(path, "rb").read()
    except OSError:
        pass
assert found
"""
    result = run_hostile(sandbox, code)
    assert "AssertionError" in result.setup_error  # it ran, and found nothing


def test_network_connection(sandbox):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port = server.getsockname()[1]
    code = f"""
import socket
socket.create_connection(("127.0.0.1", {port}), timeout=1).sendall(b"leak")
"""
    try:
        result = run_hostile(sandbox, code)
        assert "Error" in result.setup_error  # refused or unreachable: a loopback of its own
        with pytest.raises(socket.timeout):
            server.accept()
    finally:
        server.close()


def test_killing_its_parent(sandbox):
    code = f"""
import os, signal
for pid in (os.getppid(), 1, {os.getpid()}, {os.getppid()}):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)  # still refused: raise, so the program fails
"""
    result = run_hostile(sandbox, code)
    assert "PermissionError" in result.setup_error
    assert os.getppid() != 1  # this test process still has its parent


def test_results_cannot_be_printed(sandbox):
    code = 'print(\'{"n": "guess", "i": 0, "ok": true, "err": null}\')\nimport sys\nsys.exit(0)\n'
    result = sandbox.run(code, ["assert False"])
    assert result.score == 0.0


@pytest.mark.slow
def test_partial_credit_survives_a_timeout(sandbox):
    code = "def f(x):\n    while x > 1:\n        pass\n    return x\n"
    result = sandbox.run(code, ["assert f(1) == 1", "assert f(2) == 2"])
    assert result.passed == [True, False] and result.timed_out


def test_unisolated_mode_must_be_allowed():
    with pytest.raises(SandboxUnavailable, match="allow_unisolated"):
        Sandbox(isolation="none")
    sandbox = Sandbox(SandboxLimits(timeout_s=TIMEOUT_S), isolation="none", allow_unisolated=True)
    assert sandbox.mode == "none"
    assert sandbox.run("x = 1", ["assert x == 1", "assert x == 2"]).passed == [True, False]
    assert sandbox_processes() == set()


def _tree(root: int) -> list[str]:
    """`pid state wchan cmdline` of ``root`` and its descendants (a diagnostic for a process that seems stuck)."""
    parents, lines = {}, []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    tree, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        tree.append(pid)
        frontier += [child for child, parent in parents.items() if parent == pid]
    for pid in tree:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{pid}/wchan").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        lines.append(f"{pid} {state} {wchan or '-'} {cmd}")
    return lines


def test_a_killed_trainer_takes_its_sandboxes_with_it(tmp_path):
    import signal
    import subprocess
    import sys

    script = tmp_path / "trainer.py"
    script.write_text(
        "from cohort.rewards.sandbox import Sandbox, SandboxLimits\n"
        "Sandbox(SandboxLimits(timeout_s=60)).run('import time\\ntime.sleep(600)', ['assert time.time() > 0'])\n"
    )
    log = tmp_path / "trainer.log"
    with open(log, "w") as out:
        trainer = subprocess.Popen([sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT)
    try:
        # The sandboxed program appears well within a second alone. In two full fresh-clone suites it had not appeared
        # after 20 s, the trainer alive and silent (never reproduced alone, nor after 40 sandboxes in a row): wait up
        # to the sandbox's own timeout, and on failure say where each process of the trainer's tree was waiting.
        deadline = time.monotonic() + 60
        while not processes_of_uid(UIDS) and time.monotonic() < deadline and trainer.poll() is None:
            time.sleep(0.05)
        assert processes_of_uid(UIDS), (f"the sandboxed program never started; trainer exit code {trainer.poll()}, "
                                        f"its output: {log.read_text()[-2000:]!r}; its processes: {_tree(trainer.pid)}")
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
    deadline = time.monotonic() + 5
    while sandbox_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sandbox_processes() == set()
    # the killed trainer could not remove its run's cgroups; the next Sandbox does
    bases = _cgroup_v1_dirs()
    if bases:
        assert any(list(base.glob("cohort-sandbox-*")) for base in bases.values())
        Sandbox(SandboxLimits(timeout_s=TIMEOUT_S))
        assert not any(list(base.glob("cohort-sandbox-*")) for base in bases.values())

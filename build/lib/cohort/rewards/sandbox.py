"""Run untrusted Python (a model's completion) against tests, contained.

    sandbox = Sandbox(SandboxLimits(timeout_s=5))
    result = sandbox.run(code, tests=["assert add(1, 2) == 3"])
    result.score  # fraction of tests passed

Each execution is a fresh ``python -I`` process (``_sandbox_child.py``) started with
an **empty environment** in a **new session** (its own process group), that gets:

- isolation, by mode (``isolation="auto"`` picks the first that works):
  * ``"namespaces"`` (root): new network namespace (only a down loopback: no
    network), new mount namespace with private tmpfs over /tmp, /var/tmp, /dev/shm
    and /run/lock (the work dir is /tmp/work inside it, so a fresh directory that
    vanishes with the process), new pid namespace with its own /proc (host processes
    invisible; when the run ends the kernel kills everything left in it). The code
    runs as an unprivileged uid reserved for this run (``uid_base + slot``; slots
    are taken with file locks, so concurrent runs, even from other processes, never
    share a uid), with no groups and ``no_new_privs`` (setuid binaries stay inert).
  * ``"bwrap"`` (bubblewrap on PATH, typically not root): ``--unshare-net
    --unshare-pid --die-with-parent --new-session``, the root file system read-only,
    a private /tmp; runs as the invoking user.
  * ``"none"``: only what follows (limits, environment, session, temp dir); the
    network is **not** isolated, so it is refused unless ``allow_unisolated=True``.
- limits (``resource.setrlimit`` in the child): CPU seconds, address space, open
  files, file size, core dumps off, and processes (RLIMIT_NPROC, per uid, which is
  why the code must not run as root: root ignores it). When cgroup v1 ``pids`` and
  ``memory`` hierarchies are writable, a per-run cgroup also caps the *total*
  processes and memory of the run.
- a wall-clock timeout enforced by the parent; afterwards, always, the run's
  process group is killed, then every process left in its cgroup, then every
  process still owned by its uid (found by scanning /proc), until none remain;
- death with the parent (``PR_SET_PDEATHSIG``) at every level, so a trainer killed
  mid-run leaves nothing running (its empty cgroups are removed by the next Sandbox).

What it does not protect against: see docs/rewards.md ("Sandbox"). In short: the
code can read world-readable files; it can use all the CPU time and memory it is
allowed; kernel exploits; and it shares its process with the test harness, so a
deliberately adversarial program can forge its own test results (it cannot affect
other runs or the host).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

CHILD = Path(__file__).with_name("_sandbox_child.py")
MiB = 1024 * 1024
ISOLATION_MODES = ("auto", "namespaces", "bwrap", "none")


class SandboxUnavailable(RuntimeError):
    """No isolation mode that was asked for (or allowed) works on this machine."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0  # wall clock for one execution, start to finish
    cpu_s: float | None = None  # RLIMIT_CPU per process; None: ceil(timeout_s)
    memory_mb: int = 1024  # RLIMIT_AS per process, and the run's memory cgroup
    max_processes: int = 32  # RLIMIT_NPROC for the run's uid, and its pids cgroup
    file_size_mb: int = 16  # RLIMIT_FSIZE
    tmpfs_mb: int = 64  # size of each private tmpfs (namespaces mode)
    open_files: int = 256  # RLIMIT_NOFILE
    output_kb: int = 256  # at most this much of the results channel is read


@dataclass
class ExecutionResult:
    """What one execution did. ``score`` is the fraction of tests passed."""

    passed: list[bool]  # one per test
    errors: list[str | None]  # one per test; None when it passed
    setup_error: str | None = None  # the code (or set-up) itself failed
    timed_out: bool = False
    exit_code: int | None = None
    wall_s: float = 0.0
    leftovers_killed: int = 0  # processes found and killed after the run
    sandbox_error: str | None = None  # the sandbox itself failed (not the code)

    @property
    def score(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


# -- uid slots: one unprivileged uid per concurrent run ------------------------------


class _UidSlot:
    """Holds ``uid_base + k`` exclusively (an flock on a per-slot file) while a run uses it."""

    LOCK_DIR = Path(tempfile.gettempdir()) / "cohort-sandbox-slots"

    def __init__(self, uid_base: int, slots: int, wait_s: float):
        deadline = time.monotonic() + wait_s
        start = random.randrange(slots)
        while True:
            for k in range(slots):
                handle = self.try_lock(uid_base + (start + k) % slots)
                if handle is not None:
                    self.uid, self._handle = uid_base + (start + k) % slots, handle
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"all {slots} sandbox uid slots stayed busy for {wait_s:g} s")
            time.sleep(0.01)

    @classmethod
    def try_lock(cls, uid: int):
        """The open, locked slot file for ``uid``, or None when someone holds it."""
        cls.LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
        handle = open(cls.LOCK_DIR / f"slot-{uid}.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        return handle

    def release(self) -> None:
        self._handle.close()  # closing drops the flock


# -- cgroups (v1) --------------------------------------------------------------------


def _cgroup_v1_dirs() -> dict[str, Path]:
    """Writable v1 hierarchy dirs for ``pids`` and ``memory``, at this process's own cgroup."""
    found: dict[str, Path] = {}
    try:
        own = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                own[controller] = path
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split(" - ")
            if len(fields) != 2 or not fields[1].startswith("cgroup "):
                continue
            mount_point = Path(fields[0].split()[4])
            options = set(fields[1].split()[2].split(","))
            for controller in ("pids", "memory"):
                if controller in options and controller in own:
                    directory = mount_point / own[controller].lstrip("/")
                    if os.access(directory, os.W_OK):
                        found[controller] = directory
    except (OSError, ValueError, IndexError):
        return {}
    return found


class _RunCgroups:
    """Per-run cgroups that cap total processes and memory; empty when unavailable."""

    def __init__(self, bases: dict[str, Path], uid: int, limits: SandboxLimits):
        self.dirs: list[Path] = []
        settings = {
            "pids": {"pids.max": limits.max_processes + 2},  # + the harness and its init
            "memory": {"memory.limit_in_bytes": (limits.memory_mb + limits.tmpfs_mb + 64) * MiB},
        }
        for controller, base in bases.items():
            directory = base / f"cohort-sandbox-{uid}"
            try:
                directory.mkdir(exist_ok=True)
                for name, value in settings[controller].items():
                    (directory / name).write_text(str(value))
            except OSError:
                continue
            self.dirs.append(directory)

    def pids(self) -> list[int]:
        found = []
        for directory in self.dirs:
            try:
                found += [int(p) for p in (directory / "cgroup.procs").read_text().split()]
            except OSError:
                pass
        return found

    def remove(self) -> None:
        for directory in self.dirs:
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # processes still exiting


def remove_stale_cgroups(bases: dict[str, Path]) -> None:
    """Remove empty per-run cgroups whose slot is free (left by a trainer that was killed)."""
    for base in bases.values():
        for directory in base.glob("cohort-sandbox-*"):
            uid = directory.name.rsplit("-", 1)[-1]
            handle = _UidSlot.try_lock(int(uid)) if uid.isdigit() else None
            if handle is None:
                continue
            try:
                if not (directory / "cgroup.procs").read_text().split():
                    directory.rmdir()
            except OSError:
                pass
            finally:
                handle.close()


# -- finding and killing leftovers -----------------------------------------------------


def processes_of_uid(uids: range | set[int]) -> list[int]:
    """Live (not zombie) pids whose real, effective or saved uid is in ``uids``."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as status:
                fields = dict(line.split(":", 1) for line in status if line.startswith(("State:", "Uid:")))
        except (OSError, ValueError):
            continue
        if fields.get("State", "").split()[:1] == ["Z"] or "Uid" not in fields:
            continue  # a zombie is dead already; its parent reaps it
        if any(int(u) in uids for u in fields["Uid"].split()[:3]):
            found.append(int(entry.name))
    return found


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` exited, *without* reaping it: while it is a zombie its
    pid (the run's process-group id) cannot be reused, so killing the group stays safe."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _sweep(process: subprocess.Popen, cgroups: _RunCgroups | None, uid: int | None, deadline_s: float = 5.0) -> int:
    """Kill the run's process group (the harness is not reaped yet, so its pid, the
    group's id, cannot have been reused), reap the harness, then kill what is left in
    the run's cgroup or owned by its uid until none remain; return how many were left."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        process.kill()
    killed = 0
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        left = set(cgroups.pids() if cgroups else [])
        if uid is not None:
            left.update(processes_of_uid({uid}))
        left.discard(os.getpid())
        if not left:
            return killed
        killed += len(left)
        _kill_all(sorted(left))
        time.sleep(0.005)
    return killed


# -- choosing the interpreter and the isolation mode ------------------------------------


def _readable_by_others(path: Path) -> bool:
    """Every directory above ``path`` is searchable by others, and ``path`` readable."""
    try:
        path = path.resolve()
        for parent in path.parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                return False
        return bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


def default_python() -> str:
    """An interpreter an unprivileged uid can run, stdlib included (when we are root)."""
    if os.geteuid() != 0:
        return sys.executable
    import sysconfig

    if _readable_by_others(Path(sys.executable)) and _readable_by_others(Path(sysconfig.get_paths()["stdlib"])):
        return sys.executable
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and _readable_by_others(Path(candidate)):
            return candidate
    return sys.executable


_probe_lock = threading.Lock()
_probe_cache: dict[tuple[str, str], str | None] = {}


class Sandbox:
    """Runs code against tests, one fresh contained process per ``run`` (thread-safe)."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        isolation: str = "auto",
        python: str | None = None,
        allow_unisolated: bool = False,
        uid_base: int = 1_900_000_000,
        uid_slots: int = 256,
    ):
        if isolation not in ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {isolation!r}")
        self.limits = limits or SandboxLimits()
        self.python = python or default_python()
        self.uid_base = uid_base
        self.uid_slots = uid_slots
        self._cgroup_bases = _cgroup_v1_dirs() if os.geteuid() == 0 else {}
        remove_stale_cgroups(self._cgroup_bases)
        self.mode = self._choose_mode(isolation, allow_unisolated)

    def _choose_mode(self, isolation: str, allow_unisolated: bool) -> str:
        candidates = ["namespaces", "bwrap"] if isolation == "auto" else [isolation]
        reasons = []
        for mode in candidates:
            if mode == "none":
                break
            problem = self._probe(mode)
            if problem is None:
                return mode
            reasons.append(f"{mode}: {problem}")
        if isolation in ("auto", "none") and allow_unisolated:
            return "none"
        raise SandboxUnavailable(
            "no sandbox isolation works here (" + "; ".join(reasons or ["none requested"]) + "). "
            "Run as root (network, mount and pid namespaces, a throwaway uid), or install "
            "bubblewrap (bwrap); or pass allow_unisolated=True to run code WITHOUT network "
            "isolation (only rlimits, an empty environment and a timeout)."
        )

    def _probe(self, mode: str) -> str | None:
        """None when ``mode`` can run a trivial program here; else why not (cached)."""
        if mode == "namespaces" and os.geteuid() != 0:
            return "needs root"
        if mode == "bwrap" and shutil.which("bwrap") is None:
            return "bwrap is not installed"
        key = (mode, self.python)
        with _probe_lock:
            if key not in _probe_cache:
                probe = self._execute(mode, "import collections, json, math, re", ["assert math.sqrt(4) == 2"], "")
                ok = probe.passed == [True]
                _probe_cache[key] = None if ok else (probe.sandbox_error or probe.setup_error or "probe failed")
            return _probe_cache[key]

    # -- one execution -----------------------------------------------------------------

    def run(self, code: str, tests: list[str], setup: str = "") -> ExecutionResult:
        """Exec ``code``, then ``setup``, then each test; a test passes if it raises nothing."""
        return self._execute(self.mode, code, list(tests), setup)

    def _execute(self, mode: str, code: str, tests: list[str], setup: str) -> ExecutionResult:
        limits = self.limits
        slot = _UidSlot(self.uid_base, self.uid_slots, wait_s=max(30.0, limits.timeout_s)) if os.geteuid() == 0 else None
        uid = slot.uid if slot else None
        cgroups = _RunCgroups(self._cgroup_bases, uid, limits) if (slot and mode == "namespaces") else None
        host_dir = None if mode == "namespaces" else tempfile.mkdtemp(prefix="cohort-sandbox-")
        try:
            if host_dir and uid is not None:
                os.chown(host_dir, uid, uid)
            job = self._job(mode, code, tests, setup, uid, cgroups, host_dir)
            return self._spawn_and_collect(mode, job, cgroups, uid, host_dir)
        finally:
            if cgroups:
                cgroups.remove()
            if host_dir:
                shutil.rmtree(host_dir, ignore_errors=True)
            if slot:
                slot.release()

    def _job(self, mode, code, tests, setup, uid, cgroups, host_dir) -> dict:
        limits = self.limits
        cpu_s = limits.cpu_s if limits.cpu_s is not None else limits.timeout_s
        return {
            "mode": "namespaces" if mode == "namespaces" else "plain",
            "nonce": secrets.token_hex(16),
            "parent_pid": None if mode == "bwrap" else os.getpid(),
            "code": code,
            "setup": setup,
            "tests": tests,
            "uid": uid,
            "gid": uid,
            "cgroups": [str(d) for d in cgroups.dirs] if cgroups else [],
            "workdir": "/tmp/work" if mode == "namespaces" else (host_dir if mode == "none" else "/tmp"),
            "tmpfs_bytes": limits.tmpfs_mb * MiB,
            "limits": {
                "cpu_s": max(1, math.ceil(cpu_s)),
                "memory_bytes": limits.memory_mb * MiB,
                "file_bytes": limits.file_size_mb * MiB,
                "open_files": limits.open_files,
                "processes": limits.max_processes,
            },
        }

    def _command(self, mode: str, host_dir: str | None) -> list[str]:
        command = [self.python, "-I", str(CHILD)]
        if mode != "bwrap":
            return command
        return [
            "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-net", "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--new-session",
            "--chdir", "/tmp", *command,
        ]  # fmt: skip

    def _spawn_and_collect(self, mode, job, cgroups, uid, host_dir) -> ExecutionResult:
        start = time.monotonic()
        process = subprocess.Popen(
            self._command(mode, host_dir),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={},
            cwd=host_dir or "/",
            start_new_session=True,
            close_fds=True,
        )
        try:
            try:
                process.stdin.write(json.dumps(job).encode())
                process.stdin.close()
            except BrokenPipeError:
                pass
            raw, timed_out = _read_until_exit(process, start + self.limits.timeout_s, self.limits.output_kb * 1024)
        finally:
            killed = _sweep(process, cgroups, uid)
            process.stdout.close()
            exit_code = process.wait()
        result = _parse_results(raw, job["nonce"], len(job["tests"]))
        result.timed_out, result.exit_code = timed_out, exit_code
        result.wall_s, result.leftovers_killed = time.monotonic() - start, killed
        return result


def _read_until_exit(process: subprocess.Popen, deadline: float, cap_bytes: int) -> tuple[bytes, bool]:
    """Read the results pipe until EOF, the harness's exit, or the deadline."""
    fd = process.stdout.fileno()
    os.set_blocking(fd, False)
    data = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(data), True
        ready, _, _ = select.select([fd], [], [], min(remaining, 0.05))
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                return bytes(data), False
            data += chunk[: max(0, cap_bytes - len(data))]
        elif _has_exited(process.pid):
            return bytes(data), False  # the harness is gone; stragglers may hold the pipe


def _parse_results(raw: bytes, nonce: str, n_tests: int) -> ExecutionResult:
    passed = [False] * n_tests
    errors: list[str | None] = ["no result (timed out or crashed)"] * n_tests
    result = ExecutionResult(passed, errors)
    seen = set()
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
            index, ok, error = record["i"], record["ok"], record["err"]
        except (ValueError, KeyError, TypeError):
            continue
        if record.get("n") != nonce or not isinstance(index, int):
            continue
        if index == -1 and result.setup_error is None:
            result.setup_error = str(error)
        elif index == -2 and result.sandbox_error is None:
            result.sandbox_error = str(error)
        elif 0 <= index < n_tests and index not in seen:
            seen.add(index)
            passed[index] = ok is True
            errors[index] = None if ok is True else str(error)
    if result.setup_error:
        result.errors = [result.setup_error] * n_tests
    return result

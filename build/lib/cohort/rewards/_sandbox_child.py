"""The process that runs untrusted code for ``cohort.rewards.sandbox`` (stdlib only).

Started as ``python -I _sandbox_child.py`` with an empty environment, in a new
session, as root or as the invoking user. It reads one JSON job from stdin and
writes one JSON line per finished test to stdout (each tagged with the job's nonce).

In "namespaces" mode (root), it isolates itself before any untrusted byte runs:

    outer (host pid namespace)          joins the job's cgroups, unshares mount,
      │                                 network and pid namespaces, mounts private
      │                                 tmpfs over /tmp, /var/tmp, /dev/shm, /run/lock
      └─ init (pid 1 of the new ns)     mounts a fresh /proc, makes /tmp/work
           └─ worker                    drops to the job's uid/gid (no groups, no new
                                        privileges), sets rlimits, runs the code

When the worker exits, init exits, and the kernel kills everything left in the pid
namespace. Each of the three dies with its parent (``PR_SET_PDEATHSIG``), so a trainer
killed mid-run takes its sandboxes with it. In "plain" mode (bubblewrap already isolated us, or no isolation is
available) the same worker runs directly, without the namespace steps.

Deliberately plain: no cohort imports (the interpreter may not be the trainer's),
and the test results are written through a descriptor the worker duplicated before
pointing stdout/stderr at /dev/null, so ordinary prints cannot forge them.
"""

import builtins
import ctypes
import json
import os
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
PRIVATE_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")

_libc = ctypes.CDLL(None, use_errno=True)
_write = os.write
_dumps = json.dumps


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source, target, fstype, flags, data):
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(_libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)), f"mount {target}")


def _report(fd, nonce, index, ok, error=None):
    line = _dumps({"n": nonce, "i": index, "ok": ok, "err": error}) + "\n"
    try:
        _write(fd, line.encode())
    except OSError:
        pass


def _join_cgroups(paths):
    for path in paths:
        with open(os.path.join(path, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))


def _isolate(job):
    """Outer process: new mount, network and pid namespaces; private writable dirs."""
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID), "unshare")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    size = int(job["tmpfs_bytes"])
    for directory in PRIVATE_DIRS:
        if os.path.isdir(directory) and not os.path.islink(directory):
            _mount("tmpfs", directory, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")


def _limit(job):
    limits = job["limits"]
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"],) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limits["open_files"],) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["processes"],) * 2)


def _drop_privileges(job):
    uid, gid = job.get("uid"), job.get("gid")
    if uid is None or os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getgroups():
        raise OSError("could not drop privileges")


def _run_tests(job, fd):
    """Exec the code, the set-up, then each test; report each test as it finishes."""
    nonce = job["nonce"]
    namespace = {"__name__": "__sandbox__", "__builtins__": builtins}
    for label, source in (("code", job["code"]), ("setup", job["setup"])):
        try:
            exec(compile(source, f"<{label}>", "exec"), namespace)
        except BaseException as exc:  # noqa: BLE001 - SystemExit included: the program failed
            _report(fd, nonce, -1, False, f"{label}: {type(exc).__name__}: {exc}"[:300])
            return
    for index, test in enumerate(job["tests"]):
        try:
            exec(compile(test, f"<test {index}>", "exec"), namespace)
            _report(fd, nonce, index, True)
        except BaseException as exc:  # noqa: BLE001
            _report(fd, nonce, index, False, f"{type(exc).__name__}: {exc}"[:300])


def _worker(job, result_fd):
    """Last trusted steps, then the untrusted code. Never returns."""
    status = 0
    try:
        os.chdir(job["workdir"])
        _limit(job)
        _drop_privileges(job)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _die_with_parent()  # again: the uid change cleared it
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        _run_tests(job, result_fd)
    except BaseException as exc:  # noqa: BLE001
        _report(result_fd, job["nonce"], -2, False, f"sandbox: {type(exc).__name__}: {exc}"[:300])
        status = 1
    os._exit(status)


def _die_with_parent():
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")


def _init(job, result_fd):
    """pid 1 of the new namespace: fresh /proc, the work dir, then wait for the worker."""
    try:
        _die_with_parent()
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
        os.makedirs(job["workdir"], mode=0o700)
        if job.get("uid") is not None:
            os.chown(job["workdir"], job["uid"], job["gid"])
    except OSError as exc:
        _report(result_fd, job["nonce"], -2, False, f"sandbox: {exc}"[:300])
        os._exit(1)
    worker = os.fork()
    if worker == 0:
        _worker(job, result_fd)
    while True:  # reap orphans until the worker itself is done
        pid, status = os.wait()
        if pid == worker:
            os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def main():
    job = json.loads(sys.stdin.buffer.read())
    result_fd = os.dup(1)
    try:
        _die_with_parent()
        if job.get("parent_pid") is not None and os.getppid() != job["parent_pid"]:
            return 4  # the parent died before we could tie ourselves to it
        _join_cgroups(job.get("cgroups", []))
        if job["mode"] != "namespaces":
            _worker(job, result_fd)
        _isolate(job)
    except OSError as exc:
        _report(result_fd, job["nonce"], -2, False, f"sandbox: {exc}"[:300])
        return 3
    init = os.fork()
    if init == 0:
        _init(job, result_fd)
    _, status = os.waitpid(init, 0)
    return os.waitstatus_to_exitcode(status) & 0xFF


if __name__ == "__main__":
    sys.exit(main())

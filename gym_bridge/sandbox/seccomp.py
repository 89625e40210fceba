"""The seccomp filter of every sandboxed run: refuse the few system calls that outlive a run or hide CPU.

Namespaces and rlimits leave three holes that no mount or limit closes:

* **SysV IPC and POSIX message queues** live in the IPC namespace, not in a process: a segment made by
  ``shmget`` and detached again counts against no process's address space, survives every process of a
  test and is seen by the next test of the same sandbox (which shares the namespace);
* **the kernel keyrings**: a user keyring belongs to a uid (the slot's uid when the server is root, reused
  by later tasks) and the session keyring is inherited from the server, so ``add_key`` carries data from
  one task to another and leaves it on the host;
* **auto-reaped children**: a process that ignores ``SIGCHLD`` (or sets ``SA_NOCLDWAIT``) has its
  children released by the kernel the moment they exit, and their CPU time is then added to nobody's
  ``cutime`` -- no sampler can charge it. Refusing to change ``SIGCHLD``'s disposition keeps every exited
  process a zombie until a waiting parent (or the harness, their subreaper) collects its times;
* **namespaces and mounts of the program's own**: an unprivileged user namespace gives its creator
  ``CAP_SYS_ADMIN`` over a new mount namespace, where it can mount a tmpfs of half the host's memory and
  fill it with files that count against no limit (``memory_mb``, ``tmp_size`` and the file-size cap all
  miss them). ``unshare``/``clone`` with any ``CLONE_NEW*`` flag, ``setns`` and every mount call are
  refused; ``clone3`` (whose flags a filter cannot read) answers ``ENOSYS``, so the C library falls back
  to ``clone`` for threads and ``posix_spawn``.

These calls return ``EPERM``; every other call is allowed. Calls from another ABI (32-bit ``int 0x80``,
x32) kill the process, so the filter cannot be sidestepped through a second system call table. The
filter is compiled by libseccomp (through ``pyseccomp``) on the host once; bubblewrap applies it
(``--seccomp``), and the unshare fallback applies it with :mod:`gym_bridge.sandbox.seccomp_exec`.
"""

from __future__ import annotations

import errno
import os
import platform
import signal
import tempfile
from pathlib import Path

__all__ = ["REFUSED_SYSCALLS", "SeccompUnavailable", "compile_filter", "pipe_with", "LOADER"]

REFUSED_SYSCALLS = {
    "keyrings": ["add_key", "request_key", "keyctl"],
    "SysV IPC": [
        "shmget", "shmat", "shmctl", "shmdt",
        "msgget", "msgsnd", "msgrcv", "msgctl",
        "semget", "semop", "semtimedop", "semctl",
    ],
    "POSIX message queues": [
        "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
    ],
    "namespaces and mounts": [
        "setns", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick",
        "move_mount", "open_tree", "mount_setattr",
    ],
}  # fmt: skip
"""Refused outright (``EPERM``). Besides these, ``rt_sigaction(SIGCHLD, <new action>)`` and
``unshare``/``clone`` with a namespace flag are refused, and ``clone3`` answers ``ENOSYS``."""

NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,  # unshare only: in clone's flags these bits are the exit signal
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}

LOADER = Path(__file__).with_name("seccomp_exec.py")
"""Applies a compiled filter read from a descriptor, then execs the command (the unshare fallback)."""


class SeccompUnavailable(RuntimeError):
    """libseccomp (or its ``pyseccomp`` binding) is missing, or the filter did not compile."""


def compile_filter() -> bytes:
    """The filter as classic BPF for this machine's native architecture."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, AttributeError) as e:  # the binding loads libseccomp.so.2 on import
        raise SeccompUnavailable(
            f"cannot load libseccomp ({e}); install it (Debian/Ubuntu: libseccomp2) and pyseccomp"
        ) from e
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
        refused = sc.ERRNO(errno.EPERM)
        for names in REFUSED_SYSCALLS.values():
            for name in names:
                try:
                    f.add_rule(refused, name)
                except OSError as e:  # a call this architecture does not have
                    if e.errno not in (errno.EDOM, errno.EINVAL, errno.EFAULT):
                        raise
        f.add_rule(refused, "rt_sigaction", sc.Arg(0, sc.EQ, int(signal.SIGCHLD)), sc.Arg(1, sc.NE, 0))
        clone_flags = 1 if platform.machine().startswith("s390") else 0  # s390 passes the stack first
        for name, flag in NAMESPACE_FLAGS.items():
            f.add_rule(refused, "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
            if name != "CLONE_NEWTIME":
                f.add_rule(refused, "clone", sc.Arg(clone_flags, sc.MASKED_EQ, flag, flag))
        try:
            f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
        except OSError as e:  # a libseccomp that does not know clone3
            if e.errno not in (errno.EDOM, errno.EINVAL, errno.EFAULT):
                raise
        with tempfile.TemporaryFile() as out:
            f.export_bpf(out)
            out.seek(0)
            program = out.read()
    except OSError as e:
        raise SeccompUnavailable(f"the seccomp filter did not compile: {e}") from e
    if not program or len(program) % 8:
        raise SeccompUnavailable(f"libseccomp exported a filter of {len(program)} bytes")
    return program


def pipe_with(data: bytes) -> int:
    """A pipe's read end holding ``data`` (then end of file): one fresh descriptor per sandbox start."""
    if len(data) > 65536:  # more than a pipe buffer would block the writer; filters are ~1 KB
        raise ValueError(f"seccomp filter of {len(data)} bytes is too large for a pipe")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end

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
  process a zombie until a waiting parent (or the harness, their subreaper) collects its times.

These calls return ``EPERM``; every other call is allowed. Calls from another ABI (32-bit ``int 0x80``,
x32) kill the process, so the filter cannot be sidestepped through a second system call table. The
filter is compiled by libseccomp (through ``pyseccomp``) on the host once; bubblewrap applies it
(``--seccomp``), and the unshare fallback applies it with :mod:`gym_bridge.sandbox.seccomp_exec`.
"""

from __future__ import annotations

import errno
import os
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
}  # fmt: skip
"""Refused outright (``EPERM``). Besides these, ``rt_sigaction(SIGCHLD, <new action>)`` is refused."""

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

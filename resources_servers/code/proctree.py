"""A test's whole process tree, accounted and killed as a unit (runs inside the sandbox; stdlib only).

Without cgroups, per-process limits (RLIMIT_CPU) let a program escape its CPU budget by spreading work
over children, and a child that calls ``setsid()`` leaves the test's process group. This module closes
both gaps from inside the sandbox's private PID namespace:

* the harness is made a *child subreaper* (``PR_SET_CHILD_SUBREAPER``), so every orphan a test leaves
  (double forks and ``setsid()`` included) is re-parented to the harness, never to anything outside;
* the only processes in the namespace besides the harness (and bubblewrap's init, PID 1) belong to the
  test running now, so the tree's CPU is the sum of ``utime + stime + cutime + cstime`` over every other
  PID in ``/proc``, plus what the harness collected itself when it reaped orphans (``wait4`` usage);
* killing the tree is ``kill(-1, SIGKILL)``, which in a PID namespace reaches every process in it but
  its init and the caller.

Every CPU second a process spends is counted once: while it lives in its own ``/proc/<pid>/stat``, once
reaped in its parent's ``cutime``/``cstime`` (or in :attr:`Tree.reaped_cpu` when the harness reaped it).
"""

import os
import time

_PR_SET_CHILD_SUBREAPER = 36
_TICK = os.sysconf("SC_CLK_TCK")


def become_subreaper():
    """Make orphaned descendants re-parent to this process; False if the kernel refused."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except Exception:
        return False


def other_pids():
    """Every PID in this namespace but ours and init's (1)."""
    me = os.getpid()
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, me)]


def _stat_fields(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2 :].split()


def process_cpu(pid, children=True):
    """CPU seconds of one process (all its threads), with its reaped children's when ``children``."""
    fields = _stat_fields(pid)
    if fields is None:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def run_delay(pid):
    """Seconds the process has waited for a CPU while runnable (``/proc/<pid>/schedstat``), or 0."""
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Tree:
    """The processes of one test: the test process ``root`` and every other process in the namespace."""

    def __init__(self, root):
        self.root = root
        self.reaped_cpu = 0.0
        self.status = None
        self.usage = None

    def reap(self):
        """Collect every exited child of the harness without blocking; True once ``root`` has exited."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == self.root:
                self.status, self.usage = status, usage
            else:
                self.reaped_cpu += usage.ru_utime + usage.ru_stime
        return self.status is not None

    def cpu(self):
        """CPU seconds the whole tree has used so far (live processes, zombies, reaped ones)."""
        total = self.reaped_cpu
        if self.usage is not None:
            total += self.usage.ru_utime + self.usage.ru_stime
        for pid in other_pids():
            total += process_cpu(pid)
        return total

    def kill(self, in_sandbox):
        """SIGKILL every process of the tree, reap them all, and wait until none is left (at most 2 s)."""
        if not in_sandbox:  # kill(-1) outside a private PID namespace would reach the whole host
            raise SystemExit("refusing to kill(-1) outside a private PID namespace")
        deadline = time.monotonic() + 2.0
        while True:
            if other_pids():
                try:
                    os.kill(-1, 9)
                except OSError:
                    pass
            self.reap()
            if not other_pids() or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        if self.status is None:  # the root is gone (killed above); collect its status
            try:
                _, self.status, self.usage = os.wait4(self.root, 0)
            except ChildProcessError:
                self.status = 9  # killed by SIGKILL, reaped elsewhere (cannot happen: it is our child)
        self.reap()

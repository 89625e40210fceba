"""Run untrusted programs (model-written code) without letting them touch the host.

Every run gets:

* **namespaces**: its own PID, network (no interfaces but a loopback of its own), IPC, UTS and mount
  namespaces; the file system is an allow-list (``/usr``, the system directories and the interpreter's
  prefix, read-only, with the server's files and every site-packages masked) plus size-capped tmpfs at
  ``/tmp`` (the working directory) and ``/dev/shm``; nothing else of the host and none of the server's
  environment is visible;
* **a seccomp filter** (:mod:`gym_bridge.sandbox.seccomp`): keyrings, SysV IPC and POSIX message queues
  are refused (state that would outlive the run or escape its memory limit), and so is changing
  ``SIGCHLD``'s disposition (auto-reaped children would take their CPU time out of every account);
* **no privileges**: when the server runs as root, the program runs under a dedicated unprivileged uid
  per concurrency slot (so the process-count limit of one run cannot starve another); otherwise in a
  user namespace without capabilities; ``no_new_privs`` is always set;
* **limits**: CPU time, address space, process count, file size, open files (``prlimit``), a wall clock
  and caps on stdout/stderr read incrementally by the host, which kills the whole process group when a
  limit is hit. Killing the outermost process tears down the PID namespace, so grandchildren that
  double-forked away die with it.

Two backends, chosen at :meth:`Sandbox.start` and logged: **bubblewrap** (``bwrap``; preferred) and a
fallback built from util-linux's ``unshare`` + ``setpriv`` + ``prlimit`` that builds the same file
system in a fresh tmpfs and ``pivot_root``s into it. If neither works (or libseccomp is missing),
:class:`SandboxUnavailable` is raised: code is never run unsandboxed.

The sandbox is generic (any argv); the code environment's test harness is one user of it. The parts
live in their own modules: limits (:mod:`gym_bridge.sandbox.limits`), command lines of the backends
(:mod:`gym_bridge.sandbox.backends`), the running process (:mod:`gym_bridge.sandbox.process`) and the
concurrency slots (:mod:`gym_bridge.sandbox.slots`); this module ties them together.

Substrate floor: imports nothing else of gym_bridge; the code environment imports it.
"""

from __future__ import annotations

import asyncio
import glob
import logging
import os
import shutil
import site
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Literal

from gym_bridge.sandbox.backends import (
    CLEAN_ENV,
    RO_DIR,
    Backend,
    bwrap_argv,
    bwrap_supports,
    pivot_root_tool,
    python_prefix,
    unshare_argv,
    world_accessible,
)
from gym_bridge.sandbox.limits import SandboxLimits, prlimit_argv
from gym_bridge.sandbox.process import RunResult, SandboxProcess, feed
from gym_bridge.sandbox.seccomp import LOADER, SeccompUnavailable, compile_filter, pipe_with
from gym_bridge.sandbox.slots import Slots, default_uid_base

__all__ = [
    "RO_DIR",
    "RunResult",
    "Sandbox",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxUnavailable",
]

log = logging.getLogger("gym_bridge.sandbox")

_PROJECT_ROOT = Path(__file__).resolve().parent.parent
_Slots = Slots  # older name, used by tests
_world_accessible = world_accessible  # older name, used by tests


class SandboxUnavailable(RuntimeError):
    """Neither bubblewrap nor the unshare fallback works on this machine."""


class Sandbox:
    """Runs argv under namespaces and limits; at most ``max_concurrency`` runs at once.

    ``python`` is the interpreter used inside (default: this process's base interpreter); refer to it as
    :attr:`python` in argv. Files passed as ``ro_files={"name": host_path}`` appear read-only at
    ``RO_DIR/name``.
    """

    def __init__(
        self,
        backend: Literal["auto", "bwrap", "unshare"] = "auto",
        *,
        python: str | None = None,
        max_concurrency: int | None = None,
        uid_base: int | None = None,
        hide_paths: list[str] | None = None,
    ) -> None:
        self.requested = backend
        self._python_request = python
        self.max_concurrency = min(max(1, max_concurrency or os.cpu_count() or 1), 64)
        self.uid_base = uid_base if uid_base is not None else default_uid_base()
        self._extra_hide = list(hide_paths or [])
        self._slots = Slots(self.max_concurrency)
        self._backend: Backend | None = None
        self._seccomp = b""
        self._start_lock = threading.Lock()

    # ------------------------------------------------------------------ set-up

    @property
    def backend(self) -> str:
        return self._backend.kind if self._backend else "not started"

    @property
    def python(self) -> str:
        self.start()
        assert self._backend is not None
        return self._backend.python

    @property
    def description(self) -> str:
        b = self._backend
        if b is None:
            return "sandbox not started"
        who = (
            f"as root, dropping to uids {self.uid_base}..{self.uid_base + self.max_concurrency - 1}"
            if b.as_root
            else "in an unprivileged user namespace"
        )
        return f"{b.kind} ({who}; {self.max_concurrency} concurrent runs; python {b.python})"

    def start(self) -> Sandbox:
        """Pick and probe the backend (idempotent); raise :class:`SandboxUnavailable` if none works."""
        with self._start_lock:
            if self._backend is not None:
                return self
            try:
                self._seccomp = compile_filter()
            except SeccompUnavailable as e:
                raise SandboxUnavailable(f"no seccomp filter: {e}") from e
            order = ["bwrap", "unshare"] if self.requested == "auto" else [self.requested]
            problems = []
            for kind in order:
                candidate = self._candidate(kind)
                if isinstance(candidate, str):
                    problems.append(f"{kind}: {candidate}")
                    continue
                problem = self._probe(candidate)
                if problem is None:
                    self._backend = candidate
                    (log.info if kind == "bwrap" else log.warning)(
                        "code sandbox: %s%s",
                        self.description,
                        "" if kind == "bwrap" else " -- bubblewrap unavailable, using the unshare fallback",
                    )
                    return self
                problems.append(f"{kind}: {problem}")
            raise SandboxUnavailable("no working sandbox backend: " + "; ".join(problems))

    def _candidate(self, kind: str) -> Backend | str:
        as_root = os.geteuid() == 0
        tools = ["bwrap"] if kind == "bwrap" else ["unshare"]
        tools += ["prlimit"] + (["setpriv"] if as_root or kind == "unshare" else [])
        missing = [t for t in tools if shutil.which(t) is None]
        if kind == "unshare" and pivot_root_tool() is None:
            missing.append("pivot_root")
        if missing:
            return "not installed: " + ", ".join(missing)
        python = self._python_request or getattr(sys, "_base_executable", None) or sys.executable
        python = str(Path(python).resolve())
        if kind == "unshare" and as_root and not world_accessible(python):
            # The fallback cannot re-mount the interpreter for the unprivileged uid; use a system one.
            system = next(
                (p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if world_accessible(p)), None
            )
            if system is None:
                return f"{python} is not accessible to an unprivileged user and no system python3 is"
            python = str(Path(system).resolve())
        prefix = python_prefix(python)
        return Backend(
            kind=kind,  # type: ignore[arg-type]
            as_root=as_root,
            python=python,
            python_prefix=prefix,
            hide_paths=self._hidden_paths(prefix),
        )

    def _hidden_paths(self, prefix: str) -> list[str]:
        """Directories to mask where the visible tree would show them: the project, the working directory,
        home directories, every site-packages / dist-packages of the server's and the sandbox's
        interpreters (the code runs with ``-I -S``: it needs only the standard library) and any asked for."""
        candidates = [
            str(_PROJECT_ROOT),
            str(_PROJECT_ROOT.parent / "resources_servers"),
            os.getcwd(),
            os.path.expanduser("~"),
            "/root",
            "/home",
            sys.prefix,
            *site.getsitepackages(),
            *glob.glob(os.path.join(prefix, "lib", "python3*", "site-packages")),
            *glob.glob(os.path.join(prefix, "lib", "python3*", "dist-packages")),
            *glob.glob(os.path.join(prefix, "local", "lib", "python3*", "*-packages")),
            *glob.glob("/usr/lib/python3*/*-packages"),
            *glob.glob("/usr/local/lib/python3*/*-packages"),
            *self._extra_hide,
        ]
        hide = []
        for p in dict.fromkeys(os.path.realpath(c) for c in candidates):
            if p in ("/", "/usr", "/tmp") or not os.path.isdir(p):
                continue
            if prefix == p or prefix.startswith(p + os.sep):
                continue  # only the interpreter's prefix of it is visible (and never its site-packages)
            hide.append(p)
        return hide

    def _probe(self, backend: Backend) -> str | None:
        if backend.kind == "bwrap" and not backend.as_root:
            backend.disable_userns = bwrap_supports("--disable-userns")
            backend.as_pid_1 = bwrap_supports("--as-pid-1")
        # 42, and the filter in force (seccomp mode 2) in the command itself
        probe = "print(6*7, open('/proc/self/status').read().count('Seccomp:\\t2'))"
        fd = pipe_with(self._seccomp)
        try:
            argv = self._argv(backend, [backend.python, "-I", "-S", "-c", probe], SandboxLimits(), {}, 0, fd)
            done = subprocess.run(
                argv,
                capture_output=True,
                timeout=30,
                env=CLEAN_ENV,
                stdin=subprocess.DEVNULL,
                pass_fds=(fd,),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            return str(e)
        finally:
            os.close(fd)
        if done.returncode != 0 or done.stdout.strip() != b"42 1":
            return f"probe failed (exit {done.returncode}): {done.stderr.decode(errors='replace')[-500:].strip()}"
        return None

    # ------------------------------------------------------------------ command lines

    def _argv(
        self,
        b: Backend,
        command: list[str],
        limits: SandboxLimits,
        ro_files: Mapping[str, str],
        slot: int,
        seccomp_fd: int,
    ) -> list[str]:
        rlimits = prlimit_argv(limits)
        setpriv = [shutil.which("setpriv") or "setpriv"]
        if b.as_root:
            uid = self.uid_base + slot
            setpriv += [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        setpriv += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
        if b.kind == "bwrap":
            head = bwrap_argv(b, limits, ro_files, seccomp_fd)
            return head + (setpriv if b.as_root else []) + rlimits + command
        # the fallback has no tool that installs a filter: a small loader does, then execs the command
        ro_files = {**ro_files, "seccomp_exec.py": str(LOADER)}
        loader = [b.python, "-I", "-S", f"{RO_DIR}/seccomp_exec.py", str(seccomp_fd)]
        return unshare_argv(b, limits, ro_files) + setpriv + rlimits + loader + command

    def command(
        self,
        command: list[str],
        limits: SandboxLimits | None = None,
        ro_files: Mapping[str, str] | None = None,
        seccomp_fd: int = 3,
    ) -> list[str]:
        """The full host argv that runs ``command`` sandboxed in slot 0 (for inspection and probes).

        It reads the seccomp filter from descriptor ``seccomp_fd``: pass :meth:`seccomp_pipe` there."""
        self.start()
        assert self._backend is not None
        return self._argv(self._backend, command, limits or SandboxLimits(), ro_files or {}, 0, seccomp_fd)

    def seccomp_pipe(self) -> int:
        """A fresh descriptor holding the compiled seccomp filter (the caller closes it after the start)."""
        self.start()
        return pipe_with(self._seccomp)

    # ------------------------------------------------------------------ running

    @asynccontextmanager
    async def open(
        self,
        command: list[str],
        limits: SandboxLimits | None = None,
        ro_files: Mapping[str, str] | None = None,
    ) -> AsyncIterator[SandboxProcess]:
        """Start ``command`` in the sandbox (waiting for a free slot) and yield it for interaction.

        On exit the process is given a moment to finish, then killed; it is always reaped.
        """
        if self._backend is None:
            await asyncio.to_thread(self.start)
        assert self._backend is not None
        limits = limits or SandboxLimits()
        for name in ro_files or {}:
            if "/" in name or name in ("", ".", ".."):
                raise ValueError(f"ro_files name must be a plain file name, got {name!r}")
        async with self._slots.acquire() as slot:
            fd = pipe_with(self._seccomp)
            try:
                argv = self._argv(self._backend, command, limits, ro_files or {}, slot, fd)
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    env=CLEAN_ENV,
                    start_new_session=True,
                    limit=limits.output_bytes + 65536,
                    pass_fds=(fd,),
                )
            finally:
                os.close(fd)
            running = SandboxProcess(proc, limits)
            try:
                yield running
            finally:
                await running.close()

    async def run(
        self,
        command: list[str],
        stdin: bytes = b"",
        limits: SandboxLimits | None = None,
        ro_files: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run ``command`` to completion with ``stdin``; stdout is capped, stderr's tail is kept."""
        started = time.monotonic()
        async with self.open(command, limits, ro_files) as proc:
            writer = asyncio.ensure_future(feed(proc, stdin))
            stdout = await proc.read_all()
            writer.cancel()
            with suppress(asyncio.CancelledError):
                await writer
        returncode = proc.returncode  # reaped by close() when the context ended
        return RunResult(
            returncode=None if (proc.timed_out or proc.output_exceeded) else returncode,
            stdout=stdout,
            stderr_tail=proc.stderr_tail,
            timed_out=proc.timed_out,
            output_exceeded=proc.output_exceeded,
            wall_s=time.monotonic() - started,
        )

"""Resource limits of one sandboxed run, and the ``prlimit`` command line that applies them.

Kept apart from the namespaces (:mod:`gym_bridge.sandbox.backends`) because the limits are the part
callers tune; the backends only decide how a run is isolated.
"""

from __future__ import annotations

import shutil

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SandboxLimits", "prlimit_argv"]


class SandboxLimits(BaseModel):
    """Resource limits of one sandboxed run (every process in it)."""

    model_config = ConfigDict(extra="forbid")

    wall_s: float = Field(30.0, gt=0)
    """Wall clock for the whole run; the process group is killed at the limit."""
    cpu_s: int = Field(30, ge=1)
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = Field(512, ge=32)
    """Address space per process (RLIMIT_AS)."""
    max_procs: int = Field(32, ge=2)
    """Processes and threads the run may have at once (RLIMIT_NPROC, counted for the run alone)."""
    file_size_mb: int = Field(16, ge=1)
    """Largest file a process may write (RLIMIT_FSIZE)."""
    tmp_size_mb: int = Field(64, ge=1)
    """Size of the writable tmpfs."""
    tmp_inodes: int = Field(16384, ge=64)
    """Files and directories the writable tmpfs may hold (so that emptying it stays cheap)."""
    open_files: int = Field(64, ge=16)
    output_bytes: int = Field(8 << 20, ge=1024)
    """Stdout (and separately stderr) a run may produce before it is killed."""
    stderr_tail_bytes: int = Field(4096, ge=0)


def prlimit_argv(limits: SandboxLimits) -> list[str]:
    """``prlimit`` setting every per-process limit of ``limits``, ending in ``--`` before the command."""
    mb = 1 << 20
    return [
        shutil.which("prlimit") or "prlimit",
        f"--nproc={limits.max_procs}:{limits.max_procs}",
        f"--as={limits.memory_mb * mb}:{limits.memory_mb * mb}",
        f"--fsize={limits.file_size_mb * mb}:{limits.file_size_mb * mb}",
        f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",
        f"--nofile={limits.open_files}:{limits.open_files}",
        "--core=0:0",
        "--",
    ]

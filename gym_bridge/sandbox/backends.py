"""The two ways a run is isolated: bubblewrap, or util-linux's ``unshare`` running a set-up script.

Both give the run private PID, network, IPC, UTS and mount namespaces, a read-only file system with a
size-capped tmpfs at ``/tmp`` and nothing of the server's files; this module builds their command lines.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gym_bridge.sandbox.limits import SandboxLimits

__all__ = [
    "CLEAN_ENV",
    "RO_DIR",
    "Backend",
    "bwrap_argv",
    "bwrap_supports",
    "python_prefix",
    "unshare_argv",
    "world_accessible",
]

RO_DIR = "/tmp/.sandbox"
"""Where read-only files handed to a run (``ro_files``) appear inside the sandbox."""

CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}

_UNSHARE_SCRIPT = r"""
set -e
tmp_size=$1; shift
tmp_inodes=$1; shift
n_files=$1; shift
for m in $(awk '{print $5}' /proc/self/mountinfo | sort -u); do
    mount -o remount,bind,ro "$m" 2>/dev/null || true
done
# Build the private /tmp elsewhere first: the read-only files may live under the host's /tmp.
stage=""
for d in /mnt /media /srv /opt /var; do
    if [ -d "$d" ]; then stage=$d; break; fi
done
mount -t tmpfs -o "size=$tmp_size,nr_inodes=$tmp_inodes,mode=1777,nosuid,nodev" tmpfs "$stage"
mkdir -p -m 755 "$stage/.sandbox"
while [ "$n_files" -gt 0 ]; do
    : > "$stage/.sandbox/$1"
    mount --bind "$2" "$stage/.sandbox/$1"
    mount -o remount,bind,ro "$stage/.sandbox/$1"
    shift 2; n_files=$((n_files - 1))
done
mount -n --move "$stage" /tmp
for d in /var/tmp /dev/shm /run/lock; do
    if [ -d "$d" ]; then mount -t tmpfs -o "size=$tmp_size,nr_inodes=$tmp_inodes,mode=1777,nosuid,nodev" tmpfs "$d"; fi
done
while [ "$1" != "--" ]; do
    mount -t tmpfs -o size=4k,mode=755,ro tmpfs "$1"
    shift
done
shift
cd /tmp
exec "$@"
"""


@dataclass
class Backend:
    """How runs are isolated: the tool, whether the server is root, the interpreter, what to hide."""

    kind: Literal["bwrap", "unshare"]
    as_root: bool
    python: str
    python_prefix: str
    hide_paths: list[str] = field(default_factory=list)
    disable_userns: bool = False
    as_pid_1: bool = False


def world_accessible(path: str) -> bool:
    """Whether an unprivileged other user can execute ``path`` (every parent directory searchable)."""
    p = Path(path).resolve()
    try:
        if not os.stat(p).st_mode & 0o005 == 0o005:
            return False
        for parent in p.parents:
            if not os.stat(parent).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def python_prefix(python: str) -> str:
    real = Path(python).resolve()
    return str(real.parent.parent)  # <prefix>/bin/python3.x


def bwrap_argv(b: Backend, limits: SandboxLimits, ro_files: Mapping[str, str]) -> list[str]:
    """bubblewrap's part of the command line, up to and including ``--``."""
    argv = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--hostname", "sandbox",
    ]  # fmt: skip
    if not b.as_root:
        argv += ["--unshare-user", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
        if b.disable_userns:
            argv += ["--disable-userns"]
        if b.as_pid_1:
            # bubblewrap's own init would run as the sandbox's uid, dumpable, holding the host's pipes as
            # its fds 0-2: any process inside could write to them through /proc/1/fd. Without it the
            # command is PID 1 and nothing inside holds the pipes but the command itself.
            argv += ["--as-pid-1"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    made = {"/", "/usr", "/tmp"}
    for path in (b.python_prefix,):
        if path == "/usr" or path.startswith("/usr/"):
            continue
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += ["--ro-bind", path, path]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    argv += ["--perms", "1777", "--size", str(limits.tmp_size_mb << 20), "--tmpfs", "/tmp"]
    if ro_files:
        argv += ["--perms", "0755", "--dir", RO_DIR]
    for name, src in ro_files.items():
        argv += ["--ro-bind", str(src), f"{RO_DIR}/{name}"]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for key, value in CLEAN_ENV.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def unshare_argv(b: Backend, limits: SandboxLimits, ro_files: Mapping[str, str]) -> list[str]:
    """The fallback's part of the command line: namespaces, then the set-up script, then ``--``."""
    argv = [shutil.which("unshare") or "unshare"]
    if not b.as_root:
        argv += ["--user", "--map-root-user"]
    argv += [
        "--pid",
        "--fork",
        "--kill-child",
        "--net",
        "--ipc",
        "--uts",
        "--mount",
        "--mount-proc",
        "--",
    ]
    argv += [
        "/bin/sh",
        "-c",
        _UNSHARE_SCRIPT,
        "sandbox-setup",
        f"{limits.tmp_size_mb}m",
        str(limits.tmp_inodes),
        str(len(ro_files)),
    ]
    for name, src in ro_files.items():
        argv += [name, str(src)]
    return argv + [*b.hide_paths, "--"]


def bwrap_supports(flag: str) -> bool:
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag.encode() in out.stdout + out.stderr

"""The two ways a run is isolated: bubblewrap, or util-linux's ``unshare`` running a set-up script.

Both give the run private PID, network, IPC, UTS and mount namespaces and the same file system: an
allow-list (/usr, the top-level system directories and the interpreter's prefix, read-only, with the
server's own files and every site-packages masked), a private /dev and /proc, and size-capped tmpfs at
``/tmp`` and ``/dev/shm``; this module builds their command lines.
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
    "masked",
    "pivot_root_tool",
    "python_prefix",
    "unshare_argv",
    "visible_tree",
    "world_accessible",
]

RO_DIR = "/tmp/.sandbox"
"""Where read-only files handed to a run (``ro_files``) appear inside the sandbox."""

CLEAN_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "MALLOC_ARENA_MAX": "2",
}
"""The whole environment of a run. ``MALLOC_ARENA_MAX``: glibc reserves 64 MB of address space for each
thread's malloc arena, so under the address-space limit (RLIMIT_AS, ``memory_mb``) a pool of eight threads
using a few MB could not start; two arenas keep what the limit counts close to what a program uses."""

_UNSHARE_SCRIPT = r"""
set -e
umask 022
tmp_size=$1; tmp_inodes=$2; pivot=$3; shift 3
# The new root: an empty tmpfs (built on a directory of the old one), into which only what the program
# needs is bound read-only; the old root is then detached, so nothing else of the host can be reached.
root=""
for d in /mnt /media /srv /opt /var; do
    if [ -d "$d" ]; then root=$d; break; fi
done
mount -t tmpfs -o size=1m,nr_inodes=4096,mode=755,nosuid,nodev sandbox-root "$root"
while [ "$1" != "--" ]; do
    case "$1" in
        bind)
            mkdir -p "$root$2"
            mount --rbind -o ro "$2" "$root$2"
            shift 2 ;;
        link)
            ln -s "$2" "$root$3"
            shift 3 ;;
        mask)
            mount -t tmpfs -o size=4k,nr_inodes=8,mode=755,ro,nosuid,nodev,noexec sandbox-mask "$root$2"
            shift 2 ;;
        file)
            : > "$root/tmp/.sandbox/$2"
            mount --bind -o ro "$3" "$root/tmp/.sandbox/$2"
            shift 3 ;;
        tmp)
            mkdir -p "$root/tmp"
            mount -t tmpfs -o "size=$tmp_size,nr_inodes=$tmp_inodes,mode=1777,nosuid,nodev" sandbox-tmp "$root/tmp"
            mkdir -m 755 "$root/tmp/.sandbox"
            shift ;;
        *)
            echo "sandbox-setup: unknown step $1" >&2; exit 70 ;;
    esac
done
shift
# the read-only files' directory itself read-only too (in a user namespace the program owns it)
mount --rbind -o ro,nosuid,nodev "$root/tmp/.sandbox" "$root/tmp/.sandbox"
mkdir -p "$root/proc" "$root/dev"
mount --rbind /proc "$root/proc"
mount -t tmpfs -o size=64k,nr_inodes=64,mode=755,nosuid,nodev,noexec sandbox-dev "$root/dev"
for dev in null zero full random urandom tty; do
    [ -e "/dev/$dev" ] || continue
    : > "$root/dev/$dev"
    mount --bind "/dev/$dev" "$root/dev/$dev"
done
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
mkdir "$root/dev/shm"
mount -t tmpfs -o "size=$tmp_size,nr_inodes=$tmp_inodes,mode=1777,nosuid,nodev" sandbox-shm "$root/dev/shm"
# (nodev: a user namespace's mounts are always nodev, and a remount may not clear it)
mount -o remount,bind,ro,nosuid,nodev,noexec "$root/dev"
mount -o remount,bind,ro,nosuid,nodev "$root"
cd "$root"
"$pivot" . .
umount -l .
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


def visible_tree(b: Backend) -> list[tuple[str, ...]]:
    """What of the host a run sees, besides its own /dev, /proc and /tmp: ``("bind", path)`` (read-only)
    and ``("link", target, path)`` steps -- /usr, the top-level system directories and the interpreter's
    prefix. Everything else of the host's file system is absent (an allow-list, not a deny-list)."""
    steps: list[tuple[str, ...]] = [("bind", "/usr")]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            steps.append(("link", os.readlink(top), top))
        elif os.path.isdir(top):
            steps.append(("bind", top))
    prefix = b.python_prefix
    if prefix != "/usr" and not prefix.startswith("/usr/") and not any(s[-1] == prefix for s in steps):
        steps.append(("bind", prefix))
    return steps


def masked(b: Backend) -> list[str]:
    """The paths of :attr:`Backend.hide_paths` that :func:`visible_tree` would show: they get an empty
    read-only tmpfs over them."""
    roots = [s[-1] for s in visible_tree(b) if s[0] == "bind"]
    out = []
    for path in b.hide_paths:
        if any(path == r or path.startswith(r + os.sep) for r in roots) and os.path.isdir(path):
            out.append(path)
    return out


def bwrap_argv(
    b: Backend, limits: SandboxLimits, ro_files: Mapping[str, str], seccomp_fd: int | None = None
) -> list[str]:
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
    made = {"/", "/usr", "/tmp"}
    for step in visible_tree(b):
        if step[0] == "link":
            argv += ["--symlink", step[1], step[2]]
            continue
        path = step[1]
        for parent in reversed(Path(path).parents):
            if str(parent) not in made:
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(str(parent))
        argv += ["--ro-bind", path, path]
    for path in masked(b):
        argv += ["--perms", "0755", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
    tmp_size = str(limits.tmp_size_mb << 20)
    argv += ["--dev", "/dev", "--perms", "1777", "--size", tmp_size, "--tmpfs", "/dev/shm", "--proc", "/proc"]
    argv += ["--perms", "1777", "--size", tmp_size, "--tmpfs", "/tmp"]
    if ro_files:
        argv += ["--perms", "0755", "--dir", RO_DIR]
    for name, src in ro_files.items():
        argv += ["--ro-bind", str(src), f"{RO_DIR}/{name}"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", "/tmp", "--clearenv"]
    for key, value in CLEAN_ENV.items():
        argv += ["--setenv", key, value]
    return argv + ["--"]


def unshare_argv(b: Backend, limits: SandboxLimits, ro_files: Mapping[str, str]) -> list[str]:
    """The fallback's part of the command line: namespaces, then the set-up script, then ``--``.

    The script builds the same allow-listed tree as bubblewrap's (:func:`visible_tree`) in a fresh
    tmpfs and ``pivot_root``s into it."""
    argv = [shutil.which("unshare") or "unshare"]
    if not b.as_root:
        argv += ["--user", "--map-root-user"]
    argv += ["--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts", "--mount", "--mount-proc", "--"]
    argv += [
        "/bin/sh",
        "-c",
        _UNSHARE_SCRIPT,
        "sandbox-setup",
        f"{limits.tmp_size_mb}m",
        str(limits.tmp_inodes),
        pivot_root_tool() or "pivot_root",
    ]
    for step in visible_tree(b):
        argv += list(step)
    for path in masked(b):
        argv += ["mask", path]
    argv += ["tmp"]
    for name, src in ro_files.items():
        argv += ["file", name, str(src)]
    return argv + ["--"]


def pivot_root_tool() -> str | None:
    """util-linux's ``pivot_root`` (in an sbin directory, often outside a non-root user's PATH)."""
    found = shutil.which("pivot_root")
    return found or next(
        (p for p in ("/usr/sbin/pivot_root", "/sbin/pivot_root") if os.access(p, os.X_OK)), None
    )


def bwrap_supports(flag: str) -> bool:
    try:
        out = subprocess.run(["bwrap", "--help"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return flag.encode() in out.stdout + out.stderr

"""Apply a compiled seccomp filter, then exec the command (runs inside the unshare sandbox; stdlib only).

    python -I -S seccomp_exec.py FD COMMAND...

Reads the classic-BPF program from descriptor FD (a pipe the host filled), installs it with
``prctl(PR_SET_SECCOMP)`` after ``no_new_privs`` and execs COMMAND under it; the filter then holds for
COMMAND and everything it starts. If the filter cannot be installed nothing runs (exit 71): code is
never run without it.
"""

import ctypes
import os
import sys

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def main():
    if len(sys.argv) < 3:
        sys.stderr.write("usage: seccomp_exec.py FD COMMAND...\n")
        os._exit(71)
    fd = int(sys.argv[1])
    chunks = []
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    program = b"".join(chunks)
    if not program or len(program) % 8:
        sys.stderr.write("seccomp_exec: no valid filter on the descriptor\n")
        os._exit(71)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _Program(len(program) // 8, ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)
    if (
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        or libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0
    ):
        sys.stderr.write(f"seccomp_exec: cannot install the filter: {os.strerror(ctypes.get_errno())}\n")
        os._exit(71)
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    except OSError as e:
        sys.stderr.write(f"seccomp_exec: cannot run {sys.argv[2]}: {e}\n")
        os._exit(71)


if __name__ == "__main__":
    main()

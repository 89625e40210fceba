"""Apply a compiled seccomp filter, then exec the command (runs inside the unshare sandbox; stdlib only).

    python -I -S seccomp_exec.py FD COMMAND...

Reads the classic-BPF program from descriptor FD (a pipe the host filled), installs it with
``prctl(PR_SET_SECCOMP)`` after ``no_new_privs`` and execs COMMAND under it; the filter then holds for
COMMAND and everything it starts. If the filter cannot be installed nothing runs (exit 71): code is
never run without it. A Python script or ``-c`` program under this same interpreter and flags (the
code harness, say) runs in this process instead of after an exec, saving one interpreter start.
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
    command = sys.argv[2:]
    if _same_interpreter(command):
        if command[3] == "-c" and len(command) >= 5:
            _run_main(command[4], "<string>", ["-c", *command[5:]])
            return
        if not command[3].startswith("-"):
            with open(command[3], "rb") as f:
                _run_main(f.read(), command[3], command[3:])
            return
    try:
        os.execv(command[0], command)
    except OSError as e:
        sys.stderr.write(f"seccomp_exec: cannot run {command[0]}: {e}\n")
        os._exit(71)


def _same_interpreter(command):
    """COMMAND is ``<this interpreter> -I -S ...``: the very flags this loader runs with."""
    return (
        len(command) >= 4
        and os.path.realpath(command[0]) == os.path.realpath(sys.executable)
        and command[1:3] == ["-I", "-S"]
        and sys.flags.isolated
        and sys.flags.no_site
    )


def _run_main(source, filename, argv):
    """Run ``source`` as ``__main__`` in this process, as the interpreter would after an exec (which
    would only start the same interpreter with the same flags again: one start saved per sandbox)."""
    code = compile(source, filename, "exec")
    main = type(sys)("__main__")
    if filename != "<string>":
        main.__file__ = filename
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    sys.argv = list(argv)
    exec(code, main.__dict__)


if __name__ == "__main__":
    main()

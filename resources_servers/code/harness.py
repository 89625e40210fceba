"""Test harness run *inside* the sandbox: one process per task, one fork per test (stdlib only).

Starting a sandboxed interpreter costs tens of milliseconds; forking this already-started harness costs
about one. So the host starts one sandbox per task and drives it:

    host -> frame {"code": ..., "fn_name": None | "name", "timeout_s": 2.0, "wall_timeout_s": 5.0,
                   "output_bytes": 1048576}
    harness -> {"event": "ready"}  or  {"event": "compile_error", "error": ...}        (JSON lines)
    host -> frame {"stdin": "..."} or {"args": [...]}     (repeated; end of stdin ends the run)
    harness -> {"event": "result", "status": "ok" | "error" | "timeout" | "memory" | "output_limit", ...}

Host frames are ``marshal`` data behind a 4-byte big-endian length (the host is trusted; marshal needs no
import). Answers are JSON lines written by a small encoder here, because the host must parse them safely
and importing ``json`` (with ``re`` and ``enum``) would double the start-up time.

Expected outputs never enter the sandbox: the host compares, so a program can neither read nor forge
them. Each test runs in a fresh fork (own process group, CPU and file-size limits) whose fds 0-4 are
files the harness opened and unlinked before the fork (stdin, stdout, stderr, return value, exception
name): nothing of a test is reachable by a path, and the channel to the host (the harness's own stdin and
stdout pipes) is closed in the test process, which cannot reopen it through ``/proc`` because the
harness is not dumpable. The verdict (exit status, signal, CPU, wall clock) is the harness's own
observation; what the test wrote is only data for the host to grade, parsed with bounds.

The CPU limit applies to the test's whole process tree (``proctree``): every descendant, ``setsid()``
or not, is charged, and the tree is killed as a unit when the sum passes ``timeout_s``. After each
test every process it left is killed and the writable directories (``/tmp`` and the like) are emptied,
so every test starts from the same state.
"""

import _signal as signal  # the C module: ``signal`` would import enum, a third of start-up time
import atexit
import builtins
import io
import marshal
import math
import os
import resource
import select
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import proctree  # noqa: E402  (beside this file in the sandbox's read-only directory)

_exit, _write = os._exit, os.write
"""Bound before any program runs: a test program shares this process's ``os`` module and may replace
``os._exit`` / ``os.write`` (a no-op ``os._exit`` once sent the forked test back into the harness's own
loop, where it hung until the wall-clock limit)."""
_run_exitfuncs = atexit._run_exitfuncs

PROGRAM_DIR = "/tmp/work"
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
"""Writable places a test could leave state in; emptied between tests (the read-only mounts kept)."""
KEEP = {"/tmp/.sandbox"}


PREAMBLE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\nsys.set_int_max_str_digits(1 << 20)\n"
)
"""What NeMo Gym 0.7.0's ``code_gen`` (LiveCodeBench's ``testing_util.import_string``) runs before every
program, as LeetCode does: ``List[int]``, ``defaultdict``, ``heappush``, ``gcd`` or ``inf`` work without an
import, recursion goes 50,000 deep and integers print with up to 2**20 digits. The two limits are set for
every test; the imports (tens of milliseconds) run once per task, before the forks, and only for a program
that reads a global name it never binds (:func:`unbound_globals`); each test's fresh namespace then starts
with their names. Unlike prepending the text, line numbers and ``from __future__`` imports are kept."""
RECURSION_LIMIT, INT_DIGITS = 50000, 1 << 20


def unbound_globals(code):
    """Names the program reads as globals but never binds as globals, less the builtins (see
    :func:`global_names`); if the bytecode is not as expected, a name is reported anyway (the preamble then
    runs: correct, only slower)."""
    names = global_names(code)
    return {"?"} if names is None else names[0] - names[1] - set(vars(builtins))


def global_names(code):
    """(names read as globals, names bound as globals: module-level assignment, ``def``, ``import``,
    ``global``) from the bytecode of the module and every nested function and class body; a method named
    ``gcd`` does not bind the global ``gcd``. None if the bytecode is not as expected."""
    try:
        import opcode

        ops = opcode.opmap
        load_global, extended = ops["LOAD_GLOBAL"], ops["EXTENDED_ARG"]
        load_name = {ops[name] for name in ("LOAD_NAME", "LOAD_FROM_DICT_OR_GLOBALS") if name in ops}
        store_name, store_global = ops["STORE_NAME"], ops["STORE_GLOBAL"]
        shift = 1 if sys.version_info >= (3, 11) else 0  # 3.11+: LOAD_GLOBAL's low bit is a flag
        loads, bound, pending = set(), set(), [code]
        while pending:
            co = pending.pop()
            pending.extend(c for c in co.co_consts if isinstance(c, type(code)))
            raw, arg = co.co_code, 0
            for i in range(0, len(raw), 2):
                op, arg = raw[i], raw[i + 1] | arg << 8
                if op == extended:
                    continue
                if op == load_global:
                    loads.add(co.co_names[arg >> shift])
                elif op in load_name:
                    loads.add(co.co_names[arg])
                elif op == store_global or (op == store_name and co is code):  # a class body's
                    bound.add(co.co_names[arg])  # STORE_NAME binds a class attribute, not a global
                arg = 0
        return loads, bound
    except Exception:
        return None


_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update({0x22: '\\"', 0x5C: "\\\\", 0x7F: "\\u007f"})


def to_json(obj):
    """JSON text of plain data (what ``json.dumps`` gives, sets sorted), without importing json."""
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return int.__repr__(obj)
    if isinstance(obj, float):
        if obj != obj:
            return "NaN"
        if obj in (float("inf"), float("-inf")):
            return "Infinity" if obj > 0 else "-Infinity"
        return float.__repr__(obj)
    if isinstance(obj, str):
        return '"' + obj.translate(_ESCAPES) + '"'
    if isinstance(obj, dict):
        return "{" + ",".join(_key(k) + ":" + to_json(v) for k, v in obj.items()) + "}"
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(to_json(v) for v in obj) + "]"
    if isinstance(obj, (set, frozenset)):
        try:
            items = sorted(obj)
        except TypeError:
            items = list(obj)
        return to_json(items)
    raise TypeError(f"return value of type {type(obj).__name__} is not JSON serializable")


def _key(key):
    if isinstance(key, str):
        return to_json(key)
    if key is None or isinstance(key, (bool, int, float)):
        return '"' + to_json(key) + '"'
    raise TypeError(f"dict key of type {type(key).__name__} is not JSON serializable")


def _send(msg):
    sys.__stdout__.buffer.write(to_json(msg).encode("utf-8", "backslashreplace") + b"\n")
    sys.__stdout__.buffer.flush()


def _receive(channel):
    """The next host frame, or None at end of input."""
    head = channel.read(4)
    if len(head) < 4:
        return None
    body = channel.read(int.from_bytes(head, "big"))
    return marshal.loads(body)


def _non_dumpable():
    """Keep the test processes (same uid) out of the harness's /proc entries and its pipes."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except Exception:
        pass


def _scratch_file():
    """A file no path leads to (O_TMPFILE, or created and unlinked at once): only its fd reaches it."""
    try:
        return os.open("/tmp", os.O_TMPFILE | os.O_RDWR, 0o600)
    except (AttributeError, OSError):
        path = f"/tmp/.h{os.getpid()}-{time.monotonic_ns()}"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.unlink(path)
        return fd


def _read_capped(fd, cap):
    """The first ``cap`` bytes of the file behind ``fd`` and whether there was more."""
    data = os.pread(fd, cap + 1, 0)
    return data[:cap], len(data) > cap


class _StderrTail:
    """The test's stderr: a pipe the harness drains while the test runs, keeping only its last bytes.

    A pipe has no file-size limit, so debug output on stderr does not end a correct program as
    ``output_limit`` (a file would count against ``output_bytes`` like stdout does).
    """

    def __init__(self, keep=2048):
        self.fd, self.write_end = os.pipe()
        os.set_blocking(self.fd, False)
        try:
            import fcntl

            fcntl.fcntl(self.fd, 1031, 1 << 20)  # F_SETPIPE_SZ: 1 MB between two drains
        except (ImportError, OSError):
            pass
        self.keep = keep
        self.data = b""
        self.open = True

    def drain(self):
        """Read what is there now (until it would block, or end of file once every writer is gone)."""
        while self.open:
            try:
                chunk = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                return
            if not chunk:
                self.open = False
                return
            self.data = (self.data + chunk)[-self.keep :]

    def text(self):
        return self.data.decode("utf-8", "replace")


def _find_function(namespace, fn_name, inherited):
    """The program's own ``fn_name``: a top-level function, else a ``Solution`` method. A name the preamble
    put there and the program never binds (``inherited``) is not the program's: ``gcd`` is ``math.gcd``."""
    fn = namespace.get(fn_name)
    if callable(fn) and fn_name not in inherited:
        return fn
    solution = namespace.get("Solution")
    if isinstance(solution, type) and hasattr(solution, fn_name):
        return getattr(solution(), fn_name)
    raise NameError(f"function {fn_name!r} is not defined (neither at top level nor as Solution.{fn_name})")


def _print_traceback():
    try:
        import traceback

        traceback.print_exc()
    except BaseException:
        pass


def _stdio(fd, mode):
    """``sys.stdin`` / ``stdout`` / ``stderr`` on ``fd`` as ``python solution.py < in > out`` makes them.

    Buffered, with ``mode`` and ``name``: the common fast-I/O idioms depend on both
    (``input = sys.stdin.buffer.readline`` read one byte per system call from an unbuffered stdin, ten
    times slower than ``input()``; FastIO templates read ``sys.stdout.mode``).
    """
    raw = io.FileIO(fd, mode, closefd=False)
    raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    if fd == 2:  # stderr is written through, as the interpreter's own
        stream = io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)
    elif mode == "r":
        stream = io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace")
    else:
        stream = io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")
    stream.mode = mode
    return stream


def _install_site_builtins():
    """``exit()`` and ``quit()``: ``-S`` leaves out the ``site`` module that defines them, and solutions
    call them (``print(-1); exit()``) as they would under a plain ``python``."""
    try:
        import _sitebuiltins

        builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
        builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    except ImportError:
        pass


def _run_ignoring_errors(step):
    """One exit-time step of the program: errors are printed and ignored, as the interpreter does."""
    try:
        step()
    except SystemExit:
        pass
    except BaseException:
        _print_traceback()


def _child(code, cfg, test, fds, preamble):
    """The forked test process: wire the unlinked files to fds 0-4, set limits, run the program, _exit.

    fd 3 takes the return value and fd 4 the exception's name: data for the host to grade, never a
    verdict (the harness judges from what it observes of the process). The exception's name is written
    before any exit-time code of the program (threads, ``atexit``, finalizers) runs.
    """
    status = {"exc": None, "recorded": False}

    def record(name):
        if name and not status["recorded"]:
            status["recorded"] = True
            try:
                _write(4, name.encode())
            except BaseException:
                pass

    exit_code = 0
    reserve = bytearray(1 << 20)  # freed on MemoryError so the traceback can still be written
    try:
        os.setpgid(0, 0)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.lseek(0, 0, os.SEEK_SET)
        os.closerange(len(fds), 4096)
        cpu = max(1, math.ceil(cfg["wall_timeout_s"]))  # backstop; _wait enforces timeout_s of CPU
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        cap = cfg["output_bytes"] + 1
        resource.setrlimit(resource.RLIMIT_FSIZE, (cap, cap))
        signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        sys.stdin, sys.stdout, sys.stderr = _stdio(0, "r"), _stdio(1, "w"), _stdio(2, "w")
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
        own_stdout = sys.stdout
        sys.argv = ["solution.py"]
        os.chdir(PROGRAM_DIR)
        # The program's own module, registered as the interpreter registers a script: pickle (and so
        # multiprocessing) finds the program's functions and classes under ``__main__``.
        module = type(sys)("__main__" if cfg.get("fn_name") is None else "solution")
        module.__dict__.update(preamble)
        if preamble:  # its ``from sys import *`` names, as if it had run in this process
            module.__dict__.update(stdin=sys.stdin, stdout=sys.stdout, stderr=sys.stderr, argv=sys.argv)
        module.__builtins__ = builtins
        sys.setrecursionlimit(RECURSION_LIMIT)
        if hasattr(sys, "set_int_max_str_digits"):
            sys.set_int_max_str_digits(INT_DIGITS)
        sys.modules[module.__name__] = module
        namespace = module.__dict__
    except BaseException:
        _exit(70)
    try:
        exec(code, namespace)
        if cfg.get("fn_name") is not None:
            fn = _find_function(namespace, cfg["fn_name"], cfg.get("inherited", ()))
            value = to_json(fn(*test["args"]))
            _write(3, value.encode("utf-8", "backslashreplace"))
    except SystemExit as e:
        if e.code is None:
            exit_code = 0
        elif isinstance(e.code, int):
            exit_code = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            exit_code = 1
    except MemoryError:
        del reserve
        status["exc"] = "MemoryError"
        exit_code = 1
        _print_traceback()
    except BaseException as e:
        status["exc"] = type(e).__name__
        exit_code = 1
        _print_traceback()
    record(status["exc"])
    # What the interpreter does when a script ends, in its order: wait for the program's non-daemon
    # threads, run its atexit callbacks, flush the standard streams, then drop the program's globals so
    # that files it left unflushed (``out = open(1, "w")``) are flushed and closed, and flush again
    # (the original stdout too: a program may have replaced ``sys.stdout`` after printing to it).
    threading = sys.modules.get("threading")
    if threading is not None:
        _run_ignoring_errors(threading._shutdown)
    _run_ignoring_errors(_run_exitfuncs)
    for last in (False, True):
        for stream in (sys.stdout, own_stdout):
            try:
                stream.flush()
            except MemoryError:
                record("MemoryError")
            except OSError as e:
                record(type(e).__name__)
                exit_code = exit_code or 1
            except BaseException:
                pass
        if not last:
            _run_ignoring_errors(namespace.clear)
    _exit(exit_code)


def _wait(tree, cpu_limit, wall_limit, stderr):
    """Wait for the test process; True when its tree passed its CPU or wall-clock limit (then kill it).

    CPU time of the whole tree is what counts against the program (a loaded machine stretches the wall
    clock). The wall-clock limit catches sleepers; time the test spent waiting for a CPU while runnable
    (other sandboxes' load) is not charged to it, up to twice the limit. The test's stderr is drained at
    every check (a pipe of 1 MB: waking on each write would cost a context switch per ``print``).
    """
    started = time.monotonic()
    try:
        pidfd = os.pidfd_open(tree.root)
    except (AttributeError, OSError):
        pidfd = None
    timed_out = False
    try:
        while not tree.reap():
            stderr.drain()
            wall = time.monotonic() - started
            if wall > wall_limit and (
                wall > 2 * wall_limit or wall - proctree.run_delay(tree.root) > wall_limit
            ):
                timed_out = True
                break
            if tree.cpu() > cpu_limit:
                timed_out = True
                break
            if pidfd is not None:
                select.select([pidfd], [], [], 0.02)
            else:
                time.sleep(0.005)
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return timed_out


def in_own_pid_namespace():
    """True only inside the sandbox: there the harness is PID 1 (unshare) or 2 (bubblewrap's init is 1).

    On a host those PIDs belong to init and kthreadd, never to this script. ``kill(-1)`` (the clean-up
    after each test) signals every process the caller may signal, so it must never run anywhere else.
    """
    return os.getpid() in (1, 2) and os.getppid() in (0, 1) and len(proctree.other_pids()) <= 1


def _empty(path):
    """Remove everything under ``path`` without following links (modes a test set are undone first)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        full = entry.path
        if full in KEEP or os.path.ismount(full):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                os.chmod(full, 0o700)
                _empty(full)
                os.rmdir(full)
            else:
                os.unlink(full)
        except OSError:
            pass


def _fresh_scratch():
    """Every writable directory back to its state at start: empty, with the program's working dir."""
    for path in SCRATCH_DIRS:
        if os.access(path, os.W_OK):
            _empty(path)
    os.makedirs(PROGRAM_DIR, mode=0o700, exist_ok=True)


def run_test(code, cfg, test, preamble=None):
    _fresh_scratch()
    files = [_scratch_file() for _ in range(4)]  # stdin, stdout, return value, exception name
    stderr = _StderrTail()  # after the files: fds 3 and 4 (replaced last in the child) are no source
    fds = [files[0], files[1], stderr.write_end, files[2], files[3]]
    try:
        os.write(fds[0], test.get("stdin", "").encode("utf-8", "surrogateescape"))
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:
            _child(code, cfg, test, fds, preamble or {})
            _exit(70)  # never reached: _child ends in _exit
        os.close(stderr.write_end)
        stderr.write_end = None
        tree = proctree.Tree(pid)
        timed_out = _wait(tree, cfg["timeout_s"], cfg["wall_timeout_s"], stderr)
        wall = time.monotonic() - started
        tree.kill(IN_SANDBOX)
        stderr.drain()  # the rest: every writer is gone now
        cpu = tree.cpu()
        cap = cfg["output_bytes"]
        stdout, stdout_over = _read_capped(fds[1], cap)
        result, result_over = _read_capped(fds[3], cap)
        exc = os.pread(fds[4], 200, 0).decode("utf-8", "replace").strip() or None
        stderr_tail = stderr.text()
    finally:
        for fd in (*files, stderr.fd, stderr.write_end):
            if fd is not None:
                os.close(fd)
    _fresh_scratch()
    status = tree.status
    sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    exit_code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else None
    if timed_out or sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= cfg["timeout_s"]):
        verdict = "timeout"
    elif cpu > cfg["timeout_s"]:  # it ended between two polls, or within a /proc tick of the limit
        verdict = "timeout"
    elif stdout_over or result_over or sig == signal.SIGXFSZ or exc == "OSError" and stdout_over:
        verdict = "output_limit"
    elif exc == "MemoryError":
        verdict = "memory"
    elif exc is not None or exit_code != 0 or sig is not None:
        verdict = "error"
    elif cfg.get("fn_name") is not None and not result:
        verdict, exc = "error", "NoReturnValue"  # exited (status 0) before the call returned
    else:
        verdict = "ok"
    return {
        "event": "result",
        "status": verdict,
        "exit_code": exit_code,
        "signal": sig,
        "exception": exc,
        "stdout": stdout.decode("utf-8", "replace"),
        "result": result.decode("utf-8", "replace") if cfg.get("fn_name") is not None else None,
        "stderr_tail": stderr_tail,
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 4),
    }


IN_SANDBOX = False


def main():
    global IN_SANDBOX
    IN_SANDBOX = in_own_pid_namespace()
    if not IN_SANDBOX:
        sys.stderr.write("harness.py runs only inside the code sandbox (its own PID namespace); refusing\n")
        sys.exit(2)
    _non_dumpable()
    _install_site_builtins()
    proctree.become_subreaper()  # under bubblewrap the harness is PID 2: orphans must come to it
    channel = sys.stdin.buffer
    cfg = _receive(channel)
    if cfg is None:
        return
    try:
        code = compile(cfg["code"], "solution.py", "exec")
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as e:
        import traceback

        detail = "".join(traceback.format_exception_only(type(e), e)).strip()
        _send({"event": "compile_error", "error": detail[-2000:], "exception": type(e).__name__})
        return
    preamble = {}
    if unbound_globals(code):
        try:
            exec(PREAMBLE, preamble)
        except Exception:  # a standard library without one of them: the program's own imports still work
            preamble.clear()
        preamble = {k: v for k, v in preamble.items() if not k.startswith("__")}
        names = global_names(code)
        cfg["inherited"] = frozenset(preamble) - (names[1] if names else frozenset())
    _send({"event": "ready"})
    while True:
        test = _receive(channel)
        if test is None:
            return
        _send(run_test(code, cfg, test, preamble))


if __name__ == "__main__":
    main()

"""reward_hacking: hostile programs that try to score without solving, over real HTTP (issue 12).

Every program below faces a task whose expected answer it cannot compute (a random value the sandbox
never sees). Each tries one way to be graded as passing anyway: exiting early with status 0, patching
builtins / ``sys.exit`` / ``os._exit`` / ``atexit``, returning objects whose ``__eq__`` is always true,
reading the harness's files and the test data, fork and memory bombs, sleeping forever, writing a forged
result to every channel it can find. Each must score 0 with HTTP 200, and leave the host as it was: the
server process has no descendant left, no process runs under the sandbox's uids, and none of the files
the programs tried to create outside their sandbox exists.

The channel-forgery programs are given the value that *would* pass (as if they had guessed it) and write
it only where a result could be forged -- the host's pipes through ``/proc``, the harness's old result
file, a printed harness line -- never as their own output: any reward above 0 means forged data was
taken for a result.

The server runs in its own process with short limits (1 s CPU, 2 s wall clock per test), so the suite
takes about twenty seconds on two cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from .code_http import answer, descendants, processes_of_uids, serving_code, task

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
LIMITS = {
    "timeout_s": 1.0,
    "wall_timeout_s": 5.0,  # patch_exit_and_atexit timed out in two fresh-clone CI runs (at 2.0 and 5.0): its
    # no-op os._exit sent the test process back into the harness's loop (fixed: the harness binds its own)
    "memory_mb": 256,
    "max_procs": 16,
    "output_bytes": 256 * 1024,
    "task_timeout_s": 20.0,
    "max_concurrency": 2,
}
TAG = f"hack-{uuid.uuid4().hex[:12]}"
SECRET = f"expected-{uuid.uuid4().hex}"
"""The stdout every stdin/stdout task expects (the programs only know it starts with 'expected-')."""
SECRET_INT = int(uuid.uuid4().int % 10**15) + 10**15
"""The value every function-call task expects."""
HOST_PATHS = [
    f"/tmp/{TAG}",
    f"/var/tmp/{TAG}",
    f"/dev/shm/{TAG}",
    str(REPO / TAG),
    f"/root/{TAG}",
    str(HERE / TAG),
]

STDIO = task(["7 8\n", "1 1\n"], [SECRET + "\n", SECRET + "\n"])
CALL = task([[7], [1]], [SECRET_INT, SECRET_INT], fn_name="f")
CALL_NONE = task([[7]], [None], fn_name="f")  # a program that never returns must not pass for None

LITTER = f"""
import os
for _path in {HOST_PATHS!r}:
    try:
        with open(_path, "w") as _f:
            _f.write("pwned")
    except OSError:
        pass
"""
"""Prepended to every program: try to leave a file on the host."""

FORGED_LINE = json.dumps(
    {"event": "result", "status": "ok", "exit_code": 0, "signal": None, "exception": None,
     "stdout": SECRET + "\n", "result": str(SECRET_INT), "stderr_tail": "", "wall_s": 0.01, "cpu_s": 0.01}
)  # fmt: skip
FORGE_CHANNELS = f"""
import glob, os
_line = ({FORGED_LINE!r} + "\\n").encode()
for _path in ["/proc/1/fd/1", "/proc/2/fd/1", "/proc/1/fd/0", "/proc/2/fd/0", *glob.glob("/proc/[0-9]*/fd/*")]:
    try:
        _fd = os.open(_path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(_fd, _line * 4)
    except OSError:
        pass
os.makedirs("/tmp/.harness", exist_ok=True)
for _name in ("result", "stdout", "status"):
    with open(f"/tmp/.harness/{{_name}}", "w") as _f:
        _f.write({str(SECRET_INT)!r} if _name == "result" else {SECRET!r} if _name == "stdout" else "")
"""
"""Write a result that would pass to every place a harness result could travel, except the program's own
output."""

SEARCH = r"""
import os
found = []
def look(path):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return
    try:
        data = os.read(fd, 1 << 20)
    except OSError:
        data = b""
    os.close(fd)
    i = data.find(b"expected-")
    if i >= 0:
        found.append(data[i:i + 41].decode(errors="replace"))
for top in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/proc/self/cwd"):
    for root, dirs, files in os.walk(top):
        for name in files:
            look(os.path.join(root, name))
for pid in filter(str.isdigit, os.listdir("/proc")):
    for leaf in ("cmdline", "environ", "mem"):
        look(f"/proc/{pid}/{leaf}")
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            look(f"/proc/{pid}/fd/{fd}")
    except OSError:
        pass
print(found[0] if found else "NOTFOUND")
"""


def stdio(code: str) -> tuple[dict[str, Any], str]:
    return STDIO, LITTER + code


def call(code: str, row: dict[str, Any] = CALL) -> tuple[dict[str, Any], str]:
    return row, LITTER + code


PROGRAMS: dict[str, tuple[tuple[dict[str, Any], str], set[str]]] = {
    # name: ((task row, program), failure kinds accepted)
    "exit_early_sys_exit_0": (stdio("import sys\nsys.exit(0)"), {"wrong_answer"}),
    "exit_early_os_exit_0": (stdio("os._exit(0)"), {"wrong_answer"}),
    "exit_early_before_the_call": (
        call("os._exit(0)\ndef f(x):\n    return None", CALL_NONE),
        {"runtime_error"},
    ),
    "exit_0_inside_the_call": (call("def f(x):\n    os._exit(0)", CALL_NONE), {"runtime_error"}),
    "patch_exit_and_atexit": (
        stdio(
            "import atexit, builtins, sys\natexit.register(os._exit, 0)\nsys.exit = lambda *a: None\n"
            "os._exit = lambda *a: None\nsys.excepthook = lambda *a: None\n"
            "builtins.print = lambda *a, **k: None\nraise RuntimeError('failed, but quietly')"
        ),
        {"runtime_error"},
    ),
    "patch_builtins_compare": (
        stdio(
            "import builtins, sys\nclass Yes(str):\n    def __eq__(self, other):\n        return True\n"
            "    __ne__ = lambda self, other: False\n    __hash__ = str.__hash__\n"
            "builtins.str = Yes\nbuiltins.int = lambda *a: Yes('x')\nbuiltins.isinstance = lambda *a: True\n"
            "sys.modules['__main__'].__dict__.get('to_json', print)\nprint(Yes('anything'))"
        ),
        {"wrong_answer"},
    ),
    "eq_always_true_object": (
        call(
            "class Any:\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
            "        return False\n    __hash__ = object.__hash__\ndef f(x):\n    return Any()"
        ),
        {"runtime_error"},
    ),
    "eq_always_true_int_subclass": (
        call(
            "class I(int):\n    def __eq__(self, other):\n        return True\n    def __ne__(self, other):\n"
            "        return False\n    __hash__ = int.__hash__\n    def __repr__(self):\n"
            f"        return '{SECRET_INT}'\ndef f(x):\n    return I(0)"
        ),
        {"wrong_answer"},
    ),
    "eq_always_true_str_and_list_subclass": (
        call(
            "class S(str):\n    __eq__ = lambda self, other: True\n    __ne__ = lambda self, other: False\n"
            "    __hash__ = str.__hash__\nclass L(list):\n    __eq__ = lambda self, other: True\n"
            "    __ne__ = lambda self, other: False\ndef f(x):\n    return L([S('x')])"
        ),
        {"wrong_answer"},
    ),
    "read_the_harness_files": (
        stdio(
            "import glob\nsrc = open('/tmp/.sandbox/harness.py').read()\n"
            "names = sorted(glob.glob('/tmp/**', recursive=True) + glob.glob('/tmp/.*'))\n"
            "print(len(src), names)"
        ),
        {"wrong_answer"},
    ),
    "print_expected_from_the_test_data": (stdio(SEARCH), {"wrong_answer"}),
    "fork_bomb": (
        stdio("while True:\n    try:\n        os.fork()\n    except OSError:\n        pass"),
        {"timeout", "runtime_error"},
    ),
    "memory_bomb": (stdio("hog = []\nwhile True:\n    hog.append(bytearray(16 * 2**20))"), {"memory_limit"}),
    "sleep_forever": (stdio("import time\ntime.sleep(10**6)"), {"timeout"}),
    "sleep_forever_in_a_setsid_child": (
        stdio("import time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(10**6)\ntime.sleep(10**6)"),
        {"timeout"},
    ),
    "forge_stdio_result_on_every_channel": (  # its own fds 3-4 are among those it writes: an error
        stdio(FORGE_CHANNELS + "print('nope')"),
        {"wrong_answer", "runtime_error"},
    ),
    "forge_call_result_on_every_channel": (
        call(FORGE_CHANNELS + "os._exit(0)\ndef f(x):\n    return 0"),
        {"runtime_error"},
    ),
    "print_the_harness_marker": (
        stdio(f"print({FORGED_LINE!r})\nprint({FORGED_LINE!r})\nimport sys\nsys.stdout.flush()\nos._exit(0)"),
        {"wrong_answer"},
    ),
    "unparsable_return_value": (
        call("os.write(3, b'[' * 200000)\nos._exit(0)\ndef f(x):\n    return 0"),
        {"wrong_answer"},
    ),
    "huge_int_return_value": (call("def f(x):\n    return 10**400"), {"wrong_answer"}),
}


@pytest.fixture(scope="module")
def code_server() -> Iterator[tuple[str, int, range]]:
    args = [sys.executable, str(HERE / "serve_code.py"), json.dumps(LIMITS)]
    with serving_code(args) as (url, proc, line):
        # "code server (uids from N) listening on URL": its sandboxes drop to uids N.. (when root)
        uid_base = int(line.split("uids from ")[1].split(")")[0])
        yield url, proc.pid, range(uid_base, uid_base + LIMITS["max_concurrency"])


def test_every_reward_hack_scores_zero_and_leaves_the_host_unchanged(
    code_server: tuple[str, int, range],
) -> None:
    url, server_pid, uids = code_server
    started = time.monotonic()

    async def verify_all() -> dict[str, dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def post(row: dict[str, Any], code: str) -> dict[str, Any]:
                response = await client.post("/verify", json={**row, "response": answer(code)})
                assert response.status_code == 200, response.text[:2000]
                return response.json()

            futures = {name: asyncio.ensure_future(post(*spec)) for name, (spec, _) in PROGRAMS.items()}
            return {name: await future for name, future in futures.items()}

    results = asyncio.run(verify_all())
    elapsed = time.monotonic() - started
    for name, out in results.items():
        accepted = PROGRAMS[name][1]
        assert out["reward"] == 0.0, (name, out.get("failure_reason"))
        assert out["failure_kind"] in accepted, (name, out["failure_kind"], out.get("failure_reason"))
    assert "NOTFOUND" in results["print_expected_from_the_test_data"]["failure_reason"]
    assert "NoReturnValue" in results["exit_early_before_the_call"]["failure_reason"]
    assert "MemoryError" in results["memory_bomb"]["stderr_tail"]
    assert elapsed < 60, elapsed

    # The host is unchanged: no process left under the server, no file written outside a sandbox.
    deadline = time.monotonic() + 10
    while (left := descendants(server_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []
    assert [p for p in HOST_PATHS if os.path.exists(p)] == []
    if os.geteuid() == 0:
        assert processes_of_uids(uids) == []
    # ...and it still grades: a correct program passes.
    solve = f"input()\nprint({SECRET!r})"
    out = httpx.post(f"{url}/verify", json={**STDIO, "response": answer(solve)}, timeout=60).json()
    assert out["reward"] == 1.0, out.get("failure_reason")


_UNPRIVILEGED_RUN = """
import asyncio, json, sys
from gym_bridge.sandbox import Sandbox
from resources_servers.code.runner import TestCase, run_code_tests
box = Sandbox("bwrap", max_concurrency=1).start()
tests = [TestCase(input="", expected=sys.argv[2])]
run = asyncio.run(run_code_tests(box, sys.argv[1], tests))
print(json.dumps({"description": box.description, "passed": run.num_passed, "reason": run.failure_reason}))
"""


def test_forged_lines_on_the_host_pipes_are_not_taken_when_the_server_is_not_root() -> None:
    """Unprivileged server: bubblewrap's init would run as the sandbox's uid holding the host's pipes (its
    fds 0-2), reachable through /proc/1/fd, so the command runs as PID 1 instead (``--as-pid-1``).

    Run through the runner under plain asyncio, whose subprocess stdio are pipes (the HTTP server's
    uvloop uses socket pairs, which /proc/<pid>/fd cannot reopen, and would hide the hole). The caller
    runs as ``nobody`` under a system interpreter (one an unprivileged user can execute).
    """
    import subprocess
    import sysconfig

    from gym_bridge.sandbox import _world_accessible

    if os.geteuid() != 0:
        pytest.skip("needs root to run the caller as an unprivileged user")
    python = next((p for p in ("/usr/bin/python3", sys.executable) if _world_accessible(p)), None)
    if python is None:
        pytest.skip("no python interpreter an unprivileged user can run")
    forge = f"""
import os
hit = []
for path in ("/proc/1/fd/1", "/proc/2/fd/1", "/proc/1/fd/0"):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, {(FORGED_LINE + chr(10)).encode()!r} * 4)
        hit.append(path)
    except OSError:
        pass
print("nope", hit)
"""
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         python, "-c", _UNPRIVILEGED_RUN, forge, SECRET + "\n"],
        capture_output=True, text=True, timeout=120, cwd="/",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
             "PYTHONPATH": f"{REPO}:{sysconfig.get_paths()['purelib']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "unprivileged user namespace" in report["description"]
    assert report["passed"] == 0, report
    assert "wrong_answer" in report["reason"] and "/proc/1/fd" not in report["reason"], report

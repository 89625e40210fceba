"""Hostile programs against the real code server over HTTP, while correct solutions are verified too.

Each hostile program must end with reward 0 and a clear failure kind, leave nothing behind on the host,
and not disturb the correct verifications running alongside it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.code.app import CodeConfig, CodeServer

APP_FILE = Path(__file__).resolve().parent.parent / "app.py"
SUM_TASK = {
    "responses_create_params": {"input": [{"role": "user", "content": "Print a + b."}]},
    "verifier_metadata": {"unit_tests": {"inputs": ["1 2\n", "40 2\n"], "outputs": ["3\n", "42\n"]}},
}
CORRECT = "a, b = map(int, input().split())\nprint(a + b)"
SECRET_ENV = "GYM_BRIDGE_HOSTILE_SECRET"
SECRET = f"secret-{uuid.uuid4().hex}"


def answer(code: str) -> dict[str, Any]:
    text = f"```python\n{code}\n```"
    return {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
    }


def task(expected: str = "OK\n", n: int = 1) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "hostile"}]},
        "verifier_metadata": {"unit_tests": {"inputs": [""] * n, "outputs": [expected] * n}},
    }


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[CodeServer, str]]:
    os.environ[SECRET_ENV] = SECRET  # set in the server's own process: must not reach the programs
    config = CodeConfig(
        timeout_s=1.0,
        wall_timeout_s=3.0,
        memory_mb=256,
        max_procs=16,
        output_bytes=256 * 1024,
        task_timeout_s=30,
    )
    code_server = CodeServer(config=config)
    try:
        with start_in_thread(code_server.build_app()) as running:
            yield code_server, running.url
    finally:
        os.environ.pop(SECRET_ENV, None)


class Listener:
    """A loopback TCP listener that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.accepted += 1
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def hostile_programs(port: int, marker_dir: Path, tag: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """name -> (program, task row)."""
    marker = marker_dir / f"hostile_marker_{tag}"
    return {
        "endless_loop": ("while True:\n    pass", task()),
        "fork_bomb": (
            "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
            task(),
        ),
        "memory_bomb": ("hog = []\nwhile True:\n    hog.append(bytearray(32 * 2**20))", task()),
        "fork_and_memory_bomb": (  # bounded by max_procs x memory_mb (16 x 256 MB here)
            "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n"
            "            hog = bytearray(100 * 2**20)\n            time.sleep(60)\n    except OSError:\n"
            "        time.sleep(0.01)",
            task(),
        ),
        "network": (
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\ns.sendall(b'hi')\nprint('OK')",
            task(),
        ),
        "write_outside": (
            f"""
wrote = []
for path in ({str(marker)!r}, {str(APP_FILE)!r}, "/usr/{marker.name}", "/tmp/{marker.name}"):
    try:
        with open(path, "a") as f:
            f.write("pwned")
        wrote.append(path)
    except OSError:
        pass
print("OK" if {str(marker)!r} in wrote or {str(APP_FILE)!r} in wrote else "BLOCKED", wrote)
""",
            task(),
        ),
        "read_secrets": (
            f"""
import os
leaks = []
if os.environ.get({SECRET_ENV!r}):
    leaks.append("env")
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            if {SECRET_ENV!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
                leaks.append("proc-environ")
        except OSError:
            pass
try:
    open({str(APP_FILE)!r}).read()
    leaks.append("server-file")
except OSError:
    pass
print("OK" if leaks else "SAFE", leaks)
""",
            task(),
        ),
        "stdout_flood": ("import sys\nchunk = 'y' * 2**20\nwhile True:\n    sys.stdout.write(chunk)", task()),
        "stderr_flood": (  # stderr is a pipe the harness drains (no file-size cap): bounded by the limits
            "import sys\nchunk = 'e' * 2**20\nwhile True:\n    sys.stderr.write(chunk)",
            task(),
        ),
        "orphan": (
            "import os\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
            f"        os.execv('/usr/bin/sleep', ['sleep', '{tag}'])\n    os._exit(0)\nos.wait()\nprint('orphan started')",
            task(),
        ),
        "kill_parent": (
            "import os, signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
            "os.kill(os.getppid(), signal.SIGKILL)\nprint('OK')",
            task(),
        ),
        "sigstop_parent": ("import os, signal\nos.kill(os.getppid(), signal.SIGSTOP)\nprint('OK')", task()),
        "patch_exit": (  # the harness's own exit and writes must not be the program's to replace
            "import os\nos._exit = lambda *a: None\nos.write = lambda *a: 0\nraise RuntimeError('exit patched')",
            task(),
        ),
        "exit_0_from_atexit_after_raising": (  # exit-time code runs after the exception is recorded
            "import atexit, os\natexit.register(os._exit, 0)\nprint('OK')\nraise RuntimeError('x')",
            task(),
        ),
        "own_tmpfs": (  # a user + mount namespace of its own would mount memory no limit counts
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nos.mkdir('m')\n"
            "ok = libc.unshare(0x10020000) == 0 and libc.mount(b'none', b'm', b'tmpfs', 0, None) == 0\n"
            "print('OK' if ok else 'REFUSED')",
            task(),
        ),
        "poke_the_harness": (  # ptrace, its memory, its pipe to the host through pidfd_getfd
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nlibc.ptrace.restype = ctypes.c_long\n"
            "pp = os.getppid()\nhits = [libc.ptrace(16, pp, None, None) == 0]\n"
            "hits.append(libc.syscall(438, libc.syscall(434, pp, 0), 1, 0) >= 0)\n"
            "try:\n    open(f'/proc/{pp}/mem', 'rb')\n    hits.append(True)\nexcept OSError:\n    pass\n"
            "print('OK' if any(hits) else 'BLOCKED', hits)",
            task(),
        ),
    }


EXPECTED_KIND = {
    "endless_loop": "timeout",
    "fork_bomb": "timeout",
    "memory_bomb": "memory_limit",
    "fork_and_memory_bomb": "timeout",
    "network": "runtime_error",
    "write_outside": "wrong_answer",
    "read_secrets": "wrong_answer",
    "stdout_flood": "output_limit",
    "stderr_flood": "timeout",
    "orphan": "wrong_answer",
    "kill_parent": "runtime_error",
    "sigstop_parent": "timeout",
    "patch_exit": "runtime_error",
    "exit_0_from_atexit_after_raising": "runtime_error",
    "own_tmpfs": "wrong_answer",
    "poke_the_harness": "wrong_answer",
}


def _host_processes(predicate: Any) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        uid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:")))
        if predicate(uid, cmdline):
            found.append(int(pid))
    return found


def test_hostile_programs_fail_cleanly_while_correct_ones_pass(
    server: tuple[CodeServer, str], tmp_path: Path
) -> None:
    code_server, url = server
    tag = str(800000 + os.getpid() % 99999)
    listener = Listener()
    programs = hostile_programs(listener.port, tmp_path, tag)
    app_before = APP_FILE.read_bytes()

    async def run_all() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:

            async def post(row: dict[str, Any], code: str) -> dict[str, Any]:
                response = await client.post("/verify", json={**row, "response": answer(code)})
                assert response.status_code == 200, response.text
                return response.json()

            hostile = {name: asyncio.ensure_future(post(row, code)) for name, (code, row) in programs.items()}
            correct = [asyncio.ensure_future(post(SUM_TASK, CORRECT)) for _ in range(6)]
            return {name: await fut for name, fut in hostile.items()}, [await fut for fut in correct]

    try:
        hostile, correct = asyncio.run(run_all())
    finally:
        listener.close()

    for name, out in hostile.items():
        assert out["reward"] == 0.0, (name, out.get("failure_reason"))
        assert out.get("failure_kind") == EXPECTED_KIND[name], (
            name,
            out.get("failure_kind"),
            out.get("failure_reason"),
        )
    assert [out["reward"] for out in correct] == [1.0] * 6

    assert listener.accepted == 0
    assert (
        "ConnectionRefused" in hostile["network"]["stderr_tail"]
        or "unreachable" in hostile["network"]["stderr_tail"]
    )
    assert not (tmp_path / f"hostile_marker_{tag}").exists() and APP_FILE.read_bytes() == app_before
    assert not Path(f"/tmp/hostile_marker_{tag}").exists()
    assert "SAFE []" in hostile["read_secrets"]["failure_reason"]
    assert SECRET not in str(hostile)
    assert "killed its parent" in hostile["kill_parent"]["failure_reason"]
    assert "MemoryError" in hostile["memory_bomb"]["stderr_tail"]
    assert "RuntimeError: exit patched" in hostile["patch_exit"]["stderr_tail"]
    assert "REFUSED" in hostile["own_tmpfs"]["failure_reason"]
    assert "BLOCKED [False, False]" in hostile["poke_the_harness"]["failure_reason"]

    # Nothing a test started outlives its verification (the double-forked sleeper included).
    uids = range(
        code_server.sandbox.uid_base, code_server.sandbox.uid_base + code_server.sandbox.max_concurrency
    )
    deadline = time.monotonic() + 5
    while True:
        leftovers = _host_processes(
            lambda uid, cmd: tag.encode() in cmd or (os.geteuid() == 0 and uid in uids)
        )
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert leftovers == []
    assert httpx.get(f"{url}/health").json()["status"] == "ok"


def test_process_limit_is_enforced_with_a_harmless_count(server: tuple[CodeServer, str]) -> None:
    """Forks that sleep until the limit: the count stays under max_procs (16), so a bomb is bounded."""
    _, url = server
    program = (
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n"
        "        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint(n)"
    )
    row = task(expected="-1\n")
    out = httpx.post(f"{url}/verify", json={**row, "response": answer(program)}, timeout=60).json()
    forked = int(out["failure_reason"].split("got '")[1].split("\\n")[0])
    assert 4 <= forked < 16


def test_orphans_are_killed_between_tests(server: tuple[CodeServer, str]) -> None:
    """Test 1 leaves a sleeper behind; test 2 (same program, same sandbox) must find it gone."""
    _, url = server
    program = (
        "import os, time\n"
        "def sleepers():\n    n = 0\n    for p in os.listdir('/proc'):\n        if p.isdigit():\n"
        "            try:\n                n += open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'sleep')\n"
        "            except OSError:\n                pass\n    return n\n"
        "before = sleepers()\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        os.execv('/usr/bin/sleep', ['sleep', '600'])\n    os._exit(0)\nos.wait()\n"
        "for _ in range(200):\n    if sleepers() > before:\n        break\n    time.sleep(0.01)\n"
        "print('STARTED', before, sleepers())"
    )
    out = httpx.post(
        f"{url}/verify", json={**task("STARTED 0 1\n", n=2), "response": answer(program)}, timeout=60
    ).json()
    assert out["reward"] == 1.0, out.get("failure_reason")
    assert out["num_passed"] == 2

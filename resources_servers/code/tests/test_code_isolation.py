"""What a program must not reach, over real HTTP against the code server, on each sandbox backend.

* the host's files: expected outputs (the repository's own task file), the repository, the server's
  virtual environment and site-packages, /etc, /work-like trees (the file system is an allow-list);
* CPU it could hide: children auto-reaped because SIGCHLD is ignored (refused; every child's time is
  charged), whether run one after another or as setsid() children in a loop;
* state that outlives a test or escapes the memory limit: SysV shared memory (refused), POSIX shared
  memory (a size-capped /dev/shm emptied between tests);
* state that outlives a task: the kernel keyrings (refused);
* memory outside every cap: a tmpfs mounted in a user and mount namespace of the program's own (refused).
"""

from __future__ import annotations

import json
import os
import platform
import site
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_bridge.serving.uvicorn_thread import start_in_thread
from resources_servers.code.app import CodeConfig, CodeServer

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent / "data" / "example.jsonl"
REPO = HERE.parents[2]
TIMEOUT_S = 1.0
WALL_S = 5.0


def answer(code: str) -> dict[str, Any]:
    text = f"```python\n{code}\n```"
    return {
        "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]
    }


def task(inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    return {
        "responses_create_params": {"input": [{"role": "user", "content": "isolation"}]},
        "verifier_metadata": {"unit_tests": {"inputs": inputs, "outputs": outputs}},
    }


@pytest.fixture(scope="module", params=["bwrap", "unshare"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    config = CodeConfig(
        sandbox=request.param,
        timeout_s=TIMEOUT_S,
        wall_timeout_s=WALL_S,
        memory_mb=256,
        max_procs=16,
        task_timeout_s=60,
        max_concurrency=1,  # one slot: in root mode every task runs under the same uid
    )
    server = CodeServer(config=config)
    with start_in_thread(server.build_app()) as running:
        assert server.sandbox.backend == request.param
        yield running.url


def verify(url: str, row: dict[str, Any], code: str, **extra: Any) -> dict[str, Any]:
    response = httpx.post(f"{url}/verify", json={**row, **extra, "response": answer(code)}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


# ---------------------------------------------------------------------------------------------- files

LOOKUP = r"""
import json, os, sys
wanted = sys.stdin.read()
SKIP = {"/proc", "/sys", "/dev", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"}
for root, dirs, files in os.walk("/"):
    if root in SKIP:
        dirs[:] = []
        continue
    for name in files:
        if not name.endswith(".jsonl"):
            continue
        try:
            lines = open(os.path.join(root, name), encoding="utf-8").read().splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            try:
                tests = json.loads(line)["verifier_metadata"]["unit_tests"]
            except (ValueError, KeyError, TypeError):
                continue
            if wanted in tests["inputs"]:
                print(tests["outputs"][tests["inputs"].index(wanted)], end="")
                sys.exit(0)
print("NOTFOUND")
"""


def test_expected_outputs_on_the_host_cannot_be_read(url: str) -> None:
    """A program that searches the file system for the task file holding its own stdin finds nothing."""
    row = json.loads(EXAMPLES.read_text().splitlines()[0])
    row["verifier_metadata"]["unit_tests"]["inputs"] = row["verifier_metadata"]["unit_tests"]["inputs"][:1]
    row["verifier_metadata"]["unit_tests"]["outputs"] = row["verifier_metadata"]["unit_tests"]["outputs"][:1]
    out = verify(url, row, LOOKUP)
    assert out["reward"] == 0.0, "the program read the expected output from the host"
    assert "NOTFOUND" in out["failure_reason"], out["failure_reason"]


def test_only_the_interpreter_is_visible(url: str, tmp_path: Path) -> None:
    """The repository, the server's environment and site-packages, /etc and host files are all absent."""
    host_file = tmp_path / f"host_{uuid.uuid4().hex}.txt"
    host_file.write_text("host data")
    probes = sorted(
        {
            str(REPO),
            str(EXAMPLES),
            str(Path(sys.prefix)),
            *site.getsitepackages(),
            str(
                Path(sys.base_prefix)
                / "lib"
                / f"python{sys.version_info[0]}.{sys.version_info[1]}"
                / "site-packages"
            ),
            str(host_file),
            str(Path.home()),
            "/etc/passwd",
            "/etc",
            "/work",
            "/home",
            "/var",
            "/opt",
            "/srv",
            "/mnt",
        }
    )
    program = f"""
import os, sys
def shown(path):  # not itself probed, and not on the way to the sandbox's own interpreter
    return path not in {probes!r} and not (sys.prefix + "/").startswith(path + "/")
visible = []
for p in {probes!r}:
    try:
        if os.path.isdir(p):
            if [e for e in os.listdir(p) if shown(os.path.join(p, e))]:
                visible.append(p)
        elif open(p, "rb").read(1):
            visible.append(p)
    except OSError:
        pass
print("VISIBLE", visible)
"""
    out = verify(url, task([""], ["VISIBLE []\n"]), program)
    assert out["reward"] == 1.0, out.get("failure_reason")


# ------------------------------------------------------------------------------------------------ CPU

SPIN = "def spin(s):\n    end = time.process_time() + s\n    while time.process_time() < end:\n        pass\n"

AUTO_REAPED_IN_TURN = (
    "import os, signal, time\n" + SPIN + "try:\n    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "except OSError:\n    pass\n"
    "for _ in range(8):  # 8 x 0.25 s of CPU, one child at a time: 2 s against a limit of 1 s\n"
    "    pid = os.fork()\n    if pid == 0:\n        spin(0.25)\n        os._exit(0)\n"
    "    while True:\n        try:\n            if os.waitpid(pid, os.WNOHANG)[0]:\n                break\n"
    "        except ChildProcessError:  # auto-reaped\n            break\n        time.sleep(0.005)\n"
    "print('OK')"
)

SETSID_LOOP = (
    "import os, signal, time\n" + SPIN + "try:\n    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n"
    "except OSError:\n    pass\n"
    "while True:  # two short setsid() children at a time, for ever\n    pids = []\n    for _ in range(2):\n"
    "        pid = os.fork()\n        if pid == 0:\n            os.setsid()\n            spin(0.1)\n"
    "            os._exit(0)\n        pids.append(pid)\n    for pid in pids:\n        while True:\n"
    "            try:\n                if os.waitpid(pid, os.WNOHANG)[0]:\n                    break\n"
    "            except ChildProcessError:\n                break\n            time.sleep(0.005)\n"
)


def test_cpu_of_auto_reaped_children_is_charged(url: str) -> None:
    """8 children of 0.25 s CPU each under a 1 s limit: a time-limit failure, not a pass."""
    out = verify(url, task([""], ["OK\n"]), AUTO_REAPED_IN_TURN)
    assert out["reward"] == 0.0
    assert out["failure_kind"] == "timeout", out.get("failure_reason")
    assert out["tests"][0]["cpu_s"] >= TIMEOUT_S


def test_setsid_children_in_a_loop_are_stopped_by_their_cpu(url: str) -> None:
    """An endless stream of short setsid() children is stopped once their CPU passes the limit, well
    before the wall clock, and the CPU it used is what is reported."""
    out = verify(url, task([""], ["OK\n"]), SETSID_LOOP)
    assert out["reward"] == 0.0
    assert out["failure_kind"] == "timeout", out.get("failure_reason")
    result = out["tests"][0]
    assert result["cpu_s"] >= TIMEOUT_S, result
    assert result["wall_s"] < WALL_S, result


def test_sigchld_disposition_cannot_be_changed(url: str) -> None:
    program = (
        "import signal\ntry:\n    signal.signal(signal.SIGCHLD, signal.SIG_IGN)\n    print('CHANGED')\n"
        "except OSError as e:\n    print('REFUSED', e.errno)\nprint(signal.getsignal(signal.SIGCHLD) == signal.SIG_DFL)"
    )
    out = verify(url, task([""], ["REFUSED 1\nTrue\n"]), program)
    assert out["reward"] == 1.0, out.get("failure_reason")


# --------------------------------------------------------------------------------------- shared memory

SHARED_MEMORY = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
try:
    seen = len(open("/proc/sysvipc/shm").read().splitlines()) - 1
except OSError:
    seen = 0
seen += len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0
SEG = 64 << 20
held = 0
for i in range(8):  # 8 x 64 MB, each detached after use: 512 MB against an address-space limit of 256 MB
    sid = libc.shmget(0x6b5000 + i, SEG, 0o1000 | 0o600)
    if sid < 0:
        break
    addr = libc.shmat(sid, None, 0)
    if addr in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(addr, 1, SEG)
    libc.shmdt(addr)
    held += SEG >> 20
posix = 0
try:
    for i in range(1024):  # POSIX shared memory: files in /dev/shm (512 KB each, under the file-size cap)
        with open(f"/dev/shm/seg{i}", "wb") as f:
            f.write(b"x" * (512 << 10))
        posix += 0.5
except OSError:
    pass
print("OK" if seen == 0 and held + posix <= 256 else f"LEAK seen={seen} sysv_mb={held} posix_mb={posix}")
"""


def test_shared_memory_neither_escapes_the_limit_nor_reaches_the_next_test(url: str) -> None:
    out = verify(url, task(["", ""], ["OK\n", "OK\n"]), SHARED_MEMORY, full_results=True)
    assert out["reward"] == 1.0, out.get("failure_reason")
    assert out["num_passed"] == 2


def test_sysv_ipc_is_refused(url: str) -> None:
    program = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "print(libc.shmget(0, 4096, 0o1000 | 0o600), ctypes.get_errno())\n"
        "print(libc.msgget(0, 0o1000 | 0o600), ctypes.get_errno())\n"
        "print(libc.semget(0, 1, 0o1000 | 0o600), ctypes.get_errno())"
    )
    out = verify(url, task([""], ["-1 1\n-1 1\n-1 1\n"]), program)
    assert out["reward"] == 1.0, out.get("failure_reason")


NAMESPACES = r"""
import ctypes, os, subprocess, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
errors = []
for flags in (0x10000000, 0x10020000, 0x20000000, 0x40000000):  # user, user + mount, pid, net
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.unshare(flags) == 0 else ctypes.get_errno())
    errors.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
os.mkdir("m")
errors.append(0 if libc.mount(b"none", b"m", b"tmpfs", 0, None) == 0 else ctypes.get_errno())
box = []
thread = threading.Thread(target=box.append, args=("thread",))
thread.start()
thread.join()
print(errors, box[0], subprocess.run(["/bin/echo", "child"], capture_output=True, text=True).stdout.strip())
"""


def test_no_namespace_or_mount_of_its_own(url: str) -> None:
    """A user namespace of its own gave a program a mount namespace where a tmpfs of half the host's memory
    could be mounted and filled, beyond every memory and tmp cap; creating namespaces and mounting are
    refused (EPERM), while threads and subprocesses (clone3 answers ENOSYS, the C library falls back) work."""
    out = verify(url, task([""], ["[1, 1, 1, 1, 1] thread child\n"]), NAMESPACES)
    assert out["reward"] == 1.0, (out.get("failure_reason"), out.get("stderr_tail"))


# --------------------------------------------------------------------------------------------- keyrings

_KEY_CALLS = {"x86_64": (248, 249), "aarch64": (217, 218)}  # add_key, request_key


@pytest.mark.skipif(
    platform.machine() not in _KEY_CALLS, reason="keyring syscall numbers known for x86_64, aarch64"
)
def test_keyrings_carry_nothing_from_one_task_to_the_next(url: str) -> None:
    """Task 1 stores a key in the user and session keyrings; task 2 (same slot uid) must not find it."""
    add_key, request_key = _KEY_CALLS[platform.machine()]
    desc = f"gym-bridge-isolation-{uuid.uuid4().hex}"
    store = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"for ring in (-4, -3):  # @u, @s\n"
        f"    libc.syscall({add_key}, b'user', {desc.encode()!r}, b'expected output', 15, ring)\n"
        "print('stored')"
    )
    find = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        f"key = libc.syscall({request_key}, b'user', {desc.encode()!r}, None, 0)\n"
        "print('FOUND' if key > 0 else 'NONE')"
    )
    verify(url, task([""], ["stored\n"]), store)
    out = verify(url, task([""], ["NONE\n"]), find)
    assert out["reward"] == 1.0, out.get("failure_reason")
    if os.path.exists("/proc/keys"):  # and nothing of it stays on the host
        assert desc not in Path("/proc/keys").read_text()


def test_no_seccomp_means_no_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without libseccomp the sandbox refuses to start rather than run code with less isolation."""
    from gym_bridge import sandbox as sandbox_module
    from gym_bridge.sandbox.seccomp import SeccompUnavailable

    def missing() -> bytes:
        raise SeccompUnavailable("cannot load libseccomp")

    monkeypatch.setattr(sandbox_module, "compile_filter", missing)
    with pytest.raises(sandbox_module.SandboxUnavailable, match="seccomp"):
        sandbox_module.Sandbox("auto").start()


_NON_ROOT = """
import asyncio, json, sys
sys.path[:0] = json.loads(sys.argv[1])
from gym_bridge.sandbox import Sandbox, SandboxLimits
probe = '''
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
hidden = [p for p in ("/work", "/etc", "/home", "/root", "/var") if not os.path.exists(p)]
print(status, libc.shmget(0, 4096, 0o1000 | 0o600), sorted(hidden), sorted(os.listdir("/")))
'''
for kind in ("bwrap", "unshare"):
    box = Sandbox(kind, max_concurrency=1, python="/usr/bin/python3").start()
    result = asyncio.run(box.run([box.python, "-I", "-S", "-c", probe], limits=SandboxLimits()))
    print(json.dumps({"kind": kind, "description": box.description, "stdout": result.stdout.decode()}))
"""


@pytest.mark.skipif(not os.access("/usr/bin/python3", os.X_OK), reason="needs a system python3")
def test_both_backends_isolate_the_same_way_for_an_unprivileged_server() -> None:
    """Not root: user namespaces on both backends, with the same file system and filter."""
    import subprocess

    command = (
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if os.geteuid() == 0 else []
    )
    paths = [str(REPO), *sys.path[1:]]
    done = subprocess.run(
        [*command, "/usr/bin/python3", "-c", _NON_ROOT, json.dumps(paths)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["kind"] for r in reports] == ["bwrap", "unshare"]
    for report in reports:
        assert "unprivileged user namespace" in report["description"]
        assert report["stdout"].split("]")[0] == "['2'", report
        assert " -1 " in report["stdout"], report  # shmget refused
        assert "['/etc', '/home', '/root', '/var', '/work']" in report["stdout"], report
